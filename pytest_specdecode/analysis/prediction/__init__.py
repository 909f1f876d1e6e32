"""The n-gram prediction from a baseline's token ids, before any reload. Pure.

- predict.py: `predict_run`, the prediction of a run; inputs.py: what it reads from the record;
- ngram_replay.py, ngram_types.py: vLLM's n-gram proposer replayed offline;
- step_check.py: the replay checked step by step against the server's per-request arrays;
- cost_model.py: what a speculative step costs; check.py: predicted against measured;
- level_acceptance.py, level_prediction.py: acceptance and the prediction per load level;
- bands/: whether a predicted band bounds, and the reload recommended from those that do
  (bounded.py); how often the band held over stored runs (coverage.py).
"""
