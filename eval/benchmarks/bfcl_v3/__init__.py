"""BFCL v3: the Berkeley Function Calling Leaderboard, 17 categories (non-live, live, multi-turn).

The model sees the item's functions as tools in our chat format's <tools> block and calls them in the Hermes
format; the agent loop's parser runs them, but scoring reads the raw text as the leaderboard's handler does
(decode.py). Function docs become OpenAI tool schemas as bfcl_eval prepares
them for function-calling models: a language hint in the description, BFCL types mapped to JSON schema
types, Java/JavaScript parameters as strings in the language's syntax, dots in names replaced by
underscores (mapped back before checking). Single-turn items are one assistant turn, checked by AST match
(or by whether a call was made, for relevance/irrelevance); multi-turn items run every user turn as one
agent call that continues the conversation, each step's calls read as the handler's decode_execute reads them
(step_calls: every call run, none when it fails, which ends the turn) and executed on the item's stateful APIs,
then replayed and checked by state and response as BFCL does. Scoring: data.py, ast_checker.py and multi_turn.py
beside this file.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from rstar2_agent.tool_calls import ToolCall
from rstar2_agent.trajectory import Trajectory, Turn

from ..base import REASONING_BUDGET, Benchmark, Context, DataError, Outcome, Problem, RunDefaults, sample_seed

try:
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    from . import data as bfcl
    from .ast_checker import Check
    from .decode import decode, execute_calls, response_text
    from .multi_turn import Call, World
except ImportError as e:  # bfcl-eval is not installed: the benchmark says how to get it when it is used
    bfcl = None  # type: ignore[assignment]
    _MISSING = e

SYSTEM = "You are a helpful assistant with access to functions. Call them when they help with the user's request."
HINTS = {"Java": " Note that the provided function is in Java 8 SDK syntax.",
         "JavaScript": " Note that the provided function is in JavaScript syntax.",
         "Python": " Note that the provided function is in Python 3 syntax."}
GROUPS = {"all": None, "non_live": "NON_LIVE", "live": "LIVE", "multi_turn": "MULTI_TURN",
          "single_turn": "NON_LIVE+LIVE"}
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")


def _require_bfcl() -> None:
    if bfcl is None:
        raise DataError(f"BFCL v3 needs the bfcl-eval package ({_MISSING}); install it without its heavy "
                        "dependencies: pip install --no-deps bfcl-eval==2025.6.8")


def expand_categories(categories: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """Category names or groups (all, non_live, live, multi_turn, single_turn), as a list or a comma string."""
    _require_bfcl()
    names = categories.split(",") if isinstance(categories, str) else list(categories or ["all"])
    out: list[str] = []
    for name in (n.strip() for n in names if n.strip()):
        if name in GROUPS:
            group = GROUPS[name]
            out += bfcl.CATEGORIES if group is None else [c for g in group.split("+") for c in getattr(bfcl, g)]
        elif name in bfcl.CATEGORIES:
            out.append(name)
        else:
            raise DataError(f"unknown BFCL v3 category {name!r}; choose from {', '.join([*GROUPS, *bfcl.CATEGORIES])}")
    return tuple(dict.fromkeys(out))


# ------------------------------------------------------------------------------------------ tool schemas
def _json_types(schema: dict[str, Any]) -> dict[str, Any]:
    """BFCL types (dict, float, tuple, any, ...) -> JSON schema types, recursively; floats say so."""
    kind = schema.get("type")
    if kind == "float":
        schema["format"] = "float"
        schema["description"] = schema.get("description", "") + " This is a float type value."
    schema["type"] = GORILLA_TO_OPENAPI.get(kind, "string") if isinstance(kind, str) else "string"
    for sub in (schema.get("properties") or {}).values():
        _json_types(sub)
    if isinstance(schema.get("items"), dict):
        _json_types(schema["items"])
    return schema


def _as_strings(props: dict[str, Any], lang: str) -> None:
    """Java/JavaScript parameters are strings in the language's syntax (bfcl_eval's pre-processing)."""
    for value in props.values():
        kind = value["type"]
        desc = value.get("description", "")
        if kind == "any":
            desc += f" This parameter can be of any type of {lang} object in string representation."
        else:
            desc += f" This is {lang} {kind} type parameter in string representation."
        if kind in (("ArrayList", "Array") if lang == "Java" else ("array",)):
            desc += f" The list elements are of type {value['items']['type']}; they are not in string representation."
            value.pop("items", None)
        if lang == "JavaScript" and kind == "dict" and "properties" in value:
            desc += (" The dictionary entries have the following schema; they are not in string representation. "
                     + json.dumps(value.pop("properties")))
        value["description"], value["type"] = desc, "string"


def tool_schema(doc: dict[str, Any], category: str) -> dict[str, Any]:
    """One BFCL function doc -> an OpenAI tool, the way bfcl_eval prepares it for function-calling models."""
    fn = copy.deepcopy(doc)
    lang = bfcl.language(category)
    fn["description"] = fn.get("description", "") + HINTS[lang]
    params = fn.setdefault("parameters", {})
    props = params.setdefault("properties", {})
    if lang != "Python":
        _as_strings(props, lang)
    fn["name"] = fn["name"].replace(".", "_")
    params["type"] = "object"
    for prop in props.values():
        _json_types(prop)
    return {"type": "function", "function": fn}


def tools_for(functions: list[dict[str, Any]], category: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The tools and the map from the names the model sees back to the functions' names."""
    tools = [tool_schema(f, category) for f in functions]
    return tools, {t["function"]["name"]: f["name"] for t, f in zip(tools, functions, strict=True)}


