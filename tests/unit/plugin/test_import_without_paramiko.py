"""The plugin loads where paramiko is absent (the GPU kit carries none): only SSH needs it."""

import subprocess
import sys


def test_the_plugin_and_the_local_backend_import_without_paramiko() -> None:
    code = (
        "import sys; sys.modules['paramiko'] = None\n"
        "import pytest_specdecode.plugin, pytest_specdecode.run.session\n"
        "import pytest_specdecode.targets.local, pytest_specdecode.targets.lifecycle\n"
        "import pytest_specdecode.targets.systemd.watchdog\n"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
