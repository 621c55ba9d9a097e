"""tool_choice "required" and a named function as a decoding constraint: the calls are forced, not asked for.

`tool_call_constraint(tools, choice, parallel, text_tokens=0)` returns a `SamplingParams.constraint`
(engines/base.py): `{"structural_tag": <an xgrammar structural tag, as a dict>}`. An engine with `constrains`
(the in-process vllm engine) hands it to vLLM's structured outputs, `StructuredOutputsParams(structural_tag=...)`
(vllm/sampling_params.py), which compiles it with xgrammar's `GrammarCompiler.compile_structural_tag`
(vllm/v1/structured_output/backend_xgrammar.py) and masks each step's logits to what it still allows.

The calls are Hermes calls, as every format writes them (chat_format.HermesFormat.render_call; the rStar2
formats use the same syntax): `<tool_call>\\n{"name": "<name>", "arguments": {...}}\\n</tool_call>`. The tag is

    sequence[
      tag(begin="", content=any_text(max_tokens=text_tokens), end="<tool_call>"),  # free text, then a call opens
      or[tag(begin='\\n{"name": "<name>", "arguments": ', content=json_schema(<parameters>),
             end='}\\n</tool_call>') for each allowed tool],                      # the first call, its arguments
      repeat[0, max_calls - 1][sequence["\\n", or[the same calls, "<tool_call>" in front]]],  # parallel: more
    ]

- The model may write up to `text_tokens` tokens of free text before the first call (its reasoning: an rStar2
  format's response opens inside `<reason>`, a template model may write `<think>`); then `<tool_call>` is the only
  thing left to write (xgrammar enforces an any_text's `max_tokens` in the token mask that vLLM applies).
  `text_tokens=0`: the call comes first, as vLLM's own tool_choice "required" does; None: no bound, and then the
  call is not forced within the response budget (the model cannot end its turn without one, but it can write text
  until `max_tokens`: finish "length", no call).
- Each call's arguments fit that tool's JSON Schema (xgrammar's JSON Schema support: properties in the declared
  order, no properties beyond those declared unless the schema allows them), with at most JSON_WHITESPACE
  whitespace characters in a row between JSON tokens (a bound on a degenerate run of blank lines, room for
  indented JSON; whitespace inside strings is not limited).
- After the call(s) the structural tag is complete, and only then does vLLM allow the end-of-turn ids (the request's
  EOS and stop_token_ids override the matcher's stop tokens): no text after the calls, and none between them.
- "required" with `parallel` false and a named function (whatever `parallel` says, as vLLM and xgrammar's own tool
  tags do): exactly one call; "required" with `parallel`: one to `max_calls` calls (None: no bound), separated by a
  newline. Pass the calls a turn may run (HermesFormat.max_calls_per_turn, 8): a small model, once calling, tends
  to call again and again until its budget ends (measured on SmolLM2-135M), and calls past the cap are not run.

Named limitation (measured on xgrammar 0.2.8, tests/serve/test_tool_constraints.py): xgrammar's own form for a required
call, `triggered_tags` with `at_least_one=True` (what its builtin `get_model_structural_tag(..., tool_choice=
"required")` builds), accepts no text before the first tag: its free text is only allowed after the first tag.
So that form would force the call first; the sequence above (a text region that ends at `<tool_call>`, which is
how xgrammar's builtin tags write a reasoning block) is what allows free text before a forced call.
"""

from __future__ import annotations

import json
import re
from typing import Any

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "}\n</tool_call>"  # the `}` closes the call's object, after the arguments' own
SEPARATOR = "\n"  # between parallel calls
JSON_WHITESPACE = 16  # most whitespace characters in a row between JSON tokens of the arguments


