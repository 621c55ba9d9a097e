"""BFCL v3 multi-turn: the stateful APIs bfcl_eval ships (file system, trading, travel, ...) and the checker.

The API classes and the two sub-checkers (`state_checker`, `response_checker`) are imported from bfcl_eval.
Its executor is not: it builds call strings, `eval`s them and keeps instances in module globals keyed by model
and item, so two samples of one item would share state. `World` holds fresh instances per conversation and
calls their methods directly with the parsed arguments; results read as BFCL's (str, JSON for dicts,
"Error during execution: ..." on an exception), so the model sees what BFCL would show it.

`check_multi_turn` follows bfcl_eval's `multi_turn_checker`: the model's executed calls and the ground-truth
calls are replayed turn by turn on two fresh worlds; after every turn with ground truth, the model's world must
equal the ground truth's (public attributes of every instance), and every ground-truth result must appear among
the model's results so far (any order). A turn with ground truth but no model call fails; a turn without
ground truth (the request cannot be done yet) is not checked, though its calls still run.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from dataclasses import dataclass
from typing import Any

from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

from .ast_checker import Check
from .decode import call_text

BLOCKED = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")  # as bfcl_eval refuses them
DETAIL_CHARS = 2000  # each state difference, as shown in the report


@dataclass
class Call:
    name: str
    args: tuple = ()
    kwargs: dict[str, Any] | None = None

    def text(self) -> str:
        """The call as BFCL writes it to execute it (decode_execute's strings)."""
        return call_text(self.name, self.kwargs or {}, self.args)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.kwargs or {}, **({"args": list(self.args)} if self.args else {})}


def parse_call(text: str) -> Call:
    """A ground-truth call string such as "mv(source='a', destination='b')" or "sort('f.txt')"."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a function call: {text!r}")
    return Call(node.func.id, tuple(ast.literal_eval(a) for a in node.args),
                {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg})


class World:
    """Fresh instances of an item's API classes, loaded with its initial config."""

    def __init__(self, involved_classes: list[str], initial_config: dict[str, Any], long_context: bool = False):
        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}  # a later class wins a name clash, as in bfcl_eval
        for class_name in involved_classes:
            instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)()
            if class_name not in STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(initial_config.get(class_name, {})), long_context=long_context)
            self.instances[class_name] = instance
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self.methods[name] = method

    def call(self, call: Call) -> str:
        try:
            if call.name in BLOCKED:
                raise PermissionError(f"Function call {call.name} is not allowed.")
            if call.name not in self.methods:
                raise NameError(f"name '{call.name}' is not defined")
            return _text(self.methods[call.name](*call.args, **(call.kwargs or {})))
        except Exception as e:  # noqa: BLE001 - the model is told, as bfcl_eval tells it
            return f"Error during execution: {e}"


def _text(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS] + f"... [{len(text) - DETAIL_CHARS} more]"


def check_multi_turn(model_turns: list[list[Call]], ground_truth: list[list[str]], involved_classes: list[str],
                     initial_config: dict[str, Any], long_context: bool = False) -> Check:
    """`model_turns`: per user turn, the calls the model's conversation executed, in order. `ground_truth`:
    the possible answer's call strings per turn."""
    result = _check(model_turns, ground_truth, involved_classes, initial_config, long_context)
    result.expected = ground_truth
    result.produced = [[c.to_dict() for c in turn] for turn in model_turns]
    return result


def _check(model_turns: list[list[Call]], ground_truth: list[list[str]], involved_classes: list[str],
           initial_config: dict[str, Any], long_context: bool) -> Check:
    if len(model_turns) != len(ground_truth):
        return Check(False, f"Model was force-terminated during inference phase. The length of the model result "
                     f"turns ({len(model_turns)}) does not match the length of the ground truth turns "
                     f"({len(ground_truth)}).", "multi_turn:force_terminated")
    model, truth = (World(involved_classes, initial_config, long_context) for _ in range(2))
    model_results: list[str] = []  # all turns so far: a result the model got earlier counts
    for turn, (calls, expected) in enumerate(zip(model_turns, ground_truth, strict=True)):
        model_results += [model.call(c) for c in calls]
        truth_results = [truth.call(parse_call(c)) for c in expected]
        if not expected:
            continue
        if not calls:
            return Check(False, f"Model response list is empty for turn {turn}",
                         "multi_turn:empty_turn_model_response")
        state = state_checker(model.instances, truth.instances)
        if not state["valid"]:
            diffs = "; ".join(f"{attr}: model {_short(d['model'])} != expected {_short(d['ground_truth'])}"
                              for attr, d in state["details"]["differences"].items())
            return Check(False, f"Turn {turn}: {state['error_message']} {diffs}", state["error_type"])
        response = response_checker(model_results, truth_results, turn)
        if not response["valid"]:
            missing = [_short(m) for m in response["details"]["missing_items"]]
            return Check(False, f"{response['error_message']} Missing: {missing}", response["error_type"])
    return Check(True)
