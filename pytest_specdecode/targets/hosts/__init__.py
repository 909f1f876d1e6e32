"""Hosts that run commands, behind one interface (as pytest-testinfra's backends).

- base.py: `Host`, `CommandResult`, quoting once, and this machine (`LocalHost`);
- ssh.py: a host over SSH (paramiko), verified host keys; tunnel.py: the API through it;
- container.py: commands inside a unit's container.
"""
