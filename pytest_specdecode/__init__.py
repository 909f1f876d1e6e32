"""pytest-specdecode: would speculative decoding make this vLLM deployment faster?"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .case import SpecDecodeCase

__all__ = ["SpecDecodeCase"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """`SpecDecodeCase`, the `specdecode` fixture's type, imported when first asked for."""
    if name == "SpecDecodeCase":
        from .case import SpecDecodeCase

        return SpecDecodeCase
    raise AttributeError(f"module 'pytest_specdecode' has no attribute {name!r}")
