"""Where measurements are analysed: statistics, comparisons, checks. Pure functions.

run.py is the one entry (`analyze`); the rest stands in rooms by subject:

- search/: the search's next reload and its answer;
- prediction/: the n-gram prediction before any reload;
- map/: where speculation pays (the break-even map, the paying load, the dynamic-k table, the
  regime);
- replicas/: across replicas (the crossover, the alike check);
- verdict/: where a verdict is decided;
- variance/: the noise a verdict must see through;
- drafters/: a drafter with a model (the check before anything restarts, its health).
"""
