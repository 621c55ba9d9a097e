"""The official side of `rstar2 bench conformance`: run in the official packages' own venv (never imported by the
product), it reads cases as JSONL on stdin and writes one verdict per line on stdout, in order.

Case kinds: "bfcl_ast" (bfcl-eval's `ast_checker`), "bfcl_decode" (bfcl-eval's Qwen function-calling handler: the
`</think>` split of `_parse_query_response_prompting`, then `decode_ast`, then `is_function_calling_format_output`
for AST categories, `is_empty_output` for relevance; and, on the same text, the handler's `decode_execute`, the call
strings the multi-turn categories execute, with `is_empty_execute_response`), "ifeval" (lm-eval's copy of Google's
checker, `lm_eval.tasks.ifeval.utils.process_results`), "gpqa" (simple-evals' `ANSWER_PATTERN_MULTICHOICE`, written
out here: simple-evals is not a package). A case the official code raises on is reported as {"raises": ...}.
"""

import json
import re
import sys

# simple-evals common.py (openai/simple-evals), used by gpqa_eval.py: re.search on the response
GPQA_PATTERN = r"(?i)Answer[ \t]*:[ \t]*\$?([A-D])\$?"
MODEL = "Qwen/Qwen3-8B-FC"  # a Qwen FC model of bfcl-eval's registry (names keep their dots)


def bfcl_ast(case: dict) -> dict:
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    r = ast_checker(case["functions"], case["model_output"], case["possible_answer"], case["language"],
                    case["category"], MODEL.replace("/", "_"))
    return {"valid": bool(r["valid"]), "error_type": r.get("error_type", "")}


def bfcl_decode(case: dict) -> dict:
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import is_empty_execute_response
    from bfcl_eval.model_handler.local_inference.qwen_fc import QwenFCHandler
    from bfcl_eval.utils import is_empty_output, is_function_calling_format_output

    text = case["text"]
    if "</think>" in text:  # _parse_query_response_prompting: what follows the reasoning is the response
        text = text.split("</think>")[-1].lstrip("\n")
    handler = QwenFCHandler.__new__(QwenFCHandler)  # decode_ast and decode_execute read no state
    try:
        decoded = handler.decode_ast(text, case.get("language", "Python"))
        out = {"decoded": [[k, v] for item in decoded for k, v in item.items()],  # a name need not be a string
               "format_ok": is_function_calling_format_output(decoded), "empty": bool(is_empty_output(decoded))}
    except Exception as e:  # noqa: BLE001 - ast_file_runner: "ast_decoder:decoder_failed"
        out = {"decoded": None, "error": f"{type(e).__name__}: {e}"}
    try:  # inference_multi_turn_prompting: a raise or an empty list ends the turn; multi_turn_runner skips the step
        executed = handler.decode_execute(text)
        out |= {"executed": executed, "execute_empty": bool(is_empty_execute_response(executed))}
    except Exception as e:  # noqa: BLE001
        out |= {"executed": None, "execute_error": f"{type(e).__name__}: {e}"}
    return out


def ifeval(case: dict) -> dict:
    import langdetect
    from lm_eval.tasks.ifeval.utils import process_results

    # langdetect samples at random and lm-eval leaves it unseeded: on a text near a language's border its verdict
    # (response_language, and english_capital/english_lowercase's "is it English") changes run to run. Seeded as
    # ours is (eval/benchmarks/ifeval/instructions.py), both sides read the same draw.
    langdetect.DetectorFactory.seed = 0

    doc = {"key": 0, "prompt": case["prompt"], "instruction_id_list": case["instruction_id_list"],
           "kwargs": case["kwargs"]}
    r = process_results(doc, [case["response"]])
    return {"strict": bool(r["prompt_level_strict_acc"]), "loose": bool(r["prompt_level_loose_acc"]),
            "inst_strict": [bool(x) for x in r["inst_level_strict_acc"]],
            "inst_loose": [bool(x) for x in r["inst_level_loose_acc"]]}


def gpqa(case: dict) -> dict:
    m = re.search(GPQA_PATTERN, case["response"])
    return {"letter": m.group(1) if m else None}


KINDS = {"bfcl_ast": bfcl_ast, "bfcl_decode": bfcl_decode, "ifeval": ifeval, "gpqa": gpqa}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--versions":
        from importlib.metadata import PackageNotFoundError, version

        out = {}
        for name in ("bfcl-eval", "lm-eval", "nltk", "langdetect"):
            try:
                out[name] = version(name)
            except PackageNotFoundError:
                pass
        print(json.dumps(out))
        return
    for line in sys.stdin:
        case = json.loads(line)
        try:
            out = KINDS[case["kind"]](case)
        except Exception as e:  # noqa: BLE001 - the official code raises on this case
            out = {"raises": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out, default=repr) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
