"""Where a verdict is decided: `stats.decide`, reached only through `compare.compare_arms`. Pure.

- interval.py: the interval of the change of one metric (a `Question`), by starts or by pairs;
- stats.py: the call for one metric (`decide`), the rank guard, the family;
- compare.py: the one path from two arms' measurements to verdicts;
- checks.py: acceptance counted twice, outputs, whether runs compare;
- noise.py: which starts and stored runs measure the restart noise and drift of a run;
- design.py: whether a design can reach a verdict, and what it can call (the plan);
- adaptive.py: when a start has sent enough requests;
- reuse.py: a stored run's baseline (--spec-baseline-from);
- side_changes.py, control.py: what a flag changed besides speculation, and its split.
"""
