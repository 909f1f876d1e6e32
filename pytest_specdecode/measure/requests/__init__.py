"""A request and its timing.

- loadgen.py: the load generator; every request is timed in `timed_request`;
- sse_transport.py: its lean HTTP/1.1 transport for long SSE streams;
- token_ids.py: a request's token ids, untimed, for the n-gram replay.
"""
