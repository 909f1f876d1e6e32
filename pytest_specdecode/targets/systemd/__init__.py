"""The systemd backend: the production unit as the original, its candidates as drop-ins.

- target.py: `SystemdTarget`, the unit and its candidates; writes every host file (`write_file`);
- units.py: the unit as a Service (`SystemdUnit`), a candidate beside it (`BesideUnit`);
- inspection.py: what is read on the host and never changed;
- unitfile.py, unit_environment.py: ExecStart as systemd expands it, a candidate's drop-in;
- watchdog.py: the lock, restore.sh, its watchdog, the handover;
- beside.py: a candidate as a transient unit beside the running original;
- shape.py: a shape's servers (--spec-shape) as the unit's drop-ins, in its window.
"""
