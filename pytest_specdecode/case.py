"""`SpecDecodeCase`: what a project's own test sees through the `specdecode` fixture.

One candidate, one prompt type, one load level: the baseline's and the candidate's requests,
each over all of the arm's server starts, and the run's verdict on them. The object has the same
shape whatever the design: one level or several, one start per arm or several. Plain data: it
knows nothing of pytest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from .analysis.verdict.compare import PromptTypeVerdict
from .config.load import LoadLevel
from .config.settings import PromptType
from .record.measurement import Measurement


@dataclass(frozen=True)
class SpecDecodeCase:
    """One cell of the experiment, for a test of the project's own (suites/test_*.py)."""

    candidate: str  # the candidate's name, as given to --spec-config
    prompt_type: PromptType
    level: LoadLevel
    baseline: Measurement  # the baseline's timed requests of this cell, over all its starts
    speculative: Measurement  # the candidate's, likewise
    _verdict: Callable[[], PromptTypeVerdict] = field(repr=False, compare=False)

    @property
    def where(self) -> str:
        """For messages: 'ngram on coding at c1'."""
        return f"{self.candidate} on {self.prompt_type.name} at {self.level.label}"

    @cached_property
    def verdict(self) -> PromptTypeVerdict:
        """The run's verdict on this cell, as test_speculation_does_not_regress asserts it
        (computed once every arm of the design is measured)."""
        return self._verdict()
