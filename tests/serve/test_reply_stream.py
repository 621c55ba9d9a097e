"""The reply parser that both forms of a chat response use (serve/reply_stream.py): recorded replies of every
profile, cut at every boundary and at seeded random ones, reassemble to the whole reply; and the whole reply is the
split each format asks for."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rstar2_agent.paper_format import PAPER_SCHEMA
from rstar2_agent.serve.reply_stream import Delta, ReplyParser, parse_reply, reply_of, starts_in_reasoning

REPLIES = json.loads((Path(__file__).parents[1] / "data" / "replies.json").read_text())
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
               "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
           {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
TOOLS = {"weather": WEATHER, "python": [PAPER_SCHEMA], "none": None, "loop": None}
RANDOM_CUTS = 200  # seeded random cuttings of each reply, into 2 to 12 pieces


def parser(case: dict) -> ReplyParser:
    return ReplyParser(case["profile"], case.get("start_in_reasoning", False), tools=TOOLS[case["tools"]],
                       parallel=case.get("parallel", True), calls_as_reasoning=case["tools"] == "loop")


def replay(case: dict, pieces_per_turn: list[list[str]]) -> list[Delta]:
    p, deltas = parser(case), []
    for k, pieces in enumerate(pieces_per_turn):
        for piece in pieces:
            deltas += p.feed(piece)
        deltas += p.end_turn() if k < len(pieces_per_turn) - 1 else p.finish()
    return deltas


def shape(reply) -> tuple:
    return reply.content, reply.reasoning, [(c["name"], c["arguments"]) for c in reply.calls]


def cut(text: str, at: list[int]) -> list[str]:
    bounds = [0, *sorted(at), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@pytest.mark.parametrize("case", REPLIES, ids=[c["name"] for c in REPLIES])
def test_the_whole_reply_is_the_profiles_split(case):
    whole = parse_reply(case["turns"], parser(case))
    expect = case["expect"]
    assert shape(whole) == (expect["content"], expect["reasoning"], [tuple(c) for c in expect["calls"]])
    assert all(c["id"].startswith("call_") for c in whole.calls) and len({c["id"] for c in whole.calls}) == len(
        whole.calls)


@pytest.mark.parametrize("case", REPLIES, ids=[c["name"] for c in REPLIES])
def test_every_cutting_of_the_stream_reassembles_to_the_whole_reply(case):
    """Each turn cut once at every character boundary, into single characters, and at seeded random boundaries."""
    turns = case["turns"]
    whole = shape(reply_of(replay(case, [[t] for t in turns])))
    cuttings = [[[t[:k], t[k:]] if j == i else [t] for j, t in enumerate(turns)]
                for i, turn in enumerate(turns) for k in range(len(turn) + 1)]
    cuttings.append([list(t) for t in turns])
    rng = random.Random(f"reply-stream/{case['name']}")
    for _ in range(RANDOM_CUTS):
        cuttings.append([cut(t, rng.sample(range(1, len(t)), min(len(t) - 1, rng.randint(1, 11)))) for t in turns])
    mismatches = []
    for pieces in cuttings:
        deltas = replay(case, pieces)
        check_stream_shape(deltas)
        if shape(reply_of(deltas)) != whole:
            mismatches.append([p for p in pieces])
    print(f"{case['name']}: {len(cuttings)} cuttings, {len(mismatches)} mismatches")  # docs/results.md (pytest -s)
    assert not mismatches, f"{len(mismatches)} of {len(cuttings)} cuttings differ, e.g. {mismatches[0]}"


def check_stream_shape(deltas: list[Delta]) -> None:
    """As a client reads a stream: each call announced once, in index order, before its argument fragments."""
    announced = []
    for d in deltas:
        if d.kind == "call":
            assert d.index == len(announced) and d.name and d.id
            announced.append(d.index)
        elif d.kind == "arguments":
            assert announced and d.index == announced[-1] and d.text
        else:
            assert d.text


def test_arguments_stream_before_the_call_ends():
    """The first argument fragment comes with the text that holds it, not at </tool_call>."""
    p = ReplyParser("hermes", tools=WEATHER)
    assert p.feed("<tool_call>\n{\"name\": \"get_wea") == []
    first = p.feed("ther\", \"arguments\": {\"ci")
    assert [(d.kind, d.name or d.text) for d in first] == [("call", "get_weather"), ("arguments", "{\"ci")]
    assert [(d.kind, d.text) for d in p.feed("ty\": \"Rome\"}")] == [("arguments", "ty\": \"Rome\"}")]
    assert p.feed("}\n</tool_call>") == [] and p.finish() == []


def test_a_reply_starts_in_reasoning_when_its_prompt_opened_a_block():
    assert starts_in_reasoning("<|im_start|>assistant\n<reason>")
    assert starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n")
