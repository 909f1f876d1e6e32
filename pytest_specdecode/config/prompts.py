"""Prompt sets: the prompts of a prompt type, and which prompt each request sends.

A prompt type holds many prompts, from one of these sources (keys of a `[prompt_types.NAME]` table):

- `prompt = "..."`: one prompt;
- `prompts = ["...", ...]`: an inline list;
- `prompt_set = "coding"`: a set shipped with the plugin (`pytest_specdecode/prompts/*.jsonl`);
- `prompts_file = "path"` with `format`:
  - `"jsonl"` (the default): one `{"prompt": ...}` object a line, as vLLM bench's custom dataset;
  - `"sharegpt"`: a JSON array (or JSONL) of `{"conversations": [{"from": "human", "value":
    ...}, ...]}`; the first human turn is the prompt, or with `multi_turn = true` the whole
    conversation up to its last human turn;
  - `"spec-bench"`: Spec-Bench's `question.jsonl` (`question_id`, `category`, `turns`); each
    category becomes a prompt type `NAME.CATEGORY`, optionally only those in `categories`.

  `limit = N` keeps the first N prompts (of each category). A relative path is relative to the
  TOML file.

Every phase sends the prompts in the order of `request_plan`: request i sends prompt i mod n.

Nothing here touches the network; errors are ConfigError naming the file and the line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigError

PromptFormat = Literal["jsonl", "sharegpt", "spec-bench"]
FORMATS: tuple[str, ...] = ("jsonl", "sharegpt", "spec-bench")
SHIPPED_SETS: tuple[str, ...] = ("coding", "math", "structured", "explanatory", "long_context")

# The keys of a [prompt_types.NAME] table that say where its prompts come from.
SOURCE_KEYS = ("prompt", "prompts", "prompt_set", "prompts_file")
PROMPT_KEYS = frozenset({*SOURCE_KEYS, "format", "multi_turn", "categories", "limit"})

_USER_ROLES = {"human": "user", "user": "user"}
_ASSISTANT_ROLES = {"gpt": "assistant", "chatgpt": "assistant", "bard": "assistant"}
_ASSISTANT_ROLES |= {"assistant": "assistant", "model": "assistant"}
_ROLES = {**_USER_ROLES, **_ASSISTANT_ROLES, "system": "system"}


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text, and for a multi-turn chat the messages that lead up to it."""

    text: str  # the completions prompt; in chat, the (last) user turn
    messages: tuple[tuple[str, str], ...] = ()  # (role, content), ending with the user turn
    source: str = ""  # where it came from: "FILE:LINE", "inline #3", "shipped coding #0"

    def chat_messages(self) -> list[dict[str, str]]:
        """The `messages` of a chat request."""
        if not self.messages:
            return [{"role": "user", "content": self.text}]
        return [{"role": role, "content": content} for role, content in self.messages]

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"text": self.text, "source": self.source}
        if self.messages:
            data["messages"] = self.chat_messages()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Prompt:
        messages = tuple((m["role"], m["content"]) for m in data.get("messages", ()))
        return cls(text=data["text"], messages=messages, source=data.get("source", ""))


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class RequestPlan:
    """Which prompt (an index into the prompt type's prompts) each request of a phase sends.

    The plan depends only on the counts, so every phase sends the same prompts in the same order,
    and request i of a level pairs with request i of the same level in another phase.
    """

    n_prompts: int
    warmup: tuple[int, ...]
    levels: tuple[tuple[int, ...], ...]  # the measured requests of each load level, in order

    @property
    def measured(self) -> tuple[int, ...]:
        """All measured requests, level after level."""
        return tuple(i for level in self.levels for i in level)

    @property
    def repeats(self) -> bool:
        """Whether some prompt is sent more than once in a phase (warm-up included)."""
        sent = self.warmup + self.measured
        return len(set(sent)) < len(sent)

    @property
    def warmup_overlaps(self) -> bool:
        """Whether a warm-up request sends a prompt that is also measured."""
        return bool(set(self.warmup) & set(self.measured))

    def describe(self) -> str:
        """One line for the run log and the dry run."""
        n = self.n_prompts
        if self.repeats:
            note = f"prompts repeat: {len(self.measured)} measured requests over {n} prompts" + (
                "; warm-up reuses measured prompts" if self.warmup_overlaps else ""
            )
        else:
            note = "every request a different prompt"
        return f"{n} prompt{'s' if n != 1 else ''}, {len(self.warmup)} warm-up, {note}"


