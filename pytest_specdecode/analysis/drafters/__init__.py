"""A drafter with a model: whether it fits the target, and whether it works. Pure.

- check.py: the drafter check, its config.json against the target's, before anything restarts
  (`check_drafter`, `describe_drafter`);
- health.py: a drafter's acceptance over a start's first requests, before its timed windows
  (`drafter_health`).
"""
