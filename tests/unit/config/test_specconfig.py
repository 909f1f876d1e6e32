import json

import pytest

from pytest_specdecode.config.specconfig import parse_spec_config, validate_spec_values
from pytest_specdecode.config.vllm_argv import option_value, with_speculative_config
from pytest_specdecode.errors import ConfigError

PRESETS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4},
    "ngram-k3": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4},
}


def test_preset_resolves_to_the_seed_json():
    spec = parse_spec_config("ngram", PRESETS)
    assert spec.name == "ngram"
    assert json.loads(spec.to_json()) == PRESETS["ngram"]


def test_inline_json_gets_a_derived_name():
    spec = parse_spec_config('{"method":"ngram","num_speculative_tokens":2}', PRESETS)
    assert spec.name == "ngram-k2"
    assert spec.values == {"method": "ngram", "num_speculative_tokens": 2}


def test_draft_method_with_model_is_accepted():
    spec = parse_spec_config(
        '{"method":"eagle3","model":"AQ-MedAI/Kimi-K2-Instruct-eagle3","num_speculative_tokens":3}',
        PRESETS,
    )
    assert spec.method == "eagle3"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"method": "ngram", ', "not valid JSON"),
        ("[1, 2]", "neither inline JSON nor a preset"),
        ('["ngram"]', "neither inline JSON nor a preset"),
        ("nosuchpreset", "known presets: ngram, ngram-k3"),
        ('{"num_speculative_tokens":3}', "'method' is required"),
        ('{"method":"ngram"}', "'num_speculative_tokens' is required"),
        ('{"method":"ngram","num_speculative_tokens":0}', "must be > 0, got 0"),
        ('{"method":"ngram","num_speculative_tokens":-2}', "must be > 0, got -2"),
        ('{"method":"ngram","num_speculative_tokens":2.5}', "must be an integer, got 2.5"),
        ('{"method":"ngram","num_speculative_tokens":true}', "must be an integer, got True"),
        ('{"method":"ngram","num_speculative_tokens":"5"}', "must be an integer, got '5'"),
        (
            '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":5,'
            '"prompt_lookup_max":2}',
            "prompt_lookup_min=5 must be <= prompt_lookup_max=2",
        ),
        ('{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":0}', "must be >= 1"),
        ('{"method":"ngram","num_speculative_tokens":3,"Lookahead":2}', "not a plain key name"),
        ('{"method":3,"num_speculative_tokens":3}', "method must be a plain name or path, got 3"),
        (
            '{"method":"ngram","num_speculative_tokens":3,"future":{"a b":1}}',
            "has a table key that is not plain",
        ),
        ('{"method":"eagle","num_speculative_tokens":3}', "needs a draft 'model'"),
        ('{"method":"draft_model","num_speculative_tokens":3}', "needs a draft 'model'"),
        (
            '{"method":"eagle3","num_speculative_tokens":3,"model":"x; rm -rf /"}',
            "must be a plain name or path",
        ),
        (
            '{"method":"ngram","num_speculative_tokens":5,"model":"$(touch /tmp/pwned)"}',
            "must be a plain name or path",
        ),
    ],
)
def test_bad_spec_configs_are_refused_with_the_reason(text, message):
    with pytest.raises(ConfigError) as err:
        parse_spec_config(text, PRESETS)
    assert message in str(err.value)


def test_injection_through_an_unknown_key_is_refused_by_its_shape():
    # Refused before any vLLM is asked: whatever the key, the value is not a plain name.
    text = '{"method":"ngram","num_speculative_tokens":5,"x":"\'; touch /tmp/pwned; \'"}'
    with pytest.raises(ConfigError, match=r"'ngram-k5': x must be a plain name or path"):
        parse_spec_config(text, PRESETS)


def test_unknown_methods_and_keys_are_left_to_the_target_vllm():
    # A newer vLLM may know them: parsing keeps them; the offline list refuses them.
    spec = parse_spec_config('{"method":"warp","num_speculative_tokens":3,"lookahead":2}', {})
    with pytest.raises(ConfigError, match=r"\(offline list of vLLM 0.32\): unknown key\(s\) "):
        validate_spec_values(spec.values, source=spec.name)
    with pytest.raises(
        ConfigError, match=r"unknown method 'warp'; this vLLM knows: bailing_hybrid_mtp"
    ):
        validate_spec_values({"method": "warp", "num_speculative_tokens": 3}, source="w")


SERVE = ["vllm", "serve", "moonshotai/Kimi-K2.5", "--port", "8000", "--tensor-parallel-size", "8"]
MODULE = ["/opt/venv/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]


@pytest.mark.parametrize("argv", [SERVE, MODULE, ["/usr/local/bin/vllm", "serve", "m"]])
def test_candidate_command_appends_the_config(argv):
    spec = parse_spec_config("ngram", PRESETS)
    out = with_speculative_config(argv, spec, where="t")
    assert out[: len(argv)] == argv
    assert out[-2:] == ["--speculative-config", spec.to_json()]


@pytest.mark.parametrize(
    "existing",
    [
        ["--speculative-config", '{"method":"ngram","num_speculative_tokens":9}'],
        ['--speculative-config={"method":"ngram","num_speculative_tokens":9}'],
    ],
)
def test_candidate_command_replaces_an_existing_config(existing):
    spec = parse_spec_config("ngram-k3", PRESETS)
    out = with_speculative_config([*SERVE[:3], *existing, "--port", "8000"], spec, where="t")
    assert sum(a.startswith("--speculative-config") for a in out) == 1
    assert out == [*SERVE[:3], "--port", "8000", "--speculative-config", spec.to_json()]


@pytest.mark.parametrize(
    "argv",
    [
        ["/usr/local/bin/start-vllm.sh"],
        ["python", "-m", "http.server"],
        ["vllm", "bench", "serve"],
    ],
)
def test_unrecognised_commands_are_refused_and_say_why(argv):
    spec = parse_spec_config("ngram", PRESETS)
    with pytest.raises(ConfigError, match="expected `vllm serve MODEL …`"):
        with_speculative_config(argv, spec, where="unit x.service")


def test_option_value_reads_both_spellings():
    assert option_value(SERVE, "--port") == "8000"
    assert option_value(["vllm", "serve", "m", "--port=9000"], "--port") == "9000"
    assert option_value(SERVE, "--host") is None
