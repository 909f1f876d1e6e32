"""The run: the steps of one pytest session's experiment.

- session.py: `SpecDecodeSession`, the one plugin object: the run, the end;
- planning.py: before anything is touched: the plan made on the target, the host and the
  service's other clients watched;
- host_noise.py: what the host's profile and stored runs know (the plan's noise), and what an
  A/A run adds to the profile;
- folder.py: the run's own folder, proved writable first, and the API's auth headers.
"""
