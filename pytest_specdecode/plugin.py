"""pytest hooks and options. The logic lives in plain objects elsewhere."""

from __future__ import annotations

import contextlib
import signal

import pytest

from . import fixtures
from .errors import ConfigError
from .session import (
    SETTINGS_KEY,
    check_run_options,
    dry_run,
    finish_reports,
    load_from_options,
    run_dir_for,
    terminal_table,
)
from .targets.lifecycle import note_signal

GROUP = "specdecode"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(GROUP, "speculative decoding experiment (pytest-specdecode)")
    add = group.addoption
    add(
        "--spec-config",
        action="append",
        default=[],
        metavar="NAME|JSON",
        help="a candidate: a preset name from the config file or inline JSON for vLLM's "
        "--speculative-config; repeat for several candidates",
    )
    add(
        "--spec-file",
        metavar="PATH",
        default=None,
        help="the experiment's TOML file (default: ini specdecode_file, else "
        "suites/specdecode.toml under the rootdir)",
    )
    add(
        "--spec-workload",
        action="append",
        default=[],
        metavar="NAME",
        help="only this prompt type (repeatable; default: all in the config)",
    )
    add("--spec-samples", type=int, metavar="N", help="measured requests per prompt and phase")
    add("--spec-warmup", type=int, metavar="N", help="warm-up requests, not measured")
    add("--spec-max-tokens", type=int, metavar="N", help="max output tokens per request")
    add("--spec-concurrency", type=int, metavar="N", help="requests in flight (default 1)")
    add("--spec-alpha", type=float, metavar="A", help="significance level (default 0.05)")
    add(
        "--spec-min-effect",
        type=float,
        metavar="F",
        help="smallest relative change called a regression or improvement (default 0.03)",
    )
    add(
        "--spec-reports",
        metavar="DIR",
        default=None,
        help="where each run's folder goes (default: reports/ beside the config's reports_dir)",
    )
    add(
        "--spec-host",
        metavar="ssh://USER@HOST:PORT",
        default=None,
        help="experiment on the systemd unit of this host over SSH (the systemd backend)",
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
        help="where the service answers, as seen from here (overrides [target] api_base)",
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
        "--spec-baseline-from",
        metavar="PATH",
        default=None,
        help="reuse the baseline of a stored run's results.json instead of measuring it (warns "
        "when model, vLLM version, GPU or prompts differ)",
    )
    parser.addini("specdecode_file", "default experiment TOML for pytest-specdecode", default="")


@pytest.hookimpl(tryfirst=True)  # before pytest-html's, which reads --html
def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(fixtures, "specdecode-fixtures")
    experimenting = any(
        config.getoption(o)
        for o in ("spec_config", "spec_file", "spec_host", "spec_dry_run", "spec_baseline_from")
    )
    if experimenting and (
        hasattr(config, "workerinput") or getattr(config.option, "numprocesses", None)
    ):
        raise pytest.UsageError(
            "pytest-specdecode refuses to run under pytest-xdist: two workers would experiment "
            "on one host at once. Run without -n"
        )
    if experimenting:
        try:
            settings = load_from_options(config)
            check_run_options(config, settings)
            if not config.getoption("spec_dry_run"):
                run_dir_for(config, settings)  # checks the reports folder is writable, now
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None
        config.stash[SETTINGS_KEY] = settings
    if config.pluginmanager.hasplugin("html"):  # pytest-html is optional
        from .report import html_hooks as html_report

        html_report.register(config)
    _sigterm_as_interrupt()


def pytest_sessionstart(session: pytest.Session) -> None:
    dry_run(session.config)


@pytest.hookimpl(trylast=True)  # after the session fixtures' teardown: the restore
def pytest_sessionfinish(session: pytest.Session) -> None:
    finish_reports(session.config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    wanted = {"specdecode_phase", "specdecode_candidate", "specdecode_workload"}
    if not wanted & set(metafunc.fixturenames):
        return
    try:
        settings = load_from_options(metafunc.config)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    candidates = [c.name for c in settings.candidates]
    if "specdecode_phase" in metafunc.fixturenames:
        metafunc.parametrize(
            "specdecode_phase", ["baseline", *candidates], indirect=True, scope="session"
        )
    if "specdecode_candidate" in metafunc.fixturenames:
        metafunc.parametrize("specdecode_candidate", candidates, indirect=True, scope="session")
    if "specdecode_workload" in metafunc.fixturenames:
        metafunc.parametrize("specdecode_workload", list(settings.workloads), indirect=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = terminal_table(terminalreporter.config)
    if lines:
        with contextlib.suppress(OSError, ValueError):  # a closed terminal or a broken pipe
            terminalreporter.section("speculative decoding: baseline vs candidates")
            for line in lines:
                terminalreporter.write_line(line)


def _sigterm_as_interrupt() -> None:
    """SIGTERM (a cancelled CI job), SIGHUP (a closed terminal) and Ctrl-C all unwind like
    Ctrl-C, so the restore runs; the first of them first hands the restore to the host."""

    def interrupt(signum: int, frame: object) -> None:
        note_signal(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    for sig, default in (
        (signal.SIGTERM, signal.SIG_DFL),
        (signal.SIGHUP, signal.SIG_DFL),
        (signal.SIGINT, signal.default_int_handler),
    ):
        try:
            if signal.getsignal(sig) in (default, None):
                signal.signal(sig, interrupt)
        except ValueError:  # not the main thread
            pass
