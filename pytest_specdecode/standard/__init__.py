"""The standard experiment, shipped with the plugin: collected whenever a candidate is given."""

from __future__ import annotations

from pathlib import Path

import pytest

MODULE = Path(__file__).with_name("tests.py")
NODE_ID = "specdecode"


def collect(session: pytest.Session) -> list[pytest.Item]:
    """The standard experiment's test items, under the node id `specdecode`."""
    module = pytest.Module.from_parent(session, path=MODULE, nodeid=NODE_ID)
    return list(session.genitems(module))
