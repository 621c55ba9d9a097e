"""BFCL v3 single-turn checking: AST match of the produced calls against the possible answers, and
relevance / irrelevance by whether a call was made.

A line-by-line port of `bfcl_eval/eval_checker/ast_eval/ast_checker.py` (bfcl-eval 2025.6.8), which cannot be
imported without the package's heavy dependencies (its model registry). Same decision procedure, same error
types: each parameter's possible answers are a list of acceptable values, "" marking it optional; strings
compare after `standardize`; Python ints pass for floats; arrays and tuples have their items type-checked one
level deep, and a failed nested check stays a failure even when the value is a list like the answers; Java and
JavaScript arguments are strings in the language's syntax, converted with bfcl_eval's own type converters
(those import cleanly) before the comparison. Calls are `{"name": ..., "arguments": {...}}`, with the
function's original (dotted) name. The port keeps the official code's lookups (no defaults where it has
none), so it raises where the official checker raises; `check_ast` turns that into a failure, once (CRASH).
`bench/conformance.py` compares this module with the official one case by case.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bfcl_eval.constants.type_mappings import JAVA_TYPE_CONVERSION, JS_TYPE_CONVERSION
from bfcl_eval.eval_checker.ast_eval.type_convertor.java_type_converter import java_type_converter
from bfcl_eval.eval_checker.ast_eval.type_convertor.js_type_converter import js_type_converter

PYTHON_TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list,
                                 "tuple": list, "dict": dict, "any": str}
NESTED_PYTHON = ("array", "tuple")  # their items are type-checked one level deep
NESTED_CONVERTED = ("Array", "ArrayList", "array")  # Java/JS collections converted with their item type
CONVERTERS = {"Java": (JAVA_TYPE_CONVERSION, java_type_converter, "java"),
              "JavaScript": (JS_TYPE_CONVERSION, js_type_converter, "js")}
# Where the official checker raises (a doc without "required", an unknown type, a converter that cannot read the
# value, ...) the leaderboard run stops on that item; we record it as a failure, with this error type.
CRASH = "checker_error:official_checker_raises"


@dataclass
class Check:
    """One graded item. `expected` and `produced` are kept for the report."""
    valid: bool
    error: str = ""
    error_type: str = ""
    expected: Any = None
    produced: Any = None


def _fail(error: str, error_type: str) -> Check:
    return Check(False, error, error_type)


def standardize(s: str) -> str:
    """BFCL's string normalization: drop spaces and ,./-_*^, lower-case, single quotes to double."""
    return re.sub(r"[ \,\.\/\-\_\*\^]", "", s).lower().replace("'", '"')


def _std(v: Any) -> Any:
    return standardize(v) if type(v) is str else v


def _answer_type(possible: list) -> type | None:
    return next((type(a) for a in possible if a != ""), None)


# ------------------------------------------------------------------------------------------ value checks
def _type_check(param: str, value: Any, possible: list, type_name: str, expected: type, nested: type | None
                ) -> tuple[Check | None, bool]:
    """(a failure or None, is_variable). A value of the possible answers' type where the doc says otherwise is
    a variable name (BFCL writes variables as strings); it is then compared as is."""
    answer_type = _answer_type(possible)
    is_variable = answer_type is not None and answer_type != expected
    nested_error = None
    if type(value) is expected:
        if nested is None:
            return None, is_variable
        for item in possible:  # the items must match the inner type against at least one possible answer
            if type(item) is not list or all(
                    _type_check(param, v, item, str(nested), nested, None)[0] is None for v in value):
                return None, is_variable
        nested_error = _fail(f"Nested type checking failed for parameter {param!r}. Expected outer type "
                             f"{type_name} with inner type {nested}. Parameter value: {value!r}.",
                             "type_error:nested")
    if answer_type is not None and type(value) is answer_type:
        return nested_error, True  # a variable; after a failed nested check the official result stays invalid
    return _fail(((nested_error.error + " ") if nested_error else "") + f"Incorrect type for parameter {param!r}. "
                 f"Expected type {type_name}, got {type(value).__name__}. Parameter value: {value!r}.",
                 "type_error:simple"), False


