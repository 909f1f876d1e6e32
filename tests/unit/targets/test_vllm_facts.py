"""The target's own vLLM decides what is valid: its version, methods and keys.

Fast tests check the logic on given facts; the `vllm` tests ask the embedded CPU vLLM 0.32.0
for real, through the interpreter of a server command, as the local backend does.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_specdecode.config.specconfig import (
    OFFLINE_FACTS,
    SpecConfig,
    VllmFacts,
    parse_spec_config,
    validate_spec_values,
)
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.targets.facts.cache import FINGERPRINT
from pytest_specdecode.targets.facts.vllm import (
    VllmFactsError,
    ask_vllm,
    facts_or_offline,
    interpreter_from_script,
    parse_facts,
    request_metrics_args,
    request_metrics_plan,
    validated_against_target,
    with_request_metrics,
)
from pytest_specdecode.targets.facts.vllm_snippet import MARKER, SNIPPET
from pytest_specdecode.targets.hosts.base import CommandResult
from pytest_specdecode.targets.local import LocalProcessTarget

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}


def host_facts(version: str, *, methods=None, keys=None, choices=None) -> VllmFacts:
    """Facts as a host's vLLM would report them: the 0.32 lists, changed where given."""
    return VllmFacts(
        version=version,
        methods=frozenset(methods if methods is not None else OFFLINE_FACTS.methods),
        keys=keys if keys is not None else dict(OFFLINE_FACTS.keys),
        choices=choices or {},
        host="root@gpu:22",
        interpreter="/opt/vllm/bin/python3",
    )


# ------------------------------------------------------------------------------ validation


def test_a_key_added_in_a_newer_vllm_is_accepted_by_that_vllm():
    spec = parse_spec_config('{"method":"ngram","num_speculative_tokens":3,"lookahead":2}', {})
    newer = host_facts("0.33.1", keys={**OFFLINE_FACTS.keys, "lookahead": "int"})
    assert validate_spec_values(spec.values, source=spec.name, facts=newer)["lookahead"] == 2
    with pytest.raises(ConfigError, match=r"lookahead must be an integer, got 'two'"):
        validate_spec_values({**spec.values, "lookahead": "two"}, source="x", facts=newer)


def test_a_removed_method_is_refused_with_the_hosts_version():
    older = host_facts("0.31.2", methods=OFFLINE_FACTS.methods - {"suffix"})
    spec = parse_spec_config('{"method":"suffix","num_speculative_tokens":3}', {})
    with pytest.raises(ConfigError) as err:
        validate_spec_values(spec.values, source=spec.name, facts=older)
    message = str(err.value)
    assert message.startswith(
        "speculative config 'suffix-k3' on root@gpu:22 (vLLM 0.31.2): unknown method 'suffix'; "
        "this vLLM knows: bailing_hybrid_mtp,"
    )
    assert "suffix," not in message.split("knows:")[1]


def test_a_removed_key_is_refused_with_the_hosts_version():
    keys = {k: v for k, v in OFFLINE_FACTS.keys.items() if k != "prompt_lookup_max"}
    with pytest.raises(ConfigError) as err:
        validate_spec_values(NGRAM, source="ngram", facts=host_facts("0.31.2", keys=keys))
    assert str(err.value).startswith(
        "speculative config 'ngram' on root@gpu:22 (vLLM 0.31.2): unknown key(s) "
        "'prompt_lookup_max'; this vLLM knows: "
    )


def test_a_closed_choice_of_the_hosts_vllm_is_enforced():
    facts = host_facts("0.32.0", choices={"rejection_sample_method": ("block", "standard")})
    values = {**NGRAM, "rejection_sample_method": "synthetic"}
    with pytest.raises(ConfigError, match=r"rejection_sample_method='synthetic' is not one of"):
        validate_spec_values(values, source="n", facts=facts)


def test_without_facts_the_offline_list_decides_and_says_so():
    assert validate_spec_values(NGRAM, source="ngram") == NGRAM
    with pytest.raises(ConfigError, match=r"'x' \(offline list of vLLM 0.32\): unknown key\(s\)"):
        validate_spec_values({**NGRAM, "lookahead": 2}, source="x")


def test_a_vllm_that_does_not_enumerate_methods_checks_keys_only():
    facts = replace(host_facts("0.9.0"), methods=None)
    assert validate_spec_values({**NGRAM, "method": "warp"}, source="w", facts=facts)


# ------------------------------------------------------------------------------ asking


