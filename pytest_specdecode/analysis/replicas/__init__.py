"""Across replicas: the crossover (AB/BA) and whether the replicas compare at all. Pure.

- crossover.py: the change, the replica and period effects, with intervals and verdicts, from
  the crossover's slots (`crossover_of`); the rotation for more replicas or arms;
- alike.py: whether replicas are alike enough to compare across (`alike`), before anything is
  touched.
"""
