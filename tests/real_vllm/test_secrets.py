"""Secrets on a real server: the API key authenticates and is never written or printed."""

from __future__ import annotations

import pytest

from ..support.embedded import require_embedded, write_experiment


def test_api_key_authenticates_and_never_reaches_results_logs_or_output(pytester, monkeypatch):
    require_embedded()
    secret = "sk-specdecode-test-7f3a9c2e41"
    monkeypatch.setenv("SPECDECODE_TEST_KEY", secret)
    exp = write_experiment(pytester, run={"samples": 2, "warmup": 0})
    exp.config.write_text(
        exp.config.read_text().replace(
            "startup_timeout_s = 400",
            'startup_timeout_s = 400\napi_key_env = "SPECDECODE_TEST_KEY"',
        )
    )
    pytester.makeconftest(f"""
        import httpx
        def pytest_runtest_teardown(item):
            status = httpx.get("http://127.0.0.1:{exp.port}/v1/models").status_code
            with open("{pytester.path}/unauthenticated-status.txt", "w") as f:
                f.write(str(status))
    """)
    result = pytester.runpytest_subprocess(*exp.args("--spec-workload", "coding"))
    # Baseline only: the key authenticated every request (vLLM refuses them without it).
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    data = exp.results()
    assert len(data["phases"]["baseline"]["measurements"]["coding"]["samples"]) == 2
    everything = [result.stdout.str(), result.stderr.str()]
    everything += [p.read_text(errors="replace") for p in exp.run_dir().rglob("*") if p.is_file()]
    assert all(secret not in text for text in everything)
    # And the server really demanded it: a request without the key was refused mid-run.
    assert (pytester.path / "unauthenticated-status.txt").read_text() == "401"
    assert exp.leftover_servers() == []
