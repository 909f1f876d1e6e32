"""The standard experiment, shipped with the plugin: collected whenever a candidate is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..run.session import PLUGIN_NAME

MODULE = Path(__file__).with_name("tests.py")
NODE_ID = "specdecode"
ACROSS_REPLICAS = "test_crossover_does_not_regress"  # collected only for a target of replicas


def collect(session: pytest.Session) -> list[pytest.Item]:
    """The standard experiment's test items, under the node id `specdecode`."""
    module = pytest.Module.from_parent(session, path=MODULE, nodeid=NODE_ID)
    found = session.config.pluginmanager.get_plugin(PLUGIN_NAME)
    replicas = bool(found is not None and found.settings.replicas)
    return [
        item
        for item in session.genitems(module)
        if replicas or not item.name.startswith(ACROSS_REPLICAS)
    ]