def _string_check(param: str, value: str, possible: list) -> Check | None:
    if standardize(value) not in [standardize(a) for a in possible if type(a) is str]:
        return _fail(f"Invalid value for parameter {param!r}: {value!r}. Expected one of {possible}. "
                     "Case insensitive.", "value_error:string")
    return None


def _list_check(param: str, value: list, possible: list) -> Check | None:
    # BFCL indexes each possible answer, so the optional marker "" stands for the empty list
    if [_std(v) for v in value] not in [[_std(a[j]) for j in range(len(a))] for a in possible]:
        return _fail(f"Invalid value for parameter {param!r}: {value!r}. Expected one of {possible}.",
                     "value_error:list/tuple")
    return None


def _dict_check(param: str, value: dict, possible: list) -> Check | None:
    failure = _fail("", "dict_checker:unclear")
    for answer in possible:
        if answer == "":
            continue
        failure = None
        for key, v in value.items():
            if key not in answer:
                failure = _fail(f"Unexpected dict key parameter: '{key}'.", "value_error:dict_key")
                break
            allowed = [_std(a) for a in answer[key]]
            if _std(v) not in allowed:
                failure = _fail(f"Invalid value for parameter {key!r}: {v!r}. Expected one of {allowed}.",
                                "value_error:dict_value")
                break
        missing = next((k for k, vals in answer.items() if k not in value and "" not in vals), None)
        if missing is not None:  # checked even after a wrong value, as BFCL does: its error type wins
            failure = _fail(f"Missing dict key parameter: '{missing}'.", "value_error:dict_key")
        if failure is None:
            return None
    return failure


def _list_dict_check(param: str, value: list, possible: list) -> Check | None:
    failure = _fail("", "list_dict_checker:unclear")
    for answer in possible:
        if len(value) != len(answer):
            failure = _fail("Wrong number of dictionaries in the list.", "value_error:list_dict_count")
            continue
        failure = next((f for i in range(len(value)) if (f := _dict_check(param, value[i], [answer[i]]))), None)
        if failure is None:
            return None
    return failure


def _convert(param: str, value: Any, doc: dict, language: str) -> tuple[Check | None, Any, type, type | None]:
    """Java/JavaScript: the string the model wrote -> a Python value, with BFCL's converters (which raise on
    some shapes: the official checker then raises too)."""
    mapping, converter, tag = CONVERTERS[language]
    type_name = doc["type"]
    expected = mapping[type_name]
    if type(value) is not str:
        return _fail(f"Incorrect type for parameter {param!r}. Expected type String, got {type(value).__name__}. "
                     f"Parameter value: {value!r}.", f"type_error:{tag}"), value, expected, None
    if type_name in NESTED_CONVERTED:
        nested_name = doc["items"]["type"]
        return None, converter(value, type_name, nested_name), expected, mapping[nested_name]
    return None, converter(value, type_name), expected, None


# ------------------------------------------------------------------------------------------ one call
def check_call(doc: dict, call: dict, answer: dict, language: str = "Python") -> Check:
    """One produced call against one possible answer `{name: {param: [acceptable values]}}` of function `doc`.
    Raises where BFCL's `simple_function_checker` raises."""
    possible = list(answer.values())[0]
    name = doc["name"]
    details: dict = doc["parameters"]["properties"]
    required = doc["parameters"]["required"]
    if call["name"] != name:
        return _fail(f"Function name {name!r} not found in model output.", "simple_function_checker:wrong_func_name")
    args: dict = call["arguments"]
    for param in required:
        if param not in args:
            return _fail(f"Missing required parameter: {param!r}.", "simple_function_checker:missing_required")
    for param, value in args.items():
        if param not in details or param not in possible:
            return _fail(f"Unexpected parameter: {param!r}.", "simple_function_checker:unexpected_param")
        type_name = details[param]["type"]
        nested = None
        if language in CONVERTERS:
            failure, value, expected, nested = _convert(param, value, details[param], language)
            if failure:
                return failure
        elif language == "Python":
            expected = PYTHON_TYPES[type_name]
            if type_name in NESTED_PYTHON:
                nested = PYTHON_TYPES[details[param]["items"]["type"]]
        else:
            raise ValueError(f"BFCL checks Python, Java and JavaScript, not {language!r}")
        if type_name == "tuple" and type(value) is tuple:
            value = list(value)
        if language == "Python" and type_name == "float" and type(value) is int:
            value = float(value)
        failure, is_variable = _type_check(param, value, possible[param], type_name, expected, nested)
        if failure:
            return failure
        if not is_variable:
            special = (_dict_check if expected is dict else _list_dict_check if expected is list and nested is dict
                       else _string_check if expected is str else _list_check if expected is list else None)
            if special is not None:
                if failure := special(param, value, possible[param]):
                    return failure
                continue
        if value not in possible[param]:
            return _fail(f"Invalid value for parameter {param!r}: {value!r}. Expected one of {possible[param]}.",
                         "value_error:others")
    for param, values in possible.items():
        if param not in args and "" not in values:
            return _fail(f"Optional parameter {param!r} not provided and not marked as optional.",
                         "simple_function_checker:missing_optional")
    return Check(True)


