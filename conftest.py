"""Root conftest: the `pytester` fixture for the plugin's own integration tests.

pyproject.toml sets pytest-asyncio's options for those tests. A suite run from this checkout
where pytest-asyncio is not installed (the GPU kit's host) would warn about each as an unknown
option: there, they are declared, unused.
"""

import pytest

pytest_plugins = ["pytester"]

OWN_TESTS_ONLY = ("asyncio_mode", "asyncio_default_fixture_loop_scope")


def pytest_addoption(parser: pytest.Parser) -> None:
    try:
        import pytest_asyncio  # noqa: F401
    except ImportError:
        for name in OWN_TESTS_ONLY:
            parser.addini(name, "pytest-asyncio's, for this checkout's own tests (unused here)")