def request_plan(
    n_prompts: int,
    *,
    samples: int,
    warmup: int = 0,
    levels: int = 1,
    distinct_across_levels: bool = True,
) -> RequestPlan:
    """The prompt index of every request of one phase.

    Measured requests cycle through the prompts: request i sends prompt i mod n. With several load
    levels and `distinct_across_levels`, the cycle runs on from one level to the next, so no
    prompt is sent twice in a phase while the set is large enough (a repeat would be served from
    the prefix cache, and suffix decoding would predict its earlier answer); otherwise every
    level sends prompts 0, 1, ... again. Warm-up requests take the prompts after the last measured
    one: outside the measured set when there are enough prompts, else the least-used ones first.
    """
    for value, name, minimum in ((n_prompts, "n_prompts", 1), (samples, "samples", 0)):
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if warmup < 0 or levels < 1:
        raise ValueError(f"warmup must be >= 0 and levels >= 1, got {warmup} and {levels}")
    starts = [k * samples if distinct_across_levels else 0 for k in range(levels)]
    planned = tuple(tuple((start + i) % n_prompts for i in range(samples)) for start in starts)
    after = max(starts) + samples
    return RequestPlan(
        n_prompts=n_prompts,
        warmup=tuple((after + j) % n_prompts for j in range(warmup)),
        levels=planned,
    )


# --------------------------------------------------------------------------- the TOML table


def prompts_of_table(
    name: str, table: Mapping[str, Any], *, base: Path, where: str, section: str = "prompt_types"
) -> dict[str, tuple[Prompt, ...]]:
    """The prompt type(s) that one `[prompt_types.NAME]` table defines, with their prompts.

    One table is one prompt type, except a Spec-Bench file, whose categories each become a prompt
    type named `NAME.CATEGORY`. `base` is the folder relative paths are resolved against.
    """
    here = f"{where} [{section}.{name}]"  # as the user wrote it (workloads: the older name)
    given = [k for k in SOURCE_KEYS if k in table]
    if len(given) != 1:
        raise ConfigError(
            f"{here}: give exactly one of {', '.join(SOURCE_KEYS)}"
            + (f"; got {', '.join(given)}" if given else "")
        )
    (key,) = given
    fmt = table.get("format", "jsonl")
    if fmt not in FORMATS:
        raise ConfigError(f"{here}: format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    file_keys = [k for k in ("format", "multi_turn", "categories") if k in table]
    if key != "prompts_file" and file_keys:
        raise ConfigError(f"{here}: {', '.join(file_keys)} only go with prompts_file")
    multi_turn = table.get("multi_turn", False)
    if not isinstance(multi_turn, bool):
        raise ConfigError(f"{here}: multi_turn must be true or false, got {multi_turn!r}")
    if multi_turn and fmt != "sharegpt":
        raise ConfigError(
            f"{here}: multi_turn needs format = 'sharegpt' (a recorded conversation); a "
            "Spec-Bench question's later turns need the model's own earlier answers"
        )
    if "categories" in table and fmt != "spec-bench":
        raise ConfigError(f"{here}: categories only go with format = 'spec-bench'")
    limit = table.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"{here}: limit must be an integer >= 1, got {limit!r}")

    value = table[key]
    if key == "prompt":
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{here}: 'prompt' must be a non-empty string")
        found = {name: [Prompt(value, source=f"{here} prompt")]}
    elif key == "prompts":
        found = {name: _inline(value, here)}
    elif key == "prompt_set":
        found = {name: shipped_set(value, where=here)}
    else:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{here}: prompts_file must be a path")
        path = Path(value).expanduser()
        path = path if path.is_absolute() else base / path
        text = _read(path, here)
        if fmt == "spec-bench":
            wanted = _categories(table.get("categories"), here)
            by_category = parse_spec_bench(text, str(path), categories=wanted)
            found = {f"{name}.{c}": prompts for c, prompts in by_category.items()}
        elif fmt == "sharegpt":
            found = {name: parse_sharegpt(text, str(path), multi_turn=multi_turn)}
        else:
            found = {name: parse_jsonl(text, str(path))}
    return {k: tuple(v[:limit] if limit else v) for k, v in found.items()}


def _inline(value: Any, here: str) -> list[Prompt]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{here}: 'prompts' must be a non-empty list of strings")
    out = []
    for i, text in enumerate(value):
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"{here}: prompts[{i}] must be a non-empty string, got {text!r}")
        out.append(Prompt(text, source=f"{here} prompts[{i}]"))
    return out


