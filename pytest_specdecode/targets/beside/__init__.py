"""Two servers side by side. Pure.

- placement.py: where each runs (ports, cores, GPU shares);
- room.py: where a second copy fits on a running host, and on which port.
"""
