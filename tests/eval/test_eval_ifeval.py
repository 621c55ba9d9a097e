"""IFEval: every checker family on hand-made responses that must pass and fail (strict and loose), offline (NLTK's
Punkt model from package data, no download), the text that is checked, and the scoring through the real eval path
(a scripted chat endpoint over --api chat, the store, the report, the paper row; the real SmolLM2 once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi import FastAPI

from rstar2_agent.eval.benchmarks import get_benchmark
from rstar2_agent.eval.benchmarks.ifeval.instructions import check, ensure_punkt, final_text, loose_variants
from rstar2_agent.eval.harness import ModelSource, evaluate
from rstar2_agent.eval.paper import paper_row
from rstar2_agent.eval.report import load, write_outputs
from rstar2_agent.eval.runner import EvalConfig
from rstar2_agent.store import Store

from conftest import uvicorn_app

FIXTURE = Path(__file__).resolve().parents[1] / "data"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"

LOWER = "change_case:english_lowercase"
QUOTE = "startend:quotation"

# (instruction, kwargs, response, strict, loose): hand-written, one family after another
CASES = [
    ("keywords:existence", {"keywords": ["turtle", "pond"]}, "A turtle swims in the pond.", True, True),
    ("keywords:existence", {"keywords": ["turtle", "pond"]}, "A turtle swims in the lake.", False, False),
    ("keywords:frequency", {"keyword": "rain", "frequency": 3, "relation": "at least"},
     "Rain, rain, go away; come again another day, rain.", True, True),
    ("keywords:frequency", {"keyword": "rain", "frequency": 3, "relation": "less than"}, "rain rain rain", False,
     False),
    ("keywords:forbidden_words", {"forbidden_words": ["very"]}, "It is quite good.", True, True),
    ("keywords:forbidden_words", {"forbidden_words": ["very"]}, "It is very good.", False, False),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "at least"}, "Zebras zigzag.",
     True, True),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "at least"}, "A zebra.", False,
     False),
    ("language:response_language", {"language": "de"},
     "Das Wetter ist heute sehr schön und wir gehen im Park spazieren.", True, True),
    ("language:response_language", {"language": "de"},
     "The weather is very nice today and we are going for a walk in the park.", False, False),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "less than"}, "Dr. Smith came home.",
     True, True),  # Punkt knows "Dr." is no sentence end: one sentence
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "less than"}, "One. Two. Three.", False,
     False),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First part.\n***\nSecond part.", True, True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "Only one part.", False, False),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, "one two three four five six",
     True, True),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, "too short", False, False),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
     "First we wait.\n\nThen we go.", True, True),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
     "First we wait.\n\nLater we go.", False, False),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Send it to [name] at [address].", True,
     True),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Send it to [name].", False, False),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hello.\n\nP.S. See you soon.", True, True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hello. See you soon.", False, False),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* apples\n* pears", True, True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* a\n* b\n* c\n* d\n* e", False, False),
    ("detectable_format:constrained_response", {}, "My answer is yes.", True, True),
    ("detectable_format:constrained_response", {}, "Probably.", False, False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and *two*", True, True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* only", False, False),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
     "Section 1\nintro\nSection 2\nbody", True, True),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2}, "Section 1\nall",
     False, False),
    ("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', True, True),
    ("detectable_format:json_format", {}, "a: 1", False, False),
    ("detectable_format:title", {}, "<<A Poem>>\nroses", True, True),
    ("detectable_format:title", {}, "A Poem\nroses", False, False),
    ("combination:two_responses", {}, "Cats are great.\n******\nDogs are great.", True, True),
    ("combination:two_responses", {}, "Cats are great.\n******\nCats are great.", False, False),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "Say hi. Hi!", True, True),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "Hi!", False, False),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Done. Any other questions?", True, True),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Any other questions? Done.", False, False),
    (QUOTE, {}, '"Paris"', True, True),
    (QUOTE, {}, "Paris", False, False),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"},
     "This is VERY IMPORTANT.", True, True),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"},
     "This is VERY important.", False, False),
    ("change_case:english_capital", {}, "THIS IS ALL CAPS.", True, True),
    ("change_case:english_capital", {}, "This is not.", False, False),
    (LOWER, {}, "all lowercase here.", True, True),
    (LOWER, {}, "Not all lowercase.", False, False),
    ("punctuation:no_comma", {}, "No commas here.", True, True),
    ("punctuation:no_comma", {}, "Commas, here.", False, False),
    # loose only: a first line the model adds, or markdown bold around the quotes
    (QUOTE, {}, 'Sure, here it is:\n"Paris"', False, True),
    (LOWER, {}, "Here Is My Poem\nsoft rain on the roof", False, True),
    ("detectable_format:json_format", {}, 'Here is the JSON:\n{"a": 1}', False, True),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Done. Any other questions?\n(written by me)",
     False, True),
]


@pytest.mark.parametrize(("instruction", "kwargs", "response", "strict", "loose"), CASES,
                         ids=[f"{c[0]}-{c[3]}-{c[4]}-{i}" for i, c in enumerate(CASES)])
def test_each_checker_passes_and_fails_hand_made_responses(instruction, kwargs, response, strict, loose):
    (result,) = check(response, [instruction], [kwargs], prompt="Say hi.")
    assert (result.strict, result.loose) == (strict, loose)


def test_the_checkers_cover_the_25_instruction_types():
    families = {c[0] for c in CASES}
    assert len(families) == 25
    assert {c[0] for c in CASES if c[3] != c[4]} >= {QUOTE, LOWER, "detectable_format:json_format"}  # loose only
    for instruction in families:  # each is seen both followed and not followed
        assert {c[3] for c in CASES if c[0] == instruction} == {True, False}


def test_an_empty_response_follows_nothing_and_counts():
    results = check("   ", ["punctuation:no_comma", "keywords:forbidden_words"], [{}, {"forbidden_words": ["x"]}], "p")
    assert [(r.strict, r.loose) for r in results] == [(False, False), (False, False)]


def test_none_kwargs_from_the_hubs_merged_struct_are_dropped():
    (r,) = check("one two three", ["length_constraints:number_words"],
                 [{"num_words": 2, "relation": "at least", "keywords": None, "language": None}], "p")
    assert r.strict


def test_an_unknown_instruction_is_an_error_that_names_the_known_ones():
    with pytest.raises(ValueError, match="punctuation:no_comma"):
        check("x", ["punctuation:no_semicolon"], [{}], "p")


def test_loose_variants_are_googles_eight():
    v = loose_variants("first\n*mid*\nlast")
    assert v == ["first\n*mid*\nlast", "first\nmid\nlast", "*mid*\nlast", "first\n*mid*", "*mid*", "mid\nlast",
                 "first\nmid", "mid"]


def test_punkt_comes_from_package_data_not_a_download(tmp_path, monkeypatch):
    import nltk

    root = ensure_punkt()
    assert (root / "tokenizers" / "punkt_tab" / "english" / "abbrev_types.txt").is_file()
    monkeypatch.setattr(nltk, "download", lambda *a, **k: pytest.fail("no download"))
    assert nltk.sent_tokenize("Mr. Smith arrived. He sat down.") == ["Mr. Smith arrived.", "He sat down."]
    assert Path(nltk.data.find("tokenizers/punkt_tab/english/")).is_relative_to(root)


@pytest.mark.parametrize(("text", "checked"), [
    ("plain answer<|im_end|>", "plain answer"),
    ("thinking hard</reason>\n<answer>the answer</answer><|im_end|>", "the answer"),
    ("<think>hmm</think>\n\nfinal words", "final words"),
    ("<answer>first</answer> more <answer>last</answer>", "last"),
    ("<answer>cut off mid", "cut off mid"),
])
def test_the_checked_text_is_what_the_user_is_told(text, checked):
    assert final_text(text) == checked


# ------------------------------------------------------------------------------------------ the eval path
ANSWERS = {  # the scripted model's answer to each fixture prompt: keys 1 and 2 follow everything, 3 only loosely
    "poem about rain": "soft rain falls\non the quiet roof",
    "Describe a cat": "A cat is small.\n***\nIt purrs. Is there anything else I can help with?",
    "capital of France": 'Here you go:\n"Paris"',
    "three fruits": "apple, pear and [fruit]",
}


def scripted_chat() -> FastAPI:
    app = FastAPI()
    app.state.requests = []

    @app.post("/v1/chat/completions")
    async def chat(body: dict) -> dict:
        app.state.requests.append(body)
        prompt = body["messages"][-1]["content"]
        text = next(a for k, a in ANSWERS.items() if k in prompt)
        return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18}}

    return app


async def test_scores_through_the_eval_path_over_a_chat_endpoint(tmp_path):
    app = scripted_chat()
    store = Store(tmp_path / "eval.db")
    async with uvicorn_app(app) as url:
        names = await evaluate(["ifeval"], ModelSource(urls=[url], served_model="scripted"),
                               EvalConfig(api="chat", use_tools=False), store, None, str(FIXTURE))
    # the benchmark's prompt alone, greedy, no tool, one sample each
    assert len(app.state.requests) == 4
    for body in app.state.requests:
        assert [m["role"] for m in body["messages"]] == ["user"] and body["temperature"] == 0 and "tools" not in body
    (result,) = load(store, names["ifeval"])
    f = result.summary["ifeval"]
    # prompts: 1 and 2 follow all, 3 (a line before the quotes) only loosely, 4 (a comma is fine; 1 placeholder) none
    assert (f["prompt_strict"], f["prompt_loose"]) == (0.5, 0.75)
    assert (f["instructions"], f["instruction_strict"], f["instruction_loose"]) == (6, 4 / 6, 5 / 6)
    assert f["per_type"][QUOTE] == {"n": 1, "strict": 0.0, "loose": 1.0}
    assert {s.problem_id: s.correct for s in result.samples} == {"1": True, "2": True, "3": False, "4": False}
    row = paper_row("ifeval", result)
    assert row.score == 50.0 and row.interval.method == "wilson" and row.paper == 83.4
    assert row.interval.lo < 50.0 < row.interval.hi and row.inside  # 4 prompts: a wide interval
    paths = write_outputs(store, names["ifeval"], tmp_path / "out")
    results = json.loads(paths[0].read_text())
    assert results[0]["metrics"]["ifeval"]["prompt_loose"] == 0.75
    html = paths[2].read_text()
    assert "prompt strict" in html and QUOTE in html


@pytest.mark.slow
async def test_the_real_model_answers_two_prompts_and_is_checked(tmp_path, engine):
    store = Store(tmp_path / "eval.db")
    names = await evaluate(["ifeval"], ModelSource(), EvalConfig(max_tokens=24, limit=2, use_tools=False), store, None,
                           str(FIXTURE), engine=engine)
    (result,) = load(store, names["ifeval"])
    assert len(result.samples) == 2 and result.errors == 0
    assert all(s.tokens > 0 and len(s.details["instructions"]) == len(json.loads(s.gold)) for s in result.samples)
    assert result.summary["ifeval"]["instructions"] == 4


@pytest.mark.skipif(not (SHARED / "ifeval.jsonl").is_file(), reason="no IFEval mirror in ../shared/data")
def test_the_full_mirror_loads_and_every_instruction_has_a_checker():
    problems = get_benchmark("ifeval").load(SHARED)
    assert len(problems) == 541
    ids = {i for p in problems for i in p.meta["instruction_id_list"]}
    assert len(ids) == 25
    for p in problems:  # every instruction builds with the row's arguments and checks a response
        assert len(check("a response.", p.meta["instruction_id_list"], p.meta["kwargs"], p.text)) == len(
            p.meta["instruction_id_list"])
