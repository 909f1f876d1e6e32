"""The sections every renderer shows: acceptance, the host's windows, load levels, the
prediction, the search and the side changes."""
