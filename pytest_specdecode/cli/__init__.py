"""Console scripts: each a thin main() over the package."""
