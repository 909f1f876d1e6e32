"""Configuration: the experiment's TOML and the --speculative-config values."""
