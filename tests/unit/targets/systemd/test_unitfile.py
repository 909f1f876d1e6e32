import re
import shlex
from dataclasses import replace

import pytest

from pytest_specdecode.config.specconfig import parse_spec_config
from pytest_specdecode.config.target import check_unit_name
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.targets.systemd.unitfile import (
    DROPIN_NAME,
    dropin_path,
    dropin_run_id,
    effective_exec_start,
    own_dropins,
    quote_arg,
    render_dropin,
    split_exec,
    unit_files,
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

# A template, as `systemctl cat vllm@smol.service` prints it: the specifiers unresolved.
TEMPLATE = """# /etc/systemd/system/vllm@.service
[Unit]
Description=vLLM serving %i

[Service]
EnvironmentFile=-/etc/vllm/%i.env
ExecStartPre=/usr/bin/test -d /models/%i
ExecStart=/opt/vllm/bin/vllm serve /models/%i --served-model-name %i --port ${PORT} $EXTRA
User=vllm
"""


def dropin_exec(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line.startswith("ExecStart")]
    assert lines[0] == "ExecStart=", text  # the reset comes first
    assert len(lines) == 2, text
    return [t.raw for t in split_exec(lines[1].split("=", 1)[1])]


def test_the_dropin_resets_execstart_and_replaces_the_old_speculative_config():
    text = render_dropin("vllm-kimi-k25-int4.service", UNIT, NGRAM, run_id="r1")
    argv = [t.value for t in split_exec(text.splitlines()[-1].split("=", 1)[1])]
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
    # Only [Service] ExecStart: everything else stays the unit's own, nothing is copied.
    assert "[Unit]" not in text and "Environment" not in text and "Restart" not in text
    assert text.startswith("# Written by pytest-specdecode (run r1): candidate 'ngram-k5'")
    assert "a reboot brings back the original" in text
    assert dropin_run_id(text) == "r1"


def test_the_dropin_adds_the_measurement_arguments_after_the_config():
    spec = replace(NGRAM, extra_args=("--per-request-spec-decode-metrics", "detailed"))
    raw = dropin_exec(render_dropin("vllm-kimi-k25-int4.service", UNIT, spec, run_id="r1"))
    assert raw[-4:] == [
        "--speculative-config",
        quote_arg(NGRAM.to_json()),
        '"--per-request-spec-decode-metrics"',
        '"detailed"',
    ]


def test_template_specifiers_and_variables_stay_the_units_own():
    text = render_dropin("vllm@smol.service", TEMPLATE, NGRAM, run_id="r")
    raw = dropin_exec(text)
    # The words are the unit's own, verbatim: systemd resolves %i to the instance, ${PORT} and
    # $EXTRA from its environment, exactly as for the original.
    assert raw[:7] == [
        "/opt/vllm/bin/vllm",
        "serve",
        "/models/%i",
        "--served-model-name",
        "%i",
        "--port",
        "${PORT}",
    ]
    assert raw[7] == "$EXTRA"
    # The JSON is the only thing quoted here, with % and $ made literal.
    assert raw[-2:] == ["--speculative-config", quote_arg(NGRAM.to_json())]
    assert "EnvironmentFile" not in text and "User" not in text and "ExecStartPre" not in text
    assert dropin_path("vllm@smol.service") == (
        f"/run/systemd/system/vllm@smol.service.d/{DROPIN_NAME}"
    )


def test_vllm_serve_form_keeps_the_original_quoting():
    unit = UNIT.split("# /etc/systemd/system/vllm-kimi-k25-int4.service.d")[0]
    exec_start = effective_exec_start(unit, where="u")
    assert exec_start.prefix == ""
    assert exec_start.argv[:5] == [
        "/opt/vllm/bin/vllm",
        "serve",
        "/models/kimi-k25-int4",
        "--served-model-name",
        "kimi k2.5",
    ]
    text = render_dropin("u.service", unit, NGRAM, run_id="r")
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


def test_a_failure_tolerating_prefix_is_kept():
    text = render_dropin("u.service", "[Service]\nExecStart=-+vllm serve m\n", NGRAM, run_id="r")
    assert text.splitlines()[-1].startswith("ExecStart=-+vllm serve m --speculative-config ")


def test_systemctl_cat_splits_into_files_in_order():
    files = unit_files(UNIT)
    assert [path for path, _ in files] == [
        "/etc/systemd/system/vllm-kimi-k25-int4.service",
        "/etc/systemd/system/vllm-kimi-k25-int4.service.d/override.conf",
    ]
    assert own_dropins(UNIT) == []
    ours = f"# /run/systemd/system/u.service.d/{DROPIN_NAME}\n[Service]\nExecStart=\n"
    assert [p for p, _ in own_dropins(UNIT + ours)] == [
        f"/run/systemd/system/u.service.d/{DROPIN_NAME}"
    ]


def test_a_dropin_that_would_override_ours_is_refused():
    later = "# /etc/systemd/system/u.service.d/zzz-local.conf\n[Service]\nExecStart=\n"
    later += "ExecStart=vllm serve other\n"
    with pytest.raises(ConfigError, match=r"zzz-local\.conf sets ExecStart= and is applied after"):
        render_dropin("u.service", UNIT + later, NGRAM, run_id="r")
    harmless = "# /etc/systemd/system/u.service.d/zzz-local.conf\n[Service]\nNice=5\n"
    render_dropin("u.service", UNIT + harmless, NGRAM, run_id="r")


def test_quote_arg_makes_dollar_percent_and_quotes_literal():
    hostile = "'; touch /tmp/pwned; '$(id)%n\"\\"
    quoted = quote_arg(hostile)
    assert quoted == '"\'; touch /tmp/pwned; \'$$(id)%%n\\"\\\\"'
    with pytest.raises(ConfigError, match="control character"):
        quote_arg("a\nExecStartPost=/bin/rm -rf /")


def test_split_exec_matches_shell_quoting_for_ordinary_lines():
    line = """/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model '/a b' """
    line += """--x "c\\"d" e\\ f"""
    assert [t.value for t in split_exec(line)] == shlex.split(line)


@pytest.mark.parametrize(
    ("unit", "message"),
    [
        ("[Service]\nExecStart=/usr/local/bin/start-vllm.sh\n", "cannot derive a candidate"),
        ("[Service]\nExecStart=/bin/bash -c 'vllm serve m'\n", "runs a shell"),
        ("[Service]\nType=simple\n", "no ExecStart="),
        ("[Service]\nExecStart=vllm serve m\nExecStart=vllm serve n\n", "2 ExecStart= lines"),
        ("[Service]\nExecStart=@vllm serve m\n", "prefix '@'"),
        ("[Service]\nExecStart=:vllm serve m\n", "prefix ':'"),
        ("[Service]\nExecStart=vllm serve 'm\n", "unterminated quote"),
        ("[Service]\nExecStart=vllm serve m ; vllm serve n\n", "several commands"),
    ],
)
def test_unit_files_it_cannot_safely_rewrite_are_refused(unit, message):
    with pytest.raises(ConfigError, match=message):
        render_dropin("u.service", unit, NGRAM, run_id="r")


def test_a_wrapper_is_refused_with_how_to_expose_the_flags():
    with pytest.raises(ConfigError) as info:
        render_dropin("u.service", "[Service]\nExecStart=/opt/run.sh\n", NGRAM, run_id="r")
    assert "ExecStartPre=" in str(info.value) and "EnvironmentFile=" in str(info.value)


@pytest.mark.parametrize(
    "name", ["../etc/passwd.service", "a b.service", "x.service; rm -rf /", "vllm", "-x.service"]
)
def test_unit_names_are_validated(name):
    with pytest.raises(ConfigError, match="not a plain systemd service name"):
        check_unit_name(name)


def test_a_bare_template_is_refused_and_an_instance_accepted():
    with pytest.raises(ConfigError, match=r"vllm@MODEL\.service"):
        check_unit_name("vllm@.service")
    assert check_unit_name("vllm@smol-2.service") == "vllm@smol-2.service"


class NoHost:
    """A stand-in host for rendering only: any command is a test failure."""

    name = "root@gpu-box:22"

    def run(self, argv, **kw):
        raise AssertionError(f"ran {argv}")

    check = run

    def close(self) -> None:
        pass


def test_the_host_side_restore_script():
    from pytest_specdecode.targets.systemd.target import SystemdTarget

    target = SystemdTarget(
        NoHost(), "vllm@smol.service", api_base="http://gpu-box:8000", model="smol"
    )
    target.dependents = {"vllm-proxy.service": True, "vllm-monitor.service": False}
    lines = target.restore_script().splitlines()
    run = f"'run {target.run_id} '"
    # It acts only while the lock is this run's: a stale timer cannot restore another run.
    assert lines[4].startswith(f"grep -qsF {run} /run/pytest-specdecode/lock/owner.txt ||")
    body = "\n".join(lines)
    order = [
        "systemctl stop pytest-specdecode-watchdog.timer",
        "  systemctl stop vllm@smol.service",
        f"  rm -f /run/systemd/system/vllm@smol.service.d/{DROPIN_NAME}",
        "  systemctl daemon-reload",
        "systemctl start vllm@smol.service",
        "systemctl start vllm-proxy.service",  # active at the start; the monitor was not
        "ss -Htln 'sport = :8000'",
        f"grep -qsF {run} /run/pytest-specdecode/lock/owner.txt && rm -rf",
    ]
    positions = [body.index(step) for step in order]
    assert positions == sorted(positions), body
    assert "vllm-monitor" not in body and "/etc/systemd" not in body
