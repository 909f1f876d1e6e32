"""The noise a verdict must see through. Pure.

- restarts.py: each server start's effect, the restart noise an A/A run measures, the interval;
- time_drift.py: drift within a start (AR(1) over each start's residuals in time order);
- power.py: what a design can call with 80% power.
"""
