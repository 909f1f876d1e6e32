"""One request as recorded.

- samples.py: `RequestSample`, one timed request; level_stats.py: a level's aggregates;
- request_metrics.py: vLLM's per-request metrics; token_capture.py: the captured token ids.
"""
