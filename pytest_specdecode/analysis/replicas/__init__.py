"""Across replicas: the crossover (AB/BA) and whether the replicas compare at all. Pure.

- crossover.py: the change, the replica and period effects, with intervals and verdicts, from
  the crossover's slots (`crossover_of`), one crossover or several; the rotation for more
  replicas or arms;
- looks.py: the looks after each crossover (the interval's level where the run stops once
  decided) and what N crossovers can call (the plan's `reach`, `crossovers_needed`);
- guard.py: the ranks' guard (a signed-rank test over matched slots);
- model.py: the within-slot linear model, each estimate's starts' part, and the restart noise
  repeated crossovers measure;
- alike.py: whether replicas are alike enough to compare across (`alike`), before anything is
  touched.
"""
