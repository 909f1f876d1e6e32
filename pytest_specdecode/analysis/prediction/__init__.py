"""The n-gram prediction from a baseline's token ids, before any reload. Pure.

- predict.py: `predict_run`, the prediction of a run; inputs.py: what it reads from the record;
- ngram_replay.py, ngram_types.py: vLLM's n-gram proposer replayed offline;
- step_check.py: the replay checked step by step against the server's per-request arrays;
- cost_model.py: what a speculative step costs; bounded.py: which predictions bound, and the
  reload recommended from them; check.py: predicted against measured;
- level_acceptance.py, level_prediction.py: acceptance and the prediction per load level;
- coverage.py: how often the predicted band held over stored runs.
"""
