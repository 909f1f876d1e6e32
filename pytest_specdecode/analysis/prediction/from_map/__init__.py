"""The prediction where a break-even map was measured. Pure.

- proposer.py: a real n-gram server's own cost per step beyond the map's (its proposer),
  measured, and added to a map's step: on this run's map, or on the served model's shape;
- read.py: each n-gram config read from the run's map, with that cost, in place of the cost
  model's fit.
"""
