"""Where speculation pays on this engine, and the regime it was measured in. Pure.

- break_even.py: the break-even map, what acceptance pays (the line per k, load and prompt type);
- paying_load.py: the paying load, where the speedup crosses 1.0 over the load levels;
- dynamic_k.py: the best k per load level, as vLLM's per-batch-size table;
- regime.py: what serving N servers beside cost the baseline, and the next plan's N.
"""
