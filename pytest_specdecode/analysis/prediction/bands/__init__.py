"""Whether a predicted band can be trusted. Pure.

- bounded.py: which bands bound (no wider than a factor of 2, within what the fit measured), and
  the reload recommended from those alone;
- coverage.py: how often the band held over stored runs, and the widening where it fell short.
"""
