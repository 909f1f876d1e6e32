"""Where measurements are analysed: statistics, comparisons, checks. Pure functions."""
