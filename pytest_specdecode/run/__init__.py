"""The run: `SpecDecodeSession`, the one plugin object (session.py), and its folder (folder.py)."""
