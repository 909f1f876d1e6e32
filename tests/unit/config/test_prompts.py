"""Prompt sets: the shipped sets, the file formats, the TOML forms and the request plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specdecode.config.prompts import (
    SHIPPED_SETS,
    Prompt,
    parse_jsonl,
    parse_sharegpt,
    parse_spec_bench,
    request_plan,
    shipped_set,
)
from pytest_specdecode.config.settings import load_settings
from pytest_specdecode.errors import ConfigError

DATA = Path(__file__).parents[2] / "data"
SUITE = Path(__file__).parents[3] / "suites" / "specdecode.toml"

# The seed experiment's four prompts: each shipped set starts with its own, unchanged.
SEED = {
    "coding": "Write a Python implementation of a binary search tree with insert, search, delete "
    "and in-order traversal. Include docstrings.",
    "math": "A farmer has 400 meters of fencing and wants to enclose a rectangular field that "
    "borders a straight river, so no fence is needed along the river. What dimensions maximize "
    "the area? Show each step of the optimization.",
    "structured": "Generate a JSON array of 5 fictional employees. Each object has the keys id, "
    "name, email, department, salary and skills (a list of strings). Output only the JSON.",
    "explanatory": "Explain the differences between TCP and UDP: connection setup, reliability, "
    "ordering, flow control and typical use cases.",
}

HEAD = """
[target]
api_base = "http://127.0.0.1:8011"
model = "m"
command = "vllm serve m --port 8011"
"""


def settings_for(tmp_path: Path, workloads: str, run: str = ""):
    path = tmp_path / "exp.toml"
    path.write_text(HEAD + run + workloads)
    return load_settings(path)


# --------------------------------------------------------------------------- shipped sets


@pytest.mark.parametrize("name", SHIPPED_SETS)
def test_shipped_sets_hold_at_least_ten_distinct_prompts(name):
    prompts = shipped_set(name)
    texts = [p.text for p in prompts]
    assert len(texts) >= 10
    assert len(set(texts)) == len(texts)
    assert all(t.strip() == t and t for t in texts)
    assert prompts[3].source == f"shipped {name} #3"


@pytest.mark.parametrize("name", list(SEED))
def test_each_seed_type_starts_with_the_seed_prompt(name):
    assert shipped_set(name)[0].text == SEED[name]


def test_no_prompt_is_shipped_in_two_sets():
    texts = [p.text for name in SHIPPED_SETS for p in shipped_set(name)]
    assert len(set(texts)) == len(texts)


def test_long_context_prompts_are_long_documents_that_fit_a_1024_token_context():
    # 600-900 tokens each with SmolLM2's tokenizer and chat template (counted when written, and
    # checked against the server's usage in test_loadgen_vllm.py); here their length in
    # characters, at 1.8 (a CSV table) to 4.5 (prose) characters a token.
    lengths = [len(p.text) for p in shipped_set("long_context")]
    assert min(lengths) > 1200
    assert max(lengths) < 4000
    short = max(len(p.text) for name in SEED for p in shipped_set(name))
    assert short < 400


def test_the_shipped_suite_uses_the_shipped_sets():
    settings = load_settings(SUITE)
    for name in SEED:
        workload = settings.prompt_types[name]
        assert workload.prompts == tuple(shipped_set(name))
        assert workload.prompt == SEED[name]  # what the single-prompt experiment sends


# --------------------------------------------------------------------------- JSONL


def test_jsonl_prompts_in_file_order_with_file_and_line():
    text = '{"prompt": "one", "output_tokens": 10}\n\n{"prompt": "two"}\n'
    assert parse_jsonl(text, "p.jsonl") == [
        Prompt("one", source="p.jsonl:1"),
        Prompt("two", source="p.jsonl:3"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"prompt": "a"}\n{"prompt": "b"\n', "p.jsonl:2: not valid JSON (Expecting ',' delimiter"),
        ('{"prompt": "a"}\n["b"]\n', "p.jsonl:2: each line must be a JSON object"),
        ('{"text": "a"}\n', "p.jsonl:1: needs a non-empty string 'prompt'"),
        ('{"prompt": "  "}\n', "p.jsonl:1: needs a non-empty string 'prompt'"),
        ('{"conversations": []}\n', "this looks like ShareGPT: set format = 'sharegpt'"),
        ('{"turns": ["a"]}\n', "this looks like Spec-Bench: set format = 'spec-bench'"),
        ("\n\n", "p.jsonl: holds no prompts"),
    ],
)
def test_jsonl_errors_name_the_file_and_line(text, message):
    with pytest.raises(ConfigError) as info:
        parse_jsonl(text, "p.jsonl")
    assert message in str(info.value)


# --------------------------------------------------------------------------- ShareGPT

CONVERSATIONS = [
    {
        "id": "a",
        "conversations": [
            {"from": "human", "value": "What is a monad?"},
            {"from": "gpt", "value": "A monad is ..."},
            {"from": "human", "value": "Give an example in Python."},
            {"from": "gpt", "value": "Sure: ..."},
        ],
    },
    {"id": "empty", "conversations": []},
    {"id": "gpt only", "conversations": [{"from": "gpt", "value": "Hello"}]},
    {
        "id": "b",
        "conversations": [
            {"from": "system", "value": "You are terse."},
            {"from": "gpt", "value": "(a greeting before the user spoke)"},
            {"from": "human", "value": "Name three primes."},
        ],
    },
]


def test_sharegpt_array_takes_the_first_human_turn_and_skips_conversations_without_one():
    prompts = parse_sharegpt(json.dumps(CONVERSATIONS), "sg.json")

    assert [p.text for p in prompts] == ["What is a monad?", "Name three primes."]
    assert [p.source for p in prompts] == ["sg.json entry 0", "sg.json entry 3"]
    assert all(not p.messages for p in prompts)


def test_sharegpt_multi_turn_keeps_the_conversation_up_to_its_last_human_turn():
    text = "\n".join(json.dumps(c) for c in CONVERSATIONS)  # JSONL works too
    first, second = parse_sharegpt(text, "sg.jsonl", multi_turn=True)

    assert first.text == "Give an example in Python."
    assert first.messages == (
        ("user", "What is a monad?"),
        ("assistant", "A monad is ..."),
        ("user", "Give an example in Python."),
    )
    assert first.chat_messages()[1] == {"role": "assistant", "content": "A monad is ..."}
    assert first.source == "sg.jsonl:1"
    assert second.messages == (("system", "You are terse."), ("user", "Name three primes."))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"id": 1}, "sg.jsonl:2: a ShareGPT entry needs a list 'conversations'"),
        ({"conversations": ["hi"]}, "sg.jsonl:2: conversations[0] is not an object"),
        (
            {"conversations": [{"from": "robot", "value": "hi"}]},
            "sg.jsonl:2: conversations[0] has an unknown speaker 'robot'",
        ),
        ({"conversations": [{"from": "human"}]}, "conversations[0] needs a string 'value'"),
    ],
)
def test_sharegpt_errors_name_the_file_and_line(entry, message):
    text = json.dumps(CONVERSATIONS[0]) + "\n" + json.dumps(entry)
    with pytest.raises(ConfigError) as info:
        parse_sharegpt(text, "sg.jsonl")
    assert message in str(info.value)


def test_sharegpt_invalid_json_array_names_the_line():
    with pytest.raises(ConfigError, match=r"sg.json:3: not valid JSON"):
        parse_sharegpt('[\n{"conversations": []},\n{oops}\n]', "sg.json")


# --------------------------------------------------------------------------- Spec-Bench


def test_spec_bench_groups_first_turns_by_category_in_file_order():
    path = DATA / "spec_bench_sample.jsonl"
    found = parse_spec_bench(path.read_text(), str(path))

    assert list(found) == ["translation", "summarization", "writing"]
    assert [p.text[:24] for p in found["translation"]] == [
        "Translate into French: T",
        "Translate into German: P",
    ]
    assert found["writing"][0].text.startswith("Write a two-sentence note")  # the first turn
    assert found["summarization"][0].source == f"{path}:2 (question_id 2)"


def test_spec_bench_categories_choose_and_order():
    text = (DATA / "spec_bench_sample.jsonl").read_text()
    found = parse_spec_bench(text, "q.jsonl", categories=["writing", "translation"])
    assert list(found) == ["writing", "translation"]
    with pytest.raises(ConfigError, match="no question in category poetry; the file has: transl"):
        parse_spec_bench(text, "q.jsonl", categories=["poetry"])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"question_id": 9, "turns": ["x"]}', "q.jsonl:2: a Spec-Bench question needs a string"),
        ('{"category": "qa", "turns": []}', "q.jsonl:2: a Spec-Bench question needs 'turns'"),
        ('{"category": "qa", "turns": [" "]}', "q.jsonl:2: the first turn is empty"),
    ],
)
def test_spec_bench_errors_name_the_file_and_line(line, message):
    text = '{"category": "qa", "turns": ["ok"]}\n' + line
    with pytest.raises(ConfigError) as info:
        parse_spec_bench(text, "q.jsonl")
    assert message in str(info.value)


# --------------------------------------------------------------------------- the TOML forms


def test_inline_list_file_and_shipped_set_in_one_config(tmp_path):
    (tmp_path / "mine.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c"}\n')
    settings = settings_for(
        tmp_path,
        """
