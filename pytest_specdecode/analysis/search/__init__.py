"""The search (`--spec-search`). Pure.

- policy.py: what to reload next, and why to stop;
- answer.py: the answer paragraph, the best config per level, the schedule.
"""
