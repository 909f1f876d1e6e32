from dataclasses import replace
from pathlib import Path

import pytest

from pytest_specdecode.config.settings import load_settings
from pytest_specdecode.errors import ConfigError

SUITE = Path(__file__).parents[3] / "suites" / "specdecode.toml"

MINIMAL = """
[target]
api_base = "http://127.0.0.1:8011"
model = "m"
command = "vllm serve m --port 8011"
[presets]
ngram = { method = "ngram", num_speculative_tokens = 5, prompt_lookup_max = 4 }
[workloads.coding]
prompt = "Write a binary search tree."
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return path


def test_the_shipped_suite_config_loads_with_the_seed_presets_and_prompts():
    settings = load_settings(SUITE, spec_configs=["ngram", "ngram-k3"])
    assert list(settings.prompt_types) == ["coding", "math", "structured", "explanatory"]
    assert [c.name for c in settings.candidates] == ["ngram", "ngram-k3"]
    assert settings.candidates[0].to_json() == (
        '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4}'
    )
    assert settings.run.concurrency == (1,)
    assert settings.target.workdir == SUITE.parent.parent.resolve()


def test_overrides_and_prompt_type_filter(tmp_path):
    settings = load_settings(
        write(tmp_path, MINIMAL),
        run_overrides={"samples": 9, "alpha": 0.01, "warmup": None},
        prompt_types=["coding"],
    )
    assert (settings.run.samples, settings.run.alpha, settings.run.warmup) == (9, 0.01, 1)
    assert settings.prompt_types["coding"].max_tokens == 128


def test_per_prompt_type_thresholds_override_the_global_ones(tmp_path):
    text = MINIMAL + "max_tpot_ms = 40\n[thresholds]\nmax_tpot_ms = 90\nmin_tokens_per_s = 3\n"
    w = load_settings(write(tmp_path, text)).prompt_types["coding"]
    assert (w.max_tpot_ms, w.min_tokens_per_s) == (40.0, 3.0)


@pytest.mark.parametrize(
    ("text", "kwargs", "message"),
    [
        (MINIMAL + "[run]\nsamples = -1\n", {}, "samples must be an integer >= 1, got -1"),
        (MINIMAL + "[run]\nwarmup = -3\n", {}, "warmup must be an integer >= 0, got -3"),
        (MINIMAL, {"run_overrides": {"samples": 0}}, "samples must be an integer >= 1, got 0"),
        (MINIMAL, {"run_overrides": {"alpha": 1.5}}, "alpha must be between 0 and 1"),
        (MINIMAL + "[run]\nsampels = 3\n", {}, "unknown key(s) sampels"),
        (MINIMAL + "[thresholds]\nmax_tpot_ms = -5\n", {}, "max_tpot_ms must be a positive"),
        (MINIMAL + "[thresholds]\nmin_tokens_per_s = 0\n", {}, "min_tokens_per_s must be a posi"),
        (MINIMAL.split("[workloads.coding]")[0], {}, "[prompt_types] is empty"),
        (MINIMAL + '[workloads.math]\nprompt = ""\n', {}, "'prompt' must be a non-empty string"),
        (MINIMAL, {"prompt_types": ["poetry"]}, "--spec-prompt-type poetry: no such prompt type"),
        (MINIMAL, {"spec_configs": ["ngram", "ngram"]}, "names a candidate twice"),
        (MINIMAL, {"spec_configs": ["eagle"]}, "neither inline JSON nor a preset"),
        (MINIMAL.replace("vllm serve m --port 8011", "./start.sh"), {}, "cannot derive"),
        (MINIMAL.replace('"http://127.0.0.1:8011"', '"127.0.0.1:8011"'), {}, "http(s) URL"),
        (
            MINIMAL + "[presets.bad]\nmethod = 'ngram'\nnum_speculative_tokens = 0\n",
            {},
            "must be > 0",
        ),
        (MINIMAL.replace('model = "m"', ""), {}, "'model' (the served model name) is required"),
        ("[target\n", {}, "is not valid TOML"),
    ],
)
def test_bad_configuration_is_refused_naming_the_problem(tmp_path, text, kwargs, message):
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, text), **kwargs)
    assert message in str(err.value)


def test_missing_file_names_the_path_and_the_option(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.toml does not exist; pass --spec-file"):
        load_settings(tmp_path / "nope.toml")


def test_prompt_types_and_their_older_name_workloads_read_alike(tmp_path):
    new = load_settings(write(tmp_path, MINIMAL.replace("[workloads.", "[prompt_types.")))
    old = load_settings(write(tmp_path, MINIMAL))
    # alike but for where each prompt came from: the table as the user wrote it
    assert {n: replace(t, prompts=()) for n, t in new.prompt_types.items()} == {
        n: replace(t, prompts=()) for n, t in old.prompt_types.items()
    }
    assert [p.text for t in new.prompt_types.values() for p in t.prompts] == [
        p.text for t in old.prompt_types.values() for p in t.prompts
    ]
    assert "[workloads.coding]" in old.prompt_types["coding"].prompts[0].source
    both = MINIMAL + '[prompt_types.math]\nprompt = "x"\n'
    with pytest.raises(ConfigError, match="both \\[prompt_types\\] and \\[workloads\\]"):
        load_settings(write(tmp_path, both))


def test_the_search_runs_on_the_shipped_suite_as_it_is() -> None:
    """The shipped suite's design is three starts per arm; the search starts each config once.
    Only an explicit --spec-repeats is refused (issue 38: `pytest suites/ --spec-search ngram`
    answered 'drop --spec-repeats 3', which the user had not passed)."""
    from pathlib import Path

    from pytest_specdecode.config.settings import load_settings
    from pytest_specdecode.errors import ConfigError

    suite = Path(__file__).resolve().parents[3] / "suites" / "specdecode.toml"
    assert load_settings(suite).run.repeats == 3
    searched = load_settings(suite, run_overrides={"search": "ngram"})
    assert searched.run.search == "ngram" and searched.run.repeats == 1
    with pytest.raises(ConfigError, match="drop --spec-repeats 3"):
        load_settings(suite, run_overrides={"search": "ngram", "repeats": 3})
