"""The experiment: the design's server starts, measured in order on demand.

- arms.py: `Experiment`, each arm's starts and phases;
- order.py: the interleaved order of rounds and slots (pure).
"""
