"""The n-gram replay checked step by step against the server's per-request arrays. Pure.

vLLM's `--per-request-spec-decode-metrics detailed` lists, for each request, the drafted and
accepted count of every verify step that carried a draft (record/requests/request_metrics.py); steps
that drafted nothing are in neither list. The replay (`ngram_replay.StepReplay`) makes the same
list from token ids. Walking both in order gives the first step where they part, and a class
for it and for every later step the server took:

- ``no draft``: the server drafted nothing where the replay drafted: its next drafted step is
  the replay's step one or more tokens later;
- ``fewer draft tokens``: it drafted fewer tokens than the replay, at the same place;
- ``outputs differ``: the request's output differs from the replayed one within the tokens that
  step covers, so everything from there on is another text's;
- ``other``: none of these (more tokens, or the same number with another outcome).

A server step in no class agrees with the replay (within the last step's bound).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .ngram_replay import StepReplay

Departure = Literal["no draft", "fewer draft tokens", "outputs differ", "other"]
CLASSES: tuple[Departure, ...] = ("no draft", "fewer draft tokens", "outputs differ", "other")
_SKIP = 8  # how many plain steps a skipped draft is looked for across


@dataclass(frozen=True)
class StepCheck:
    """One request: the server's verify steps against the replay's."""

    server_steps: int  # verify steps the server listed
    replay_steps: int  # steps the replay drafted on the same tokens
    agreed: int  # server steps that agree with the replay
    classes: dict[str, int] = field(default_factory=dict)  # server steps per departure class
    first: Departure | None = None  # the class of the first departure; None: all agree
    first_step: int | None = None  # its index among the server's steps
    first_token: int | None = None  # the output position the departing step started at
    detail: str = ""

    @property
    def agrees(self) -> bool:
        return self.first is None

    def to_json(self) -> dict[str, Any]:
        return {
            "server_steps": self.server_steps,
            "replay_steps": self.replay_steps,
            "agreed": self.agreed,
            "classes": dict(self.classes),
            "first": self.first,
            "first_step": self.first_step,
            "first_token": self.first_token,
            "detail": self.detail,
        }


def check_steps(
    server: Sequence[tuple[int, int]],
    replay: StepReplay,
    *,
    output_ids: Sequence[int] | None = None,
) -> StepCheck:
    """The server's (drafted, accepted) per verify step against the replay's, in order.

    `output_ids` are the request's own output ids; where they differ from the replayed ones,
    the steps from the first difference on are "outputs differ". Without them, the outputs are
    taken to be the replayed ones. Steps are counted once each: a server step that agrees, or
    departs in a class; a draft of the replay that the server left out counts as "no draft".
    """
    reference = replay.request.output_ids
    differ_at = _first_difference(reference, output_ids) if output_ids is not None else None
    walk = _Walk(server, replay)
    steps = replay.steps()
    if steps and steps[0].padded:  # the padded prefill after a prefix-cache hit
        if walk.more and steps[0].matches(*walk.next):
            walk.agree()
        else:
            walk.depart("other", 0, "the server did not draft the padded prefill's placeholders")
    position = 1
    while position < len(reference):
        step = replay.at(position)
        if not walk.more:
            missed, at = _drafts_from(replay, position)
            if missed and differ_at is not None and differ_at <= at + replay.at(at).accepted:
                why = f"the output ends or differs from token {differ_at}, before the replay's"
                walk.depart("outputs differ", at, why, steps=missed, consumed=False)
            elif missed:
                why = f"the server drafted nothing from token {at} on, where the replay did"
                walk.depart("no draft", at, why, steps=missed, consumed=False)
            break
        drafted, accepted = walk.next
        # the tokens this step's outcome rests on: its context, the accepted ones, the next
        span = position + max(step.accepted, accepted) + 1
        if differ_at is not None and differ_at < span:
            why = f"the output differs from the replayed one from token {differ_at}"
            walk.depart("outputs differ", position, why, steps=walk.left)
            break
        if not step.drafted:  # a plain step, as the replay has it
            position += 1
            continue
        if step.matches(drafted, accepted):
            walk.agree()
        elif skipped := _skipped(replay, position, walk.server[walk.i :]):
            why = (
                f"at token {position} the replay drafted {step.drafted} tokens and the server "
                f"none; its next draft is the replay's, {skipped} token(s) on"
            )
            missed = sum(replay.at(position + j).drafted > 0 for j in range(skipped))
            walk.depart("no draft", position, why, steps=missed, consumed=False)
            walk.agree()
            position += skipped
        elif 0 < drafted < step.drafted:
            why = f"at token {position} the server drafted {drafted}, the replay {step.drafted}"
            walk.depart("fewer draft tokens", position, why)
        else:
            why = (
                f"at token {position} the server drafted {drafted} and accepted {accepted}; the "
                f"replay drafted {step.drafted} and accepted {step.accepted}"
            )
            walk.depart("other", position, why)
        position += accepted + 1
    if walk.more:  # the server drafted where the replay had no tokens left
        kind: Departure = "outputs differ" if differ_at is not None else "other"
        walk.depart(kind, position, "the server drafted past the replay's last token", walk.left)
    return walk.result(sum(s.drafted > 0 for s in steps))


class _Walk:
    """The server's steps consumed in order, with the counts and the first departure."""

    def __init__(self, server: Sequence[tuple[int, int]], replay: StepReplay) -> None:
        self.server, self.i = server, 0
        self.counts: Counter[str] = Counter()
        self.first: tuple[Departure, int, int, str] | None = None

    @property
    def more(self) -> bool:
        return self.i < len(self.server)

    @property
    def left(self) -> int:
        return len(self.server) - self.i

    @property
    def next(self) -> tuple[int, int]:
        return self.server[self.i]

    def agree(self) -> None:
        self.counts["agree"] += 1
        self.i += 1

    def depart(
        self, kind: Departure, position: int, why: str, steps: int = 1, *, consumed: bool = True
    ) -> None:
        self.counts[kind] += steps
        if self.first is None:
            self.first = (kind, self.i, position, why)
        if consumed:
            self.i = min(len(self.server), self.i + max(steps, 1))

    def result(self, replay_steps: int) -> StepCheck:
        first = self.first
        return StepCheck(
            server_steps=len(self.server),
            replay_steps=replay_steps,
            agreed=self.counts["agree"],
            classes={k: self.counts[k] for k in CLASSES if self.counts[k]},
            first=first[0] if first else None,
            first_step=first[1] if first else None,
            first_token=first[2] if first else None,
            detail=first[3] if first else "every verify step agrees with the replay",
        )