# ------------------------------------------------------------------------------------------ conversation
def with_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The item's own system prompt when it has one (live items), else ours; the tools are appended to it."""
    if messages and messages[0].get("role") == "system":
        return list(messages)
    return [{"role": "system", "content": SYSTEM}, *messages]


def continuation(traj: Trajectory, eos: str | None = None) -> list[dict[str, Any]]:
    """An agent call's turns as OpenAI messages: assistant (text, tool_calls), then one tool message per call."""
    out: list[dict[str, Any]] = []
    for turn in traj.turns:
        named = [c for c in turn.tool_calls if c.name]
        text = turn.text
        for c in named:  # the calls go in tool_calls; a chat API's raw is not in the text
            text = text.replace(c.raw, "", 1) if c.raw.startswith("<tool_call>") else text
        for end in (eos, *END_TOKENS):
            if end and text.rstrip().endswith(end):
                text = text.rstrip()[: -len(end)]
        msg: dict[str, Any] = {"role": "assistant", "content": text.strip()}
        if named:
            msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}} for c in named]
        out.append(msg)
        out += [{"role": "tool", "tool_call_id": c.id, "content": c.response} for c in turn.tool_calls]
    return out


def merge(trajs: list[Trajectory]) -> Trajectory:
    """One trajectory for a multi-turn conversation: every agent call's turns; ids of the last call (its prompt
    holds the conversation before it); times summed."""
    last = trajs[-1]
    timings = {k: sum(t.timings.get(k, 0.0) for t in trajs) for k in last.timings}
    turns: list[Turn] = [t for tr in trajs for t in tr.turns]
    error = next((t.error for t in trajs if t.error), None)
    return dataclasses.replace(last, turns=turns, timings=timings, error=error)


# BFCL's handlers decode every call of a response; the formats' own caps (Hermes 8, the release's 1, which verl
# kept for its one Python tool) would cut the parallel categories short.
CALLS_PER_TURN = 64


def step_calls(text: str) -> list[ToolCall]:
    """One step of a multi-turn conversation read as BFCL's inference loop reads it (decode.py): the calls of
    `decode_execute` on the response after the reasoning, each one run (no schema check, no cap: BFCL evals them
    all); none where it raises or finds none, which ends the user turn."""
    try:
        calls = execute_calls(response_text(text))
    except Exception:  # noqa: BLE001 - inference_multi_turn_prompting: "Failed to decode ... Proceed to next turn"
        return []
    return [ToolCall(name if isinstance(name, str) else str(name), args, raw) for name, args, raw in calls]


async def _not_executed(name: str, arguments: dict[str, Any]) -> str:
    return "(single-turn evaluation: the call is recorded, not run)"


