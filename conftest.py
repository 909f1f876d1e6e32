"""Root conftest: the `pytester` fixture for the plugin's own integration tests."""

pytest_plugins = ["pytester"]
