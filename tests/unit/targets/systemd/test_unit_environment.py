"""A unit's environment and ExecStart expanded with it, as systemd 252 does.

The expected values were taken from a real systemd 252 (Debian 12, the test host's): each unit
and file below was started there and its argv printed.
"""

import pytest

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.targets.systemd.unit_environment import (
    UnitEnvironment,
    expand_words,
    parse_env_file,
    parse_environment_files,
    parse_manager_environment,
    parse_show_environment,
    refuse_unset,
)
from pytest_specdecode.targets.systemd.unitfile import effective_exec_start, expand_exec_start

# Environment=A=1 "B=two words" H=h1 / Environment=H=h2 / drop-in: Environment=C=3
SHOWN = 'Environment=A=1 "B=two words" H=h2 C=3'
# EnvironmentFile=/etc/default/envtest, as written there
ENV_FILE = """A=2
# comment
export D=four
E="quoted value"
F=with\\
 continued
 G = spaced 
"""  # noqa: W291 (the trailing blank is part of what is parsed)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def env() -> UnitEnvironment:
    return UnitEnvironment.merge(
        {"PATH": PATH, "LANG": "C.UTF-8"},
        parse_show_environment(SHOWN.split("=", 1)[1]),
        [
            ("/nonexistent", True, None),
            ("/etc/default/envtest", False, parse_env_file(ENV_FILE)),
        ],
    )


def test_expansion_matches_systemd_252_word_for_word():
    # The words as busctl reports them (specifiers resolved, $$ kept), then what the process
    # received from systemd.
    words = [
        "${A}", "$B", "${B}", "x${A}y", "$A$A", "${UNSET}", "$UNSET", "$$A", "${A:-d}",
        "${UNSET:-dflt}", "$$", "%", "$A", "x$A", "${D}", "${E}", "${F}", "${G}", "${H}", "$PATH",
    ]  # fmt: skip
    got = expand_words(words, env())
    assert got.argv == [
        "2", "two", "words", "two words", "x2y", "", "$A", "${A:-d}", "${UNSET:-dflt}", "$",
        "%", "2", "x$A", "", "quoted value", "with continued", "spaced", "h2", PATH,
    ]  # fmt: skip
    assert got.unset == ["A$A", "UNSET", "D"]


def test_variables_systemd_sets_at_the_start_stay_as_written():
    got = expand_words(["$MAINPID", "--name=vllm-${INVOCATION_ID}", "${HOME}"], env())
    assert got.argv == ["$MAINPID", "--name=vllm-${INVOCATION_ID}", "${HOME}"]
    assert got.unset == []


def test_files_override_environment_and_later_files_earlier_ones():
    merged = UnitEnvironment.merge(
        {"PORT": "1"},
        ["PORT=2", "X=x"],
        [("/a", False, {"PORT": "3"}), ("/b", True, None), ("/c", True, {"PORT": "4"})],
    )
    assert merged.values["PORT"] == "4" and merged.origin["PORT"] == "EnvironmentFile=-/c"
    assert merged.origin["X"] == "Environment="
    assert merged.looked_in == (
        "the manager's environment (systemctl show-environment)",
        "Environment= of the unit and its drop-ins",
        "EnvironmentFile=/a",
        "EnvironmentFile=-/b (missing: skipped, as systemd does)",
        "EnvironmentFile=-/c",
    )


def test_env_file_quoting_as_systemd_reads_it():
    text = (
        "T='single $quoted'\n"
        'U="dq \\" \\$x"\n'
        "V=unq\\ uoted\n"
        "W=trail # not a comment\n"
        "#X=no\n"
        ";Y=no\n"
        "X=  lead\n"
        'Z=\'a\' "b"c"d"\n'
        "K\n"
        "1BAD=x\n"
    )
    assert parse_env_file(text) == {
        "T": "single $quoted",
        "U": 'dq " $x',
        "V": "unq uoted",
        "W": "trail # not a comment",
        "X": "lead",
        "Z": 'abc"d"',
    }
    assert parse_env_file(ENV_FILE) == {
        "A": "2",
        "E": "quoted value",
        "F": "with continued",
        "G": "spaced",
    }


def test_systemctl_show_quoting_is_read_back():
    value = 'A=1 "B=two words" "Q=a\\"b\\\\c\\$d" "R=x\\"y" S= "T=tab\\there" U=é C=3'
    assert parse_show_environment(value) == [
        "A=1",
        "B=two words",
        'Q=a"b\\c$d',
        'R=x"y',
        "S=",
        "T=tab\there",
        "U=é",
        "C=3",
    ]
    lines = [
        "Environment=A=1",
        "EnvironmentFiles=/etc/vllm/a b.env (ignore_errors=yes)",
        "EnvironmentFiles=/etc/default/vllm (ignore_errors=no)",
    ]
    assert parse_environment_files(lines) == [
        ("/etc/vllm/a b.env", True),
        ("/etc/default/vllm", False),
    ]
    # systemctl show-environment, as systemd 252 printed these values
    shown = "LANG=C.UTF-8\nA=$'a b'\nB=$'t\\tab'\nC=$'q\"x'\nD=$'d$x'\nE=$'sq\\'x'\n"
    assert parse_manager_environment(shown) == {
        "LANG": "C.UTF-8",
        "A": "a b",
        "B": "t\tab",
        "C": 'q"x',
        "D": "d$x",
        "E": "sq'x",
    }


def test_an_unset_variable_is_refused_with_where_it_was_looked_for():
    expansion = expand_words(["--port", "${VLLM_PORT}"], env())
    with pytest.raises(ConfigError) as info:
        refuse_unset(expansion, env(), where="unit vllm.service on gpu")
    message = str(info.value)
    assert message.startswith("unit vllm.service on gpu: ExecStart uses ${VLLM_PORT}, which is")
    assert "EnvironmentFile=-/nonexistent (missing: skipped, as systemd does)" in message
    assert "EnvironmentFile=/etc/default/envtest" in message
    assert message.endswith("Nothing was touched")


UNIT = """# /etc/systemd/system/vllm.service
[Service]
Environment=VLLM_PORT=8000
ExecStart=/opt/venv/bin/vllm serve /models/%i --port ${VLLM_PORT} $EXTRA_ARGS
"""


def test_the_command_is_expanded_from_systemds_own_words():
    exec_start = effective_exec_start(UNIT, where="u")
    unit_env = UnitEnvironment.merge(
        {},
        ["VLLM_PORT=8000"],
        [("/etc/default/vllm", False, {"VLLM_PORT": "8100", "EXTRA_ARGS": "--seed 0"})],
    )
    words = ["/opt/venv/bin/vllm", "serve", "/models/smol", "--port", "${VLLM_PORT}", "$EXTRA_ARGS"]
    command = expand_exec_start(exec_start, unit_env, where="u", words=words)
    assert command.argv == [
        "/opt/venv/bin/vllm", "serve", "/models/smol", "--port", "8100", "--seed", "0",
    ]  # fmt: skip
    assert command.server_argv == ["/models/smol", "--port", "8100", "--seed", "0"]
    assert command.sources() == (
        "VLLM_PORT from EnvironmentFile=/etc/default/vllm, "
        "EXTRA_ARGS from EnvironmentFile=/etc/default/vllm"
    )
    # Without systemd's words, the unit file's: its specifiers unresolved.
    assert expand_exec_start(exec_start, unit_env, where="u").argv[2] == "/models/%i"