@pytest.mark.parametrize(
    ("head", "argv"),
    [
        ("#!/opt/vllm/bin/python3\nimport sys\n", ["/opt/vllm/bin/python3"]),
        ("#!/opt/vllm/bin/python3.12 -E\n", ["/opt/vllm/bin/python3.12", "-E"]),
        ("#!/usr/bin/env python3\n", ["/usr/bin/env", "python3"]),
        (  # pip's form when the interpreter's path is too long for a #! line
            "#!/bin/sh\n'''exec' \"/very/long/venv/bin/python\" \"$0\" \"$@\"\n' '''\n",
            ["/very/long/venv/bin/python"],
        ),
    ],
)
def test_the_python_of_a_vllm_console_script(head, argv):
    assert interpreter_from_script("/opt/vllm/bin/vllm", head, where="unit v") == argv


@pytest.mark.parametrize(
    ("head", "message"),
    [("\x7fELF\x02\x01", "has no #! line"), ("#!/bin/bash\nexec foo\n", "not a Python")],
)
def test_scripts_whose_python_is_unknown_are_said_so(head, message):
    with pytest.raises(VllmFactsError, match=message):
        interpreter_from_script("/usr/bin/vllm", head, where="unit v")


def test_the_answer_is_the_marked_line_whatever_vllm_logs():
    answer = {"version": "0.33.1", "methods": ["ngram"], "keys": {"method": "str"}}
    out = f"INFO 11-30 vllm logs to stdout\n{MARKER}{json.dumps(answer)}\n"
    facts = parse_facts(out, host="root@gpu:22", interpreter="/opt/python")
    assert facts.version == "0.33.1" and facts.methods == {"ngram"}
    assert facts.describe() == "vLLM 0.33.1 on root@gpu:22 (/opt/python)"
    with pytest.raises(VllmFactsError, match="printed no answer: Traceback"):
        parse_facts("Traceback (most recent call last):\n", host="h", interpreter="p")
    error = f'{MARKER}{{"error": "ModuleNotFoundError: No module named \'vllm\'"}}'
    with pytest.raises(VllmFactsError, match="could not import vLLM's speculative config: Module"):
        parse_facts(error, host="h", interpreter="p")


def test_per_request_metrics_where_the_hosts_vllm_knows_the_option():
    answer = {
        "version": "0.32.0",
        "keys": {"method": "str"},
        "per_request_spec_decode_metrics": ["detailed", "none", "summary"],
    }
    facts = parse_facts(MARKER + json.dumps(answer), host="root@gpu:22", interpreter="/p")
    assert facts.per_request_metrics == ("detailed", "none", "summary")
    assert facts.record()["per_request_spec_decode_metrics"] == ["detailed", "none", "summary"]
    assert request_metrics_args(facts) == (("--per-request-spec-decode-metrics", "detailed"), None)
    both = [SpecConfig("ngram", NGRAM), SpecConfig("baseline-again", {})]
    specs = with_request_metrics(both, facts)
    assert specs[0].extra_args == ("--per-request-spec-decode-metrics", "detailed")
    assert specs[1].extra_args == ()  # the A/A candidate has no speculation: vLLM refuses it
    assert "each speculative candidate gets --per-request-spec-decode-metrics detailed" in (
        request_metrics_plan(facts)
    )


@pytest.mark.parametrize(
    ("levels", "offline", "says"),
    [
        (None, False, "vLLM 0.31.0 on root@gpu:22 (/opt/vllm/bin/python3) has no "
         "--per-request-spec-decode-metrics detailed: acceptance comes from the server's "
         "counters alone"),
        (("none", "summary"), False, "(it knows --per-request-spec-decode-metrics none|summary)"),
        (("none", "summary", "detailed"), True, "not asked for: the target's vLLM could not be "
         "asked whether it knows --per-request-spec-decode-metrics"),
    ],
)  # fmt: skip
def test_no_per_request_metrics_where_the_option_is_not_known(levels, offline, says):
    facts = replace(host_facts("0.31.0"), per_request_metrics=levels)
    if offline:
        facts = replace(OFFLINE_FACTS, per_request_metrics=levels)
    args, why = request_metrics_args(facts)
    assert args == () and why is not None and says in why
    assert with_request_metrics([SpecConfig("ngram", NGRAM)], facts)[0].extra_args == ()


def test_a_failed_look_at_the_option_is_said():
    answer = {"version": "0.32.0", "keys": {"method": "str"}, "per_request_note": "NameError: x"}
    facts = parse_facts(MARKER + json.dumps(answer), host="root@gpu:22", interpreter="/p")
    assert request_metrics_args(facts) == (
        (),
        "not asked for: whether vLLM 0.32.0 on root@gpu:22 (/p) knows "
        "--per-request-spec-decode-metrics could not be told (NameError: x)",
    )


def test_where_the_target_cannot_tell_the_offline_list_stands_in_with_the_reason():
    class Mute:
        def vllm_facts(self, progress=None):
            raise VllmFactsError("unit v on root@gpu:22: /opt/vllm/bin/vllm has no #! line")

    said: list[str] = []
    facts = facts_or_offline(Mute(), progress=said.append)
    assert facts.offline and facts.methods == OFFLINE_FACTS.methods
    assert facts.note == (
        "the target's vLLM could not be asked: unit v on root@gpu:22: /opt/vllm/bin/vllm has no "
        "#! line"
    )
    assert said == [f"{facts.note}; using {OFFLINE_FACTS.describe()}"]
    assert facts.record()["source"] == "offline"