def _categories(value: Any, here: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise ConfigError(f"{here}: categories must be a non-empty list of strings")
    return tuple(value)


def _read(path: Path, here: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{here}: prompts_file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{here}: cannot read prompts_file {path}: {exc}") from None


# --------------------------------------------------------------------------- formats


def shipped_set(name: str, *, where: str = "prompt_set") -> list[Prompt]:
    """A prompt set shipped with the plugin, by name."""
    if name not in SHIPPED_SETS:
        raise ConfigError(
            f"{where}: no shipped prompt set {name!r}; shipped: {', '.join(SHIPPED_SETS)}"
        )
    resource = resources.files("pytest_specdecode") / "prompts" / f"{name}.jsonl"
    prompts = parse_jsonl(resource.read_text(encoding="utf-8"), f"{name}.jsonl")
    return [Prompt(p.text, source=f"shipped {name} #{i}") for i, p in enumerate(prompts)]


def parse_jsonl(text: str, source: str) -> list[Prompt]:
    """`{"prompt": "..."}` a line (vLLM bench's custom dataset); other keys are ignored."""
    out = []
    for line_no, obj in _json_lines(text, source):
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            hint = ""
            if "conversations" in obj:
                hint = " (this looks like ShareGPT: set format = 'sharegpt')"
            elif "turns" in obj:
                hint = " (this looks like Spec-Bench: set format = 'spec-bench')"
            raise ConfigError(f"{source}:{line_no}: needs a non-empty string 'prompt'{hint}")
        out.append(Prompt(prompt, source=f"{source}:{line_no}"))
    return _non_empty(out, source)


def parse_sharegpt(text: str, source: str, *, multi_turn: bool = False) -> list[Prompt]:
    """ShareGPT conversations: a JSON array, or one conversation a line.

    The prompt is the first human turn; with `multi_turn`, the conversation up to and including
    its last human turn (earlier answers as recorded). Conversations without a human turn are
    skipped, as vLLM bench skips them; anything malformed is an error.
    """
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            entries = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{source}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno})"
            ) from None
        items: Iterator[tuple[str, Any]] = (
            (f"{source} entry {i}", e) for i, e in enumerate(entries)
        )
    else:
        items = ((f"{source}:{n}", e) for n, e in _json_lines(text, source))
    out = []
    for at, entry in items:
        messages = _conversation(entry, at)
        if not messages:
            continue
        if multi_turn:
            last_user = max(
                i for i, (role, text) in enumerate(messages) if role == "user" and text.strip()
            )
            kept = tuple(messages[: last_user + 1])
            out.append(Prompt(kept[-1][1], messages=kept if len(kept) > 1 else (), source=at))
        else:
            first = next(content for role, content in messages if role == "user")
            out.append(Prompt(first, source=at))
    return _non_empty(out, source)


def _conversation(entry: Any, at: str) -> list[tuple[str, str]]:
    """(role, content) turns from the first human turn on (system turns kept); [] if none."""
    if not isinstance(entry, Mapping) or not isinstance(entry.get("conversations"), list):
        raise ConfigError(f"{at}: a ShareGPT entry needs a list 'conversations'")
    turns: list[tuple[str, str]] = []
    for k, turn in enumerate(entry["conversations"]):
        if not isinstance(turn, Mapping):
            raise ConfigError(f"{at}: conversations[{k}] is not an object")
        speaker, value = turn.get("from", turn.get("role")), turn.get("value", turn.get("content"))
        role = _ROLES.get(str(speaker).lower()) if speaker is not None else None
        if role is None:
            raise ConfigError(
                f"{at}: conversations[{k}] has an unknown speaker {speaker!r}; "
                f"known: {', '.join(sorted(_ROLES))}"
            )
        if not isinstance(value, str):
            raise ConfigError(f"{at}: conversations[{k}] needs a string 'value'")
        turns.append((role, value))
    users = [i for i, (role, text) in enumerate(turns) if role == "user" and text.strip()]
    if not users:
        return []
    system = [t for t in turns[: users[0]] if t[0] == "system"]
    return system + turns[users[0] :]


def parse_spec_bench(
    text: str, source: str, *, categories: Sequence[str] | None = None
) -> dict[str, list[Prompt]]:
    """Spec-Bench's question.jsonl: prompts by category, in file order; the first turn only."""
    found: dict[str, list[Prompt]] = {}
    for line_no, obj in _json_lines(text, source):
        at = f"{source}:{line_no}"
        category, turns = obj.get("category"), obj.get("turns")
        if not isinstance(category, str) or not category:
            raise ConfigError(f"{at}: a Spec-Bench question needs a string 'category'")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ConfigError(f"{at}: a Spec-Bench question needs 'turns', a list of strings")
        if not turns[0].strip():
            raise ConfigError(f"{at}: the first turn is empty")
        qid = obj.get("question_id")
        label = f"{at} (question_id {qid})" if qid is not None else at
        found.setdefault(category, []).append(Prompt(turns[0], source=label))
    _non_empty([p for ps in found.values() for p in ps], source)
    if categories is None:
        return found
    missing = [c for c in categories if c not in found]
    if missing:
        raise ConfigError(
            f"{source}: no question in categor{'y' if len(missing) == 1 else 'ies'} "
            f"{', '.join(missing)}; the file has: {', '.join(found)}"
        )
    return {c: found[c] for c in categories}


def _json_lines(text: str, source: str) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(line number, object) for each non-blank line; an error names the file and the line."""
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{source}:{line_no}: not valid JSON ({exc.msg}, column {exc.colno})"
            ) from None
        if not isinstance(obj, Mapping):
            raise ConfigError(f"{source}:{line_no}: each line must be a JSON object")
        yield line_no, obj


def _non_empty(prompts: list[Prompt], source: str) -> list[Prompt]:
    if not prompts:
        raise ConfigError(f"{source}: holds no prompts")
    return prompts