# ------------------------------------------------------------------------------------------ benchmark
class BFCLv3(Benchmark):
    name = "bfcl_v3"
    file = "BFCL_v3_simple.json"
    # As the leaderboard runs it (bfcl_eval 2025.6.8, _llm_response_generation.py and base_oss_handler.py): one
    # greedy sample per item (its --temperature default 0.001, i.e. greedy; we use 0), no nucleus cut, and at most
    # min(4096, context left) tokens a generation; ours is base.py REASONING_BUDGET, for a model that reasons first
    # (--max-tokens 4096 for the leaderboard's). Our budget is per agent call, so for a multi-turn item it bounds
    # all the steps of one user turn together, where BFCL caps each step. max_turns is not used: single-turn items
    # get one assistant turn, multi-turn ones BFCL's 20 steps (+1) per user turn.
    defaults = RunDefaults(n=1, temperature=0.0, top_p=1.0, max_tokens=REASONING_BUDGET, max_turns=30)
    checker = {"checker": "QwenFCHandler.decode_ast, decode_execute and ast_checker, ported (decode.py, "
                          "ast_checker.py)",
               "official": "bfcl-eval 2025.6.8",
               "conformance": "AST 5,000/5,000, raw decoding 5,000/5,000, multi-turn decoding 5,000/5,000 "
                              "(rstar2 bench conformance, seed 0)"}

    def __init__(self, categories: str | list[str] | tuple[str, ...] | None = None):
        self.categories = expand_categories(categories) if bfcl is not None else ()

    def load(self, data_dir: str | os.PathLike | None = None, limit: int | None = None) -> list[Problem]:
        """Every selected category from the installed bfcl_eval package (or `data_dir` when it holds the
        BFCL_v3 files); `limit` applies per category."""
        _require_bfcl()
        problems = []
        for category in self.categories:
            root = Path(data_dir) if data_dir and (Path(data_dir) / f"BFCL_v3_{category}.json").is_file() else None
            items = bfcl.load_items(category, root)
            problems += [self.problem(item, category) for item in (items[:limit] if limit else items)]
        return problems

    def problem(self, item: dict[str, Any], category: str) -> Problem:  # type: ignore[override]
        turns = item["question"]
        first = next((m["content"] for m in turns[0] if m.get("role") == "user"), "") if turns and turns[0] else ""
        meta = {"category": category, "functions": item["function"], "turns": turns,
                "ground_truth": item.get("ground_truth")}
        if category in bfcl.MULTI_TURN:
            meta |= {"initial_config": item["initial_config"], "involved_classes": item["involved_classes"],
                     "missed_function": item.get("missed_function", {})}
        return Problem(item["id"], first, json.dumps(item.get("ground_truth"), ensure_ascii=False), self.name,
                       meta=meta)

    async def run(self, problem: Problem, sample_index: int, ctx: Context) -> Outcome:
        _require_bfcl()
        if problem.meta["category"] in bfcl.MULTI_TURN:
            return await self._multi_turn(problem, sample_index, ctx)
        return await self._single_turn(problem, sample_index, ctx)

    async def _single_turn(self, problem: Problem, sample_index: int, ctx: Context) -> Outcome:
        meta = problem.meta
        category = meta["category"]
        tools, names = tools_for(meta["functions"], category)
        traj = await ctx.agent(with_system(meta["turns"][0]), tools=tools, max_turns=1, execute=_not_executed,
                               max_calls=CALLS_PER_TURN, seed=sample_seed(ctx.seed, problem.id, sample_index),
                               problem_prefix=False)
        # scored as the leaderboard reads the raw text (decode.py), not as the agent loop's parser read it
        text = traj.turns[0].text if traj.turns else ""
        decoded = decode(text)
        calls = [{"name": names.get(c["name"], c["name"]) if isinstance(c["name"], str) else c["name"],
                  "arguments": c["arguments"]} for c in decoded.calls]
        if bfcl.is_relevance(category):
            check = bfcl.grade_single_turn(category, meta["functions"], calls if decoded.made_call else [])
        elif decoded.error is not None:
            check = Check(False, f"Invalid syntax. Failed to decode AST. {decoded.error}", "ast_decoder:decoder_failed",
                          meta["ground_truth"], calls)
        else:
            check = bfcl.grade_single_turn(category, meta["functions"], calls, meta["ground_truth"])
        details = {"category": category, "error": check.error, "expected": check.expected, "produced": calls}
        if decoded.error is not None:
            details["unreadable"] = response_text(text)
        return self._outcome(traj, check, calls, problem, details)

    async def _multi_turn(self, problem: Problem, sample_index: int, ctx: Context) -> Outcome:
        meta = problem.meta
        category = meta["category"]
        world = World(meta["involved_classes"], meta["initial_config"], "long_context" in category)
        functions = list(meta["functions"])
        eos = getattr(ctx.extra.get("fmt"), "eos_text", None)
        messages: list[dict[str, Any]] = with_system([])
        executed: list[list[Call]] = []
        trajs: list[Trajectory] = []
        turn_log: list[dict[str, Any]] = []
        for t, user in enumerate(meta["turns"]):
            if str(t) in meta["missed_function"]:  # the held-out functions arrive with a fixed user turn
                functions += meta["missed_function"][str(t)]
                user = [{"role": "user", "content": bfcl.ADDED_FUNCTIONS_PROMPT}]
            tools, names = tools_for(functions, category)
            calls: list[Call] = []
            results: list[str] = []

            async def execute(name: str, arguments: dict[str, Any], calls=calls, results=results, names=names) -> str:
                call = Call(names.get(name, name), (), dict(arguments))
                calls.append(call)
                results.append(world.call(call))
                return results[-1]

            messages += user
            traj = await ctx.agent(messages, tools=tools, max_turns=bfcl.MAX_STEPS + 1, execute=execute,
                                   max_calls=CALLS_PER_TURN, read_calls=step_calls,
                                   seed=sample_seed(ctx.seed, f"{problem.id}/{t}", sample_index), problem_prefix=False)
            messages += continuation(traj, eos)
            trajs.append(traj)
            executed.append(calls)
            turn_log.append({"user": " ".join(m.get("content", "") for m in user),
                             "calls": [c.to_dict() for c in calls], "results": [r[:500] for r in results],
                             "stop_reason": traj.stop_reason})
            if traj.stop_reason in ("max_turns", "engine_error"):  # BFCL force-quits after too many steps
                break
        check = bfcl.grade_multi_turn(category, meta, executed)
        details = {"category": category, "error": check.error, "expected": check.expected,
                   "produced": check.produced, "turns": turn_log}
        return self._outcome(merge(trajs), check, check.produced, problem, details)

    @staticmethod
    def _outcome(traj: Trajectory, check: Check, produced: Any, problem: Problem, details: dict) -> Outcome:
        reason = "engine_error" if traj.stop_reason == "engine_error" else check.error_type or None
        return Outcome(traj, check.valid, json.dumps(produced, ensure_ascii=False), problem.answer,
                       None if check.valid else reason, details)
