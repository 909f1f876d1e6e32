"""The plan and the lines of a run across replicas: `lines.py` over `crossovers.py` (how many
crossovers a decision needs)."""
