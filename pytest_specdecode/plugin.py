"""pytest hooks and options. The run's state and logic live in `session.SpecDecodeSession`."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest

from . import fixtures, hookspecs, standard
from .config.break_even import is_map_arm
from .config.settings import SEARCH_METHODS, Settings
from .errors import ConfigError
from .options import settings_from_options
from .record.search import slot_name
from .run import outcome
from .run.crossover import new_session
from .run.session import PLUGIN_NAME, SpecDecodeSession, session_of
from .targets import open_target
from .targets.base import Target
from .targets.interrupts import interrupt_on_signals

GROUP = "specdecode"
_CONFIG: list[pytest.Config] = []  # the runs' configs, for the hooks that are not handed one
_EXPERIMENT_OPTIONS = (
    "spec_config",
    "spec_search",
    "spec_break_even",
    "spec_shape",
    "spec_file",
    "spec_host",
    "spec_dry_run",
    "spec_baseline_from",
)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


@pytest.hookimpl(trylast=True)
def pytest_specdecode_open_target(
    settings: Settings, log_dir: Path, progress: Callable[[str], None]
) -> Target:
    return open_target(settings.target, log_dir=log_dir, progress=progress)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(GROUP, "speculative decoding experiment (pytest-specdecode)")
    add = group.addoption
    add(
        "--spec-config",
        action="append",
        default=[],
        metavar="NAME|JSON",
        help="a candidate: a preset name from the config file or inline JSON for vLLM's "
        "--speculative-config; repeat for several candidates. 'baseline' starts the original's "
        "own configuration again (A/A: measures the restart noise)",
    )
    add(
        "--spec-search",
        choices=SEARCH_METHODS,
        default=None,
        help="search the n-gram configs for the best at this load, with the fewest reloads: "
        "each reload chosen by the replay's prediction, confirmed by its own verdict tests "
        "(search-1 .. search-N)",
    )
    add(
        "--spec-break-even",
        metavar="auto|K[,K...]",
        default=None,
        help="the break-even map: for each k (auto: the candidate's and one other), servers "
        "whose drafts vLLM accepts at a stated accepted per draft from 1 to k+1 "
        "([run] break_even_points, 2), measured against the baseline: the tokens per step at "
        "which speculation pays, and its ceiling, on this engine and load",
    )
    add(
        "--spec-shape",
        metavar="unit|file:PATH|NAME",
        default=None,
        help="serve the model's architecture with dummy weights on the same vLLM and GPUs, "
        "before any reload of the real weights: `unit` (or `served`) the served model's own "
        "config.json, `file:PATH` a config.json here, or a named shape (llama-3.1-8b, "
        "llama-3.2-1b, deepseek-v3, kimi-k2); cut to the depth that fits ([shape] source)",
    )
    add(
        "--spec-shape-layers",
        metavar="auto|N[,N...]",
        default=None,
        help="--spec-shape: the depths to serve (auto: the largest that fits; [shape] layers)",
    )
    add(
        "--spec-max-reloads",
        type=int,
        metavar="N",
        help="--spec-search: the most candidates it may start (default [run] max_reloads, 3)",
    )
    add(
        "--spec-file",
        metavar="PATH",
        default=None,
        help="the experiment's TOML file (default: the ini key specdecode_file, else "
        "[tool.specdecode] in pyproject.toml, else specdecode.toml at the rootdir)",
    )
    add(
        "--spec-prompt-type",
        "--spec-workload",
        dest="spec_prompt_type",
        action="append",
        default=[],
        metavar="NAME",
        help="only this prompt type (repeatable; default: all in the config)",
    )
    add(
        "--spec-samples",
        type=int,
        metavar="N",
        help="measured requests per prompt type and server start (the least, when adaptive)",
    )
    add(
        "--spec-max-samples",
        type=int,
        metavar="N",
        help="adaptive: up to N per start, until its mean is pinned down (N <= samples: fixed)",
    )
    add(
        "--spec-repeats",
        type=int,
        metavar="N",
        help="server starts per arm, in a balanced order (baseline, candidate, candidate, "
        "baseline, ...); the spread of the run's own starts narrows its intervals, pooled with "
        "what is known of the host (with --spec-config baseline: an A/A run that measures it)",
    )
    add("--spec-warmup", type=int, metavar="N", help="warm-up requests, not measured")
    add("--spec-max-tokens", type=int, metavar="N", help="max output tokens per request")
    add(
        "--spec-concurrency",
        metavar="N[,N...]",
        help="load levels: requests in flight, each level measured in every phase, e.g. 1,4,8 "
        "(default [run] concurrency, 1); with --spec-rate, the cap on requests in flight",
    )
    add(
        "--spec-rate",
        metavar="R[,R...]",
        help="open-loop load levels: Poisson arrivals at R requests per second, e.g. 0.5,2",
    )
    add("--spec-alpha", type=float, metavar="A", help="significance level (default [run] alpha)")
    add(
        "--spec-min-effect",
        type=float,
        metavar="F",
        help="smallest relative change called a regression or improvement ([run] min_effect)",
    )
    add(
        "--spec-detect",
        type=_relative_change,
        metavar="CHANGE",
        help="the plan also says which design would call a change this large with 80%% power "
        "(e.g. 10%% or 0.1), from this host's restart noise",
    )
    add(
        "--spec-reports",
        metavar="DIR",
        default=None,
        help="where each run's folder goes (default: the config's reports_dir)",
    )
    add(
        "--spec-host-profiles",
        metavar="DIR",
        default=None,
        help="where hosts' restart noise is kept, written by A/A runs (default: "
        "$SPECDECODE_HOST_PROFILES, the config's host_profiles, else "
        "~/.local/state/pytest-specdecode/host-profiles)",
    )
    add(
        "--spec-host",
        metavar="ssh://USER@HOST:PORT|ALIAS",
        default=None,
        help="experiment on the systemd unit of this host over SSH (the systemd backend); an "
        "ssh_config alias brings its HostName, User, Port, IdentityFile and ProxyJump",
    )
    add(
        "--spec-ssh-config",
        metavar="PATH",
        default=None,
        help="the ssh_config in which an alias --spec-host is looked up (default ~/.ssh/config)",
    )
    add("--spec-unit", metavar="NAME.service", default=None, help="the production vLLM unit")
    add("--spec-identity", metavar="PATH", default=None, help="SSH private key file")
    add(
        "--spec-known-hosts",
        metavar="PATH",
        default=None,
        help="known_hosts to verify the host key against (default ~/.ssh/known_hosts)",
    )
    add(
        "--spec-accept-unknown-host-key",
        action="store_true",
        default=False,
        help="trust a host key that is not in known_hosts (a changed key is always refused)",
    )
    add(
        "--spec-api-base",
        metavar="URL",
        default=None,
        help="where the service answers, as seen from here (overrides [target] api_base); "
        "without it, a remote host's API is reached through the SSH connection",
    )
    add(
        "--spec-api-via",
        choices=("auto", "direct", "ssh"),
        default=None,
        help="systemd backend: reach the API directly, or through SSH (a forwarded channel); "
        "auto: directly when --spec-api-base answers from here, else through SSH",
    )
    add("--spec-model", metavar="NAME", default=None, help="the served model name")
    add(
        "--spec-watchdog",
        type=float,
        metavar="SECONDS",
        default=None,
        help="the host restores the original by itself if this controller is silent this long",
    )
    add(
        "--spec-allow-traffic",
        action="store_true",
        default=False,
        help="measure a running service that other clients are using (refused by default); "
        "each window with their requests is measured again, then marked contaminated",
    )
    add(
        "--spec-allow-busy-host",
        action="store_true",
        default=False,
        help="keep windows in which other work used the serving host, another process its "
        "GPUs, or its clocks throttled (measured again by default), with the host's "
        "environment shown beside every verdict",
    )
    add(
        "--spec-dry-run",
        action="store_true",
        default=False,
        help="print the plan (host, unit files, commands, requests, estimated duration) and "
        "exit; nothing is started or changed",
    )
    add(
        "--spec-aba",
        action="store_true",
        default=False,
        help="drift check: measure the original again after the candidates; a significant "
        "difference flags the experiment unreliable",
    )
    add(
        "--spec-control",
        action="store_true",
        default=False,
        help="after each candidate, start the original again with the same side changes the "
        "candidate got (e.g. --no-async-scheduling): the report splits the change into "
        "speculation itself and the side changes (docs/options.md)",
    )
    add(
        "--spec-order",
        choices=("interleaved", "blocked"),
        default=None,
        help="a start's requests: interleaved over its prompt types and levels in a seeded "
        "shuffled order, round by round (default), or blocked, one prompt type after another",
    )
    add(
        "--spec-arms",
        choices=("auto", "one-at-a-time", "together"),
        default=None,
        help="serve the baseline and each candidate together, as two servers, each request "
        "sent to both in turn, or one arm at a time; auto (default): together where the host "
        "holds both, and the plan says why (docs/options.md)",
    )
    add(
        "--spec-baseline-from",
        metavar="PATH",
        default=None,
        help="reuse the baseline of a stored run's results.json instead of measuring it (warns "
        "when model, vLLM version, GPU or prompts differ)",
    )
    parser.addini("specdecode_file", "default experiment TOML for pytest-specdecode", default="")
    parser.addini(
        "specdecode_builtin",
        "collect the standard experiment's tests when a candidate is given (default true)",
        type="bool",
        default=True,
    )


@pytest.hookimpl(tryfirst=True)  # before pytest-html's, which reads --html
def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(fixtures, "specdecode-fixtures")
    config.addinivalue_line("markers", "specdecode: the standard experiment of pytest-specdecode")
    if not any(config.getoption(o) for o in _EXPERIMENT_OPTIONS):
        return
    if hasattr(config, "workerinput") or getattr(config.option, "numprocesses", None):
        raise pytest.UsageError(
            "pytest-specdecode refuses to run under pytest-xdist: two workers would experiment "
            "on one host at once. Run without -n"
        )
    try:
        session = new_session(config, settings_from_options(config))
        session.check_before_start()
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(session, PLUGIN_NAME)
    _CONFIG.append(config)
    if config.pluginmanager.hasplugin("html") and session.writes_html:
        from . import html_hooks

        html_hooks.register(config, session)
        session.on_discard.append(lambda: html_hooks.disable(config))  # a refused run: no report
    interrupt_on_signals(session.progress)  # it says so where Ctrl-C cannot cut the run


def pytest_unconfigure(config: pytest.Config) -> None:
    if config in _CONFIG:
        _CONFIG.remove(config)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """--spec-dry-run: print the plan and collect nothing (as pytest's own --markers does)."""
    if not config.option.spec_dry_run:
        return None
    config._do_configure()
    try:
        return session_of(config).dry_run()
    finally:
        config._ensure_unconfigure()


@pytest.hookimpl(trylast=True)  # after the session fixtures' teardown: the restore
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    found = session.config.pluginmanager.get_plugin(PLUGIN_NAME)
    if found is not None:
        found.finish(int(exitstatus))


def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    """Ctrl-C, a signal (raised as KeyboardInterrupt) or pytest.exit ended the run early: the
    session notes it before the restore, for the cut run's report."""
    found = _plugin_session()
    if found is not None:
        exit_ = isinstance(excinfo.value, pytest.exit.Exception)
        by = str(getattr(excinfo.value, "msg", "")) if exit_ else excinfo.typename
        found.note_stop("exit" if exit_ else "interrupt", by)


def pytest_internalerror(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    found = _plugin_session()
    if found is not None:
        found.note_stop("error", f"{excinfo.typename}: {excinfo.value}"[:300])


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect: they apply to these too
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """When an experiment is asked for, the standard experiment's tests come first."""
    asked = any(config.getoption(o) for o in _EXPERIMENT_OPTIONS)
    if asked and not config.option.spec_dry_run and config.getini("specdecode_builtin"):
        items[:0] = standard.collect(session)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    wanted = {"specdecode_phase", "specdecode_candidate", "specdecode_prompt_type"}
    wanted.add("specdecode_level")
    if not wanted & set(metafunc.fixturenames):
        return
    settings = session_of(metafunc.config).settings
    candidates = [c.name for c in settings.candidates]
    hypotheses = [c.name for c in settings.candidates if not is_map_arm(c.name, c.values)]
    if settings.run.search:  # the search's slots: each resolved to its config at run time
        slots = [slot_name(i) for i in range(1, settings.run.max_reloads + 1)]
        candidates, hypotheses = candidates + slots, hypotheses + slots
    if "specdecode_phase" in metafunc.fixturenames:
        metafunc.parametrize(
            "specdecode_phase", ["baseline", *candidates], indirect=True, scope="session"
        )
    if "specdecode_candidate" in metafunc.fixturenames:
        # the break-even map's servers measure the engine, not a hypothesis: no verdict test
        metafunc.parametrize("specdecode_candidate", hypotheses, indirect=True, scope="session")
    if "specdecode_prompt_type" in metafunc.fixturenames:
        metafunc.parametrize("specdecode_prompt_type", list(settings.prompt_types), indirect=True)
    levels = settings.run.levels
    if "specdecode_level" in metafunc.fixturenames and len(levels) > 1:
        metafunc.parametrize(
            "specdecode_level", levels, indirect=True, ids=[level.label for level in levels]
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """An arm that failed to start: its failure in full once, a pointer to it after. An
    undecided verdict: marked as such."""
    report = yield
    found = item.config.pluginmanager.get_plugin(PLUGIN_NAME)
    if found is not None and call.excinfo is not None and report.failed:
        text = found.start_failure_text(item.nodeid, call.excinfo.value)
        if text is not None:
            report.longrepr = text
    outcome.mark(item, report, call.excinfo.value if call.excinfo is not None else None)
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(
    report: pytest.TestReport, config: pytest.Config
) -> tuple[str, str, tuple[str, dict[str, bool]]] | None:
    """An undecided verdict: `N undecided` in the summary line, U, UNDECIDED with -v."""
    return outcome.teststatus(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    found = terminalreporter.config.pluginmanager.get_plugin(PLUGIN_NAME)
    lines = found.terminal_lines() if found is not None else []
    undecided = outcome.summary_lines(terminalreporter.stats.get(outcome.CATEGORY, []))
    with contextlib.suppress(OSError, ValueError):  # a closed terminal or a broken pipe
        if lines:
            terminalreporter.section("speculative decoding: baseline vs candidates")
            for line in lines:
                terminalreporter.write_line(line)
        if undecided:  # pytest's own failure summaries list only its own categories
            terminalreporter.section("undecided: no verdict either way, so the gate fails")
            for line in undecided:
                terminalreporter.write_line(line)


def _plugin_session() -> SpecDecodeSession | None:
    return _CONFIG[-1].pluginmanager.get_plugin(PLUGIN_NAME) if _CONFIG else None


def _relative_change(text: str) -> float:
    """'10%' or '0.1': a relative change in (0, 10)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a relative change: {text!r} (say 10% or 0.1)"
        ) from None
    if not 0 < value < 10:
        raise argparse.ArgumentTypeError(f"a relative change must be above 0, got {text!r}")
    return value