[workloads.inline]
prompts = ["first", "second"]
max_tokens = 64
[workloads.mine]
prompts_file = "mine.jsonl"
limit = 2
[workloads.long]
prompt_set = "long_context"
[workloads.single]
prompt = "just one"
""",
    )
    w = settings.prompt_types
    assert [p.text for p in w["inline"].prompts] == ["first", "second"]
    assert (w["inline"].prompt, w["inline"].max_tokens) == ("first", 64)
    assert [p.text for p in w["mine"].prompts] == ["a", "b"]
    assert w["mine"].prompts[1].source == f"{tmp_path / 'mine.jsonl'}:2"
    assert len(w["long"].prompts) == 10
    assert [p.text for p in w["single"].prompts] == ["just one"]
    data = json.loads(json.dumps(w["inline"].to_dict()))
    assert data["prompt"] == "first"
    assert [p["text"] for p in data["prompts"]] == ["first", "second"]


def test_a_spec_bench_file_becomes_one_prompt_type_per_category(tmp_path):
    settings = settings_for(
        tmp_path,
        f"""
[workloads.sb]
prompts_file = "{DATA / "spec_bench_sample.jsonl"}"
format = "spec-bench"
categories = ["summarization", "translation"]
max_tokens = 48
max_tpot_ms = 90
""",
    )
    assert list(settings.prompt_types) == ["sb.summarization", "sb.translation"]
    w = settings.prompt_types["sb.translation"]
    assert (w.name, w.max_tokens, w.max_tpot_ms, len(w.prompts)) == ("sb.translation", 48, 90, 2)


def test_sharegpt_multi_turn_from_the_toml(tmp_path):
    (tmp_path / "sg.json").write_text(json.dumps(CONVERSATIONS))
    settings = settings_for(
        tmp_path,
        '[workloads.chat]\nprompts_file = "sg.json"\nformat = "sharegpt"\nmulti_turn = true\n',
    )
    assert settings.prompt_types["chat"].prompts[0].messages[1][0] == "assistant"


@pytest.mark.parametrize(
    ("workloads", "message"),
    [
        (
            '[prompt_types.x]\nprompt = "a"\nprompts = ["b"]\n',
            "give exactly one of prompt, prompts",
        ),
        ("[workloads.x]\nmax_tokens = 5\n", "give exactly one of prompt, prompts, prompt_set"),
        ("[workloads.x]\nprompts = []\n", "'prompts' must be a non-empty list of strings"),
        ('[workloads.x]\nprompts = ["a", 3]\n', "prompts[1] must be a non-empty string, got 3"),
        ('[workloads.x]\nprompt_set = "poems"\n', "no shipped prompt set 'poems'; shipped: coding"),
        ('[workloads.x]\nprompts_file = "nope.jsonl"\n', "prompts_file"),
        ('[workloads.x]\nprompts_file = "p.jsonl"\nformat = "csv"\n', "format must be one of"),
        ('[workloads.x]\nprompt = "a"\nformat = "jsonl"\n', "format only go with prompts_file"),
        ('[workloads.x]\nprompts_file = "p.jsonl"\nmulti_turn = true\n', "multi_turn needs format"),
        ('[workloads.x]\nprompts_file = "p.jsonl"\ncategories = ["a"]\n', "categories only go"),
        ('[workloads.x]\nprompts = ["a"]\nlimit = 0\n', "limit must be an integer >= 1"),
        ('[workloads.x]\nprompts_file = "bad.jsonl"\n', "bad.jsonl:2: not valid JSON"),
    ],
)
def test_prompt_source_errors(tmp_path, workloads, message):
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n')
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{\n')
    with pytest.raises(ConfigError) as info:
        settings_for(tmp_path, workloads)
    assert message in str(info.value)
    table = "[prompt_types.x]" if workloads.startswith("[prompt_types") else "[workloads.x]"
    assert table in str(info.value) or "bad.jsonl" in str(info.value)  # the table as written


def test_multi_turn_prompts_need_the_chat_endpoint(tmp_path):
    (tmp_path / "sg.json").write_text(json.dumps(CONVERSATIONS))
    with pytest.raises(ConfigError, match="multi-turn prompts need endpoint = 'chat'"):
        settings_for(
            tmp_path,
            '[workloads.chat]\nprompts_file = "sg.json"\nformat = "sharegpt"\nmulti_turn = true\n',
            run='[run]\nendpoint = "completions"\n',
        )


def test_a_category_named_like_another_prompt_type_is_refused(tmp_path):
    workloads = (
        '[workloads."sb.writing"]\nprompt = "x"\n'
        f'[workloads.sb]\nprompts_file = "{DATA / "spec_bench_sample.jsonl"}"\n'
        'format = "spec-bench"\n'
    )
    with pytest.raises(ConfigError, match=r"the prompt type 'sb\.writing' is defined twice"):
        settings_for(tmp_path, workloads)


# --------------------------------------------------------------------------- the plan


def test_plan_with_enough_prompts_sends_each_once_and_warms_up_outside_the_measured():
    plan = request_plan(12, samples=5, warmup=2)

    assert plan.levels == ((0, 1, 2, 3, 4),)
    assert plan.measured == (0, 1, 2, 3, 4)
    assert plan.warmup == (5, 6)
    assert not plan.repeats and not plan.warmup_overlaps
    assert plan.describe() == "12 prompts, 2 warm-up, every request a different prompt"


def test_plan_with_fewer_prompts_cycles_and_warms_up_on_the_least_used():
    plan = request_plan(4, samples=6, warmup=1)

    assert plan.measured == (0, 1, 2, 3, 0, 1)
    assert plan.warmup == (2,)  # used once by the measured requests, not twice
    assert plan.repeats and plan.warmup_overlaps
    assert "6 measured requests over 4 prompts; warm-up reuses" in plan.describe()


def test_plan_levels_run_on_through_the_set_or_restart_it():
    distinct = request_plan(12, samples=4, warmup=1, levels=3)
    assert distinct.levels == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11))
    assert distinct.warmup == (0,) and distinct.warmup_overlaps

    same = request_plan(12, samples=4, warmup=1, levels=3, distinct_across_levels=False)
    assert same.levels == ((0, 1, 2, 3),) * 3
    assert same.warmup == (4,) and not same.warmup_overlaps


def test_one_prompt_is_the_seed_design():
    plan = request_plan(1, samples=5, warmup=1)
    assert plan.measured == (0,) * 5 and plan.warmup == (0,)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_prompts": 0, "samples": 1},
        {"n_prompts": 1, "samples": -1},
        {"n_prompts": 1, "samples": 1, "levels": 0},
    ],
)
def test_plan_refuses_nonsense(kwargs):
    with pytest.raises(ValueError):
        request_plan(**kwargs)