def _drafts_from(replay: StepReplay, position: int) -> tuple[int, int]:
    """The replay's drafted steps from `position` to the end, and where the first starts."""
    count, first = 0, position
    while position < replay.output_len:
        step = replay.at(position)
        if step.drafted:
            first = first if count else position
            count += 1
        position += step.accepted + 1
    return count, first


def _skipped(replay: StepReplay, position: int, server: Sequence[tuple[int, int]]) -> int:
    """How many tokens on the replay's step is the server's next one; 0 when none near.

    The server's step after it must then be the replay's too (where there is one), so that a
    step that merely looks like a later one is not taken for a skipped draft.
    """
    (drafted, accepted), after = server[0], server[1] if len(server) > 1 else None
    for skip in range(1, _SKIP + 1):
        at = position + skip
        if at >= replay.output_len:
            break
        step = replay.at(at)
        if not (step.drafted and step.matches(drafted, accepted)):
            continue
        if after is None or _next_drafted(replay, at + accepted + 1, after):
            return skip
    return 0


def _next_drafted(replay: StepReplay, position: int, server: tuple[int, int]) -> bool:
    """Whether the replay's next drafted step from `position` is this server step."""
    while position < replay.output_len:
        step = replay.at(position)
        if step.drafted:
            return step.matches(*server)
        position += 1
    return False


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for j, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return j
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class LevelSteps:
    """The step check over one load level's requests: shares of requests and of steps."""

    requests: int
    agreeing: int  # requests whose every step agrees
    by_first: dict[str, int]  # requests per class of their first departure
    steps: int  # the server's verify steps
    agreed_steps: int
    by_class: dict[str, int]  # steps per class

    @classmethod
    def of(cls, checks: Iterable[StepCheck]) -> LevelSteps:
        found = list(checks)
        first: Counter[str] = Counter(c.first for c in found if c.first)
        steps: Counter[str] = Counter()
        for c in found:
            steps.update(c.classes)
        return cls(
            requests=len(found),
            agreeing=sum(c.agrees for c in found),
            by_first={k: first[k] for k in CLASSES if first[k]},
            steps=sum(c.server_steps for c in found),
            agreed_steps=sum(c.agreed for c in found),
            by_class={k: steps[k] for k in CLASSES if steps[k]},
        )

    @classmethod
    def merged(cls, parts: Sequence[LevelSteps]) -> LevelSteps:
        """Several levels' (or starts') checks taken together."""

        def total(name: str) -> dict[str, int]:
            found: Counter[str] = Counter()
            for part in parts:
                found.update(getattr(part, name))
            return {k: found[k] for k in CLASSES if found[k]}

        return cls(
            requests=sum(p.requests for p in parts),
            agreeing=sum(p.agreeing for p in parts),
            by_first=total("by_first"),
            steps=sum(p.steps for p in parts),
            agreed_steps=sum(p.agreed_steps for p in parts),
            by_class=total("by_class"),
        )

    def request_shares(self) -> dict[str, float]:
        n = self.requests or 1
        return {"agree": self.agreeing / n, **{k: v / n for k, v in self.by_first.items()}}

    def step_shares(self) -> dict[str, float]:
        n = sum(self.by_class.values()) + self.agreed_steps or 1
        return {"agree": self.agreed_steps / n, **{k: v / n for k, v in self.by_class.items()}}

    def text(self) -> str:
        if not self.requests:
            return "no request to check"
        parts = [f"{self.agreeing}/{self.requests} requests agree step by step"]
        if self.by_first:
            firsts = ", ".join(f"{k} {v}" for k, v in self.by_first.items())
            parts.append(f"first departures: {firsts}")
            steps = ", ".join(f"{k} {v}" for k, v in self.by_class.items())
            parts.append(f"steps apart: {steps} of {self.steps}")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "agreeing": self.agreeing,
            "by_first": self.by_first,
            "steps": self.steps,
            "agreed_steps": self.agreed_steps,
            "by_class": self.by_class,
            "request_shares": self.request_shares(),
            "step_shares": self.step_shares(),
            "text": self.text(),
        }