def tool_call_constraint(tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool = True, *,
                         text_tokens: int | None = 0, max_calls: int | None = None) -> dict[str, Any]:
    """The decoding constraint (SamplingParams.constraint) that forces `choice`'s tool call(s): `choice` is "required"
    (one or more calls of any of `tools`; exactly one when `parallel` is false) or an OpenAI named tool choice,
    {"type": "function", "function": {"name": ...}} (exactly one call of that function). `tools`: OpenAI tools
    ({"type": "function", "function": {"name", "parameters"}}) or bare functions ({"name", "parameters"}).
    `text_tokens`: the most tokens of free text before the first call (0: none; None: no bound, see the module's
    docstring); `max_calls`: the most calls of a parallel "required" (None: no bound). Raises ValueError, saying what
    to send instead, for any other choice or a name not in `tools`."""
    functions = _functions(tools)
    name = named_function(choice)
    if name is not None:
        if name not in functions:
            raise ValueError(f"tool_choice names the function {name!r}, which is not in tools ({', '.join(functions)}):"
                             " name one of them, or send its definition in tools")
        functions = {name: functions[name]}
    elif choice != "required":
        raise ValueError(f'a constraint is built for tool_choice "required" or a named function, not {choice!r}; '
                         '"auto" and "none" need none')
    if text_tokens is not None and text_tokens < 0:
        raise ValueError(f"text_tokens is a number of tokens (0: the call comes first), not {text_tokens}")
    if max_calls is not None and max_calls < 1:
        raise ValueError(f"max_calls is at least 1 (a forced call), not {max_calls}")
    first = [_call(n, p, begin="") for n, p in functions.items()]
    elements = [_text(text_tokens), {"type": "or", "elements": first}]
    if parallel and name is None and max_calls != 1:
        more = [_call(n, p, begin=CALL_OPEN) for n, p in functions.items()]
        another = {"type": "sequence", "elements": [{"type": "const_string", "value": SEPARATOR},
                                                    {"type": "or", "elements": more}]}
        elements.append({"type": "star", "content": another} if max_calls is None else
                        {"type": "repeat", "min": 0, "max": max_calls - 1, "content": another})
    return {"structural_tag": {"type": "structural_tag", "format": {"type": "sequence", "elements": elements}}}


def _functions(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each tool's name -> its parameters' JSON Schema (an object with no properties when it declares none, as
    tool_calls.validate_arguments reads it)."""
    out: dict[str, dict[str, Any]] = {}
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f'each tool is {{"type": "function", "function": {{"name": ..., "parameters": {{...}}}}}};'
                             f" got {t!r:.200}")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise ValueError(f"the parameters of {fn['name']!r} must be a JSON Schema object, got {params!r:.200}")
        _check(fn["name"], params)
        out[fn["name"]] = params
    if not out:
        raise ValueError("tool_choice needs tools: send the functions it chooses from in tools")
    return out


def _check(name: str, parameters: dict[str, Any]) -> None:
    """Raise ValueError when xgrammar cannot compile a call of `name` (a schema feature it lacks, a dangling $ref),
    naming the tool and xgrammar's reason; vLLM would otherwise fall back to its guidance backend, which cannot read
    this form of structural tag, and fail with an unrelated message. Without xgrammar (no vLLM here) nothing is
    checked: no engine here can take the constraint."""
    try:
        import xgrammar
    except ImportError:
        return
    tag = {"type": "structural_tag", "format": _call(name, parameters, begin=CALL_OPEN)}
    try:
        xgrammar.Grammar.from_structural_tag(json.dumps(tag, ensure_ascii=False))
    except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError from C++ with the reason in its text
        reason = re.sub(r"^\[[^]]*\] \S+: ", "", str(e).strip())  # "[time] file.cc:line: " before the reason
        raise ValueError(f"the parameters of {name!r} cannot constrain decoding ({reason}): use the JSON Schema "
                         "features xgrammar supports, or tool_choice \"auto\"") from e


def named_function(choice: Any) -> str | None:
    """The function an OpenAI named tool choice names, else None."""
    fn = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(fn, dict) and choice.get("type") == "function" and isinstance(fn.get("name"), str):
        return fn["name"]
    return None


def _text(text_tokens: int | None) -> dict[str, Any]:
    """Free text up to the first `<tool_call>` (the tag's end: the text region stops where it first occurs)."""
    content: dict[str, Any] = {"type": "any_text"}
    if text_tokens is not None:
        content["max_tokens"] = text_tokens
    return {"type": "tag", "begin": "", "content": content, "end": CALL_OPEN}


def _call(name: str, parameters: dict[str, Any], begin: str) -> dict[str, Any]:
    """One Hermes call of `name` after `begin`, as HermesFormat.render_call writes it (the name JSON-escaped), its
    arguments fitting `parameters`."""
    opening = f'{begin}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '
    return {"type": "tag", "begin": opening,
            "content": {"type": "json_schema", "json_schema": parameters, "max_whitespace_cnt": JSON_WHITESPACE},
            "end": CALL_CLOSE}