def test_a_python_that_does_not_run_falls_back(tmp_path: Path):
    target = LocalProcessTarget(
        command=[str(tmp_path / "nope" / "python"), "-m", "vllm.entrypoints.openai.api_server"],
        api_base="http://127.0.0.1:1",
        model="m",
        workdir=tmp_path,
        env={},
        log_dir=tmp_path,
    )
    facts = validated_against_target(target, [SpecConfig("ngram", NGRAM)])
    assert facts.offline and "could not start" in (facts.note or "")


def test_the_snippet_goes_by_stdin_and_is_bounded():
    seen = {}

    class Host:
        name = "root@gpu:22"

        def run(self, argv, *, timeout=60.0, stdin=None, privileged=True):
            seen.update(argv=list(argv), timeout=timeout, stdin=stdin)
            answer = {"version": "0.32.0", "keys": {"method": "str"}}
            return CommandResult(self.name, tuple(argv), 0, MARKER + json.dumps(answer), "")

    ask_vllm(Host(), ["/opt/v/bin/python3", "-m", "vllm.entrypoints.openai.api_server"], where="u")
    assert seen == {"argv": ["/opt/v/bin/python3", "-"], "timeout": 180.0, "stdin": SNIPPET}


class _Installation:
    """A host whose vLLM answers the fingerprint and the snippet, counting the snippet's runs."""

    name = "root@gpu:22"

    def __init__(self) -> None:
        self.mtime, self.asked = 1, 0

    def run(self, argv, *, timeout=60.0, stdin=None, privileged=True):
        if stdin == FINGERPRINT:
            out = f"0.32.0\n/opt/v/lib/vllm/__init__.py\n{self.mtime}\n"
        else:
            self.asked += 1
            answer = {"version": "0.32.0", "keys": {"method": "str"}, "side_rules": {}}
            answer |= {"architectures": ["LlamaForCausalLM"], "moe_routing": []}
            out = MARKER + json.dumps(answer)
        return CommandResult(self.name, tuple(argv), 0, out, "")


def test_an_installation_is_asked_once_until_it_changes(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE_DIR", str(tmp_path))
    host, argv, said = _Installation(), ["/opt/v/bin/python3", "-m", "vllm"], []
    first = ask_vllm(host, argv, where="u", progress=said.append)
    again = ask_vllm(host, argv, where="u", progress=said.append)
    assert host.asked == 1 and first.remembered is None
    assert again.remembered and again.digest() == first.digest()
    assert "remembered from an earlier ask of this installation" in said[-1]
    host.mtime = 2  # reinstalled or upgraded: asked again
    assert ask_vllm(host, argv, where="u").remembered is None and host.asked == 2
    other = ask_vllm(host, ["/opt/w/bin/python3", "-m", "vllm"], where="u")  # another venv
    assert other.remembered is None and host.asked == 3
    monkeypatch.setenv("SPECDECODE_CACHE_DIR", "off")
    ask_vllm(host, argv, where="u")
    assert host.asked == 4


# ------------------------------------------------------------------------------ the real vLLM


def test_an_answer_kept_before_the_side_rules_were_read_is_asked_again(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE_DIR", str(tmp_path))
    host, argv = _Installation(), ["/opt/v/bin/python3", "-m", "vllm"]
    ask_vllm(host, argv, where="u")
    (kept,) = (tmp_path / "vllm-facts").iterdir()
    kept.write_text(MARKER + json.dumps({"version": "0.32.0", "keys": {"method": "str"}}))
    assert ask_vllm(host, argv, where="u").remembered is None and host.asked == 2
    assert ask_vllm(host, argv, where="u").remembered and host.asked == 2


def test_an_answer_kept_before_the_architectures_were_read_is_asked_again(
    tmp_path: Path, monkeypatch
) -> None:
    """The shape target needs the architectures and the MoE routing: an older answer lacks them."""
    monkeypatch.setenv("SPECDECODE_CACHE_DIR", str(tmp_path))
    host, argv = _Installation(), ["/opt/v/bin/python3", "-m", "vllm"]
    first = ask_vllm(host, argv, where="u")
    assert first.architectures == {"LlamaForCausalLM"} and first.moe_routing == ()
    (kept,) = (tmp_path / "vllm-facts").iterdir()
    older = {"version": "0.32.0", "keys": {"method": "str"}, "side_rules": {}}
    kept.write_text(MARKER + json.dumps(older))
    assert ask_vllm(host, argv, where="u").remembered is None and host.asked == 2
