import re
import shlex

import pytest

from pytest_specdecode.config.specconfig import parse_spec_config
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.targets.unitfile import (
    candidate_unit_name,
    check_unit_name,
    effective_exec_start,
    quote_arg,
    render_candidate_unit,
    split_exec,
)

NGRAM = parse_spec_config('{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4}', {})

# What `systemctl cat` prints for a production unit with a drop-in.
UNIT = """# /etc/systemd/system/vllm-kimi-k25-int4.service
[Unit]
Description=vLLM Kimi-K2.5 INT4
After=network-online.target

[Service]
Environment=VLLM_CPU_KVCACHE_SPACE=2
ExecStart=/opt/vllm/bin/vllm serve /models/kimi-k25-int4 \\
    --served-model-name "kimi k2.5" --port 8000 --tensor-parallel-size 8
Restart=on-failure

[Install]
WantedBy=multi-user.target

# /etc/systemd/system/vllm-kimi-k25-int4.service.d/override.conf
[Service]
ExecStart=
ExecStart=/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server --model /m \\
    --port 8000 --speculative-config '{"method":"ngram","num_speculative_tokens":9}'
"""


def test_the_drop_in_wins_and_the_old_speculative_config_is_replaced():
    text = render_candidate_unit("vllm-kimi-k25-int4.service", UNIT, NGRAM, run_id="r1")
    exec_lines = [line for line in text.splitlines() if line.startswith("ExecStart")]
    assert len(exec_lines) == 1
    argv = [t.value for t in split_exec(exec_lines[0].split("=", 1)[1])]
    assert argv == [
        "/opt/vllm/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m",
        "--port",
        "8000",
        "--speculative-config",
        NGRAM.to_json(),
    ]
    assert "[Install]" not in text and "WantedBy" not in text
    assert "Environment=VLLM_CPU_KVCACHE_SPACE=2" in text
    assert "Restart=on-failure" in text
    assert "(pytest-specdecode candidate ngram-k5)" in text
    assert text.startswith("# Written by pytest-specdecode (run r1)")


def test_vllm_serve_form_keeps_the_original_quoting():
    unit = UNIT.split("# /etc/systemd/system/vllm-kimi-k25-int4.service.d")[0]
    prefix, tokens = effective_exec_start(unit, where="u")
    assert prefix == ""
    assert [t.value for t in tokens][:5] == [
        "/opt/vllm/bin/vllm",
        "serve",
        "/models/kimi-k25-int4",
        "--served-model-name",
        "kimi k2.5",
    ]
    text = render_candidate_unit("u.service", unit, NGRAM, run_id="r")
    assert '--served-model-name "kimi k2.5"' in text


HOSTILE = [
    "'; touch /tmp/pwned; '$(id)%n\"\\",
    '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4}',
    "${HOME} $HOME %i %% $$ %n%N%p",
    "a b\tc",  # whitespace inside one argument
    "\\\\\\",
    '"',
    "'",
    "' \" '",
    "`reboot`; $(reboot) && reboot || reboot",
    "--x=--y --z",
    "",
    "ünïcødé ✓",
    '\\"',
    "%%%%$$$$",
]


def systemd_unescape(value: str) -> str:
    """What systemd passes on for a word it has split: $$ and %% become $ and %."""
    return re.sub(r"\$\$|%%", lambda m: m.group(0)[0], value)


@pytest.mark.parametrize("arg", HOSTILE)
def test_quote_arg_round_trips_through_systemds_splitting(arg):
    (token,) = split_exec(quote_arg(arg))
    assert systemd_unescape(token.value) == arg
    assert "$" not in re.sub(r"\$\$", "", token.value)  # no variable left to expand
    assert "%" not in re.sub(r"%%", "", token.value)  # no specifier left to expand


def test_quote_arg_refuses_control_characters():
    for bad in ("a\nExecStartPost=/bin/rm -rf /", "a\rb", "a\0b"):
        with pytest.raises(ConfigError, match="control character"):
            quote_arg(bad)


def test_split_exec_matches_shell_quoting_for_ordinary_lines():
    line = """/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model '/a b' """
    line += """--x "c\\"d" e\\ f"""
    assert [t.value for t in split_exec(line)] == shlex.split(line)


@pytest.mark.parametrize(
    ("unit", "message"),
    [
        ("[Service]\nExecStart=/usr/local/bin/start-vllm.sh\n", "cannot derive a candidate"),
        ("[Service]\nType=simple\n", "no ExecStart="),
        ("[Service]\nExecStart=vllm serve m\nExecStart=vllm serve n\n", "2 ExecStart= lines"),
        ("[Service]\nExecStart=!vllm serve m\n", "prefix '!'"),
        ("[Service]\nExecStart=vllm serve 'm\n", "unterminated quote"),
    ],
)
def test_unit_files_it_cannot_safely_rewrite_are_refused(unit, message):
    with pytest.raises(ConfigError, match=message):
        render_candidate_unit("u.service", unit, NGRAM, run_id="r")


@pytest.mark.parametrize(
    "name", ["../etc/passwd.service", "a b.service", "x.service; rm -rf /", "vllm", "-x.service"]
)
def test_unit_names_are_validated(name):
    with pytest.raises(ConfigError, match="not a plain systemd service name"):
        check_unit_name(name)


def test_candidate_unit_name():
    assert candidate_unit_name("vllm-kimi-k25-int4.service") == (
        "vllm-kimi-k25-int4-specdecode.service"
    )