# ------------------------------------------------------------------------------------------ categories
def _doc(functions: list[dict], name: str) -> dict | None:
    return next((f for f in functions if f["name"] == name), None)


def check_ast(functions: list[dict], calls: list[dict], answers: list[dict], category: str,
              language: str = "Python") -> Check:
    """The produced calls against an item's possible answers, as BFCL's `ast_checker` for `category`:
    parallel categories in any order, multiple categories one call chosen among several functions, simple ones
    the item's first function. A case the official checker raises on is a failure (CRASH)."""
    try:
        result = _check_ast(functions, calls, answers, category, language)
    except Exception as e:  # noqa: BLE001 - the official checker raises here too: the leaderboard has no pass
        result = _fail(f"The official checker (bfcl-eval 2025.6.8) raises on this case ({type(e).__name__}: {e}); "
                       "counted as a failure.", CRASH)
    result.expected, result.produced = answers, calls
    return result


def _check_ast(functions: list[dict], calls: list[dict], answers: list[dict], category: str, language: str
               ) -> Check:
    if "parallel" in category:
        if len(calls) != len(answers):
            return _fail("Wrong number of functions.", "parallel_function_checker_no_order:wrong_count")
        return _check_any_order(functions, calls, answers, language)
    if "multiple" in category:
        if len(calls) != len(answers):
            return _fail("Wrong number of functions.", "multiple_function_checker:wrong_count")
        return check_call(_doc(functions, list(answers[0].keys())[0]), calls[0], answers[0], language)
    if len(calls) != 1:
        return _fail("Wrong number of functions.", "simple_function_checker:wrong_count")
    return check_call(functions[0], calls[0], answers[0], language)


def _check_any_order(functions: list[dict], calls: list[dict], answers: list[dict], language: str) -> Check:
    matched: set[int] = set()
    for i, answer in enumerate(answers):
        doc = _doc(functions, list(answer.keys())[0])
        errors = []
        for j, call in enumerate(calls):
            if j in matched:
                continue
            result = check_call(doc, call, answer, language)
            if result.valid:
                matched.add(j)
                break
            errors.append(f"model call {j}: {result.error}")
        else:
            left = [j for j in range(len(calls)) if j not in matched]
            return _fail(f"Could not find a matching function among index {left} of model output for index {i} of "
                         f"possible answers. " + " ".join(errors),
                         "parallel_function_checker_no_order:cannot_find_match")
    return Check(True)


def check_relevance(calls: list[dict], category: str) -> Check:
    """Irrelevance: valid when no call was made; relevance: valid when one was (any call, right or wrong)."""
    made = bool(calls)
    if "irrelevance" in category:
        result = Check(True) if not made else _fail("Valid syntax. Successfully decode AST when it should not.",
                                                    "irrelevance_error:decoder_success")
    else:
        result = Check(True) if made else _fail("Invalid syntax. Failed to decode AST when it should have.",
                                                "relevance_error:decoder_failed")
    result.produced = calls
    return result
