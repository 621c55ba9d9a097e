"""`rstar2 bench conformance`: every checker's verdicts against the official implementation's, case by case.

The official packages go in venvs of their own under $RSTAR2_HOME/conformance (built once, pinned: OFFICIAL), so
their pins never touch the product's. A seeded corpus per checker (BFCL AST: mutations of the calls that bfcl-eval's
bundled possible answers describe; BFCL raw decoding: raw-text variants of those calls, read by the handler's
`decode_ast` (single-turn, row bfcl_decode) and its `decode_execute` (multi-turn, row bfcl_execute); IFEval:
synthesized responses to the IFEval prompts; GPQA: answers in the forms models write) is run by the official code in
its venv (bench/conformance_official.py, JSONL in and out) and by ours in-process. Every disagreement is classified;
a class in EXPLAINED is a documented difference, anything else fails the run. GPQA is compared twice: our own
reading (row gpqa) and our code under `--gpqa-extraction simple-evals` (row gpqa_simple_evals), which must agree on
every case.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from rstar2_agent.models import rstar2_home

OFFICIAL = {"bfcl": ["bfcl-eval==2025.6.8"],
            # lm-eval's IFEval task needs only these of its dependencies; the rest (torch, datasets...) is not used
            "lmeval": ["--no-deps", "lm-eval==0.4.13", "+", "langdetect==1.0.9", "immutabledict", "nltk>=3.9.1",
                       "typing_extensions", "numpy", "requests", "pyyaml", "jinja2", "datasets", "sacrebleu"]}
RUNNER = Path(__file__).with_name("conformance_official.py")
VENV_OF = {"bfcl_ast": "bfcl", "bfcl_decode": "bfcl", "ifeval": "lmeval", "gpqa": "bfcl"}
EXPLAINED = {
    "gpqa": {"ours_reads_boxed": "our GPQA prompt asks for \\boxed{X}; simple-evals' regex reads only 'Answer: X'",
             "ours_reads_stated": "ours also reads 'the answer is (X)' and '**X**', which simple-evals' regex misses",
             "several_answers": "with two answers, ours takes the last, simple-evals' re.search the first",
             "letter_run": "'Answer: DC' names no one letter: ours reads none, simple-evals' regex the first",
             "lowercase_letter": "simple-evals' (?i) regex returns 'answer: b' as 'b', which never equals the gold "
                                 "letter (the item fails); ours reads no letter there"},
    "ifeval": {"random_letter": "the instruction's letter is not a letter ('#', '!'): Google's checker then checks "
                                "random.choice(string.ascii_letters), in lm-eval's copy and in ours: a coin toss"},
}

# What the report compares: (its row, the case kind, our variant). BFCL's raw text twice: as a single-turn answer
# (decode_ast) and as a multi-turn step (decode_execute, variant "execute"). GPQA twice: our own reading, whose
# differences are the documented ones above, and our code under --gpqa-extraction simple-evals, which has none.
CHECKERS = [("bfcl_ast", "bfcl_ast", "ours"), ("bfcl_decode", "bfcl_decode", "ours"),
            ("bfcl_execute", "bfcl_decode", "execute"), ("ifeval", "ifeval", "ours"), ("gpqa", "gpqa", "ours"),
            ("gpqa_simple_evals", "gpqa", "simple-evals")]


# ------------------------------------------------------------------------------------------ the official venvs
def official_python(name: str, home: Path | None = None) -> Path:
    """The venv `name` (bfcl, lmeval) with its pinned packages, built once; returns its python."""
    root = (home or rstar2_home()) / "conformance" / name
    python = root / "bin" / "python"
    stamp = root / ".pins"
    pins = json.dumps(OFFICIAL[name])
    if python.is_file() and stamp.is_file() and stamp.read_text() == pins:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True)
    groups = " ".join(OFFICIAL[name]).split(" + ")
    for group in groups:
        subprocess.run([str(python), "-m", "pip", "install", "-q", *group.split()], check=True)
    stamp.write_text(pins)
    return python


def run_official(cases: list[dict], home: Path | None = None) -> list[dict]:
    """The official verdict of every case, in order (one subprocess per venv)."""
    out: list[dict | None] = [None] * len(cases)
    for venv in sorted({VENV_OF[c["kind"]] for c in cases}):
        idx = [i for i, c in enumerate(cases) if VENV_OF[c["kind"]] == venv]
        env = dict(os.environ)
        if venv == "lmeval":  # lm-eval looks for punkt_tab there; ours writes it (no download)
            from rstar2_agent.eval.benchmarks.ifeval.instructions import ensure_punkt

            env["NLTK_DATA"] = str(ensure_punkt())
        lines = "".join(json.dumps(cases[i]) + "\n" for i in idx)
        proc = subprocess.run([str(official_python(venv, home)), str(RUNNER)], input=lines, text=True,
                              capture_output=True, env=env, check=True)
        for i, line in zip(idx, proc.stdout.splitlines(), strict=True):
            out[i] = json.loads(line)
    return out  # type: ignore[return-value]


def official_versions(home: Path | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    for venv in OFFICIAL:
        proc = subprocess.run([str(official_python(venv, home)), str(RUNNER), "--versions"], text=True,
                              capture_output=True, check=True)
        out |= json.loads(proc.stdout)
    return out


# ------------------------------------------------------------------------------------------ BFCL corpus
AST_CATEGORIES = ("simple", "multiple", "parallel", "parallel_multiple", "java", "javascript", "live_simple",
                  "live_multiple", "live_parallel", "live_parallel_multiple")


def _literal(v: Any) -> str:
    """A value as a Java/JavaScript argument string (a rough literal: the converters judge it)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return v if isinstance(v, str) else json.dumps(v)


def _calls(item: dict, category: str) -> list[dict]:
    from rstar2_agent.eval.benchmarks.bfcl_v3.data import first_answer

    calls = []
    for answer in item["ground_truth"]:
        for name, params in answer.items():
            args = {p: first_answer(v) for p, v in params.items() if v and v[0] != ""}
            if category in ("java", "javascript"):
                args = {p: _literal(v) for p, v in args.items()}
            calls.append({"name": name, "arguments": args})
    return calls


def _value_mutation(rng: random.Random, v: Any) -> Any:
    choices = [
        lambda: 3.5, lambda: 7, lambda: True, lambda: None, lambda: "zz-wrong", lambda: str(v), lambda: [v],
        lambda: {"k": v}, lambda: [], lambda: [1.5, 2], lambda: [1, 2.0], lambda: [[1]], lambda: [{"a": 1}],
        lambda: (v.upper() + " ") if isinstance(v, str) else v, lambda: (v + 0.5) if type(v) is int else v,
        lambda: float(v) if type(v) is int else v, lambda: int(v) if type(v) is float else v,
        lambda: ([x + 0.5 if type(x) is int else x for x in v] if isinstance(v, list) else v),
        lambda: ([str(x) for x in v] if isinstance(v, list) else v),
        lambda: (v[:-1] if isinstance(v, list) else v), lambda: (list(reversed(v)) if isinstance(v, list) else v),
        lambda: ({**v, "extra": 1} if isinstance(v, dict) else v),
        lambda: ({k: "zz" for k in v} if isinstance(v, dict) else v),
        lambda: ({k: x for k, x in list(v.items())[1:]} if isinstance(v, dict) else v),
        lambda: ([{**d, "x": 1} if isinstance(d, dict) else d for d in v] if isinstance(v, list) else v),
    ]
    return rng.choice(choices)()


def _mutate_calls(rng: random.Random, calls: list[dict]) -> list[dict]:
    calls = copy.deepcopy(calls)
    for _ in range(rng.choice([0, 1, 1, 1, 2])):
        if not calls:
            break
        call = rng.choice(calls)
        args = call["arguments"]
        op = rng.randrange(8)
        if op <= 3 and args:
            p = rng.choice(list(args))
            args[p] = _value_mutation(rng, args[p])
        elif op == 4 and args:
            del args[rng.choice(list(args))]
        elif op == 5:
            args[rng.choice(["extra", "unit", "format"])] = "x"
        elif op == 6:
            call["name"] = rng.choice([call["name"] + "_v2", call["name"].replace(".", "_"), "other"])
        else:  # a call more, one fewer, or the calls reordered
            k = rng.randrange(3)
            if k == 0:
                calls.append(copy.deepcopy(call))
            elif k == 1:
                calls.pop()
            else:
                rng.shuffle(calls)
    return calls


def _mutate_doc(rng: random.Random, functions: list[dict]) -> list[dict]:
    """Rarely, a doc as the official checker cannot read it (no "required", no "items", an unknown type)."""
    functions = copy.deepcopy(functions)
    doc = rng.choice(functions)
    props = doc["parameters"].get("properties") or {}
    op = rng.randrange(3)
    if op == 0:
        doc["parameters"].pop("required", None)
    elif props:
        spec = props[rng.choice(list(props))]
        spec.pop("items", None) if op == 1 else spec.update(type="number")
    return functions


def bfcl_items() -> list[tuple[str, dict]]:
    from rstar2_agent.eval.benchmarks.bfcl_v3 import data as bfcl

    return [(c, item) for c in AST_CATEGORIES for item in bfcl.load_items(c)]


def _drawn(rng: random.Random, items: list[tuple[str, dict]], mutated: float) -> tuple[str, dict, list[dict]]:
    """An item at random and its calls, mutated with probability `mutated`."""
    category, item = rng.choice(items)
    calls = _calls(item, category)
    return category, item, _mutate_calls(rng, calls) if rng.random() < mutated else calls


def bfcl_ast_cases(rng: random.Random, n: int, items: list[tuple[str, dict]]) -> list[dict]:
    from rstar2_agent.eval.benchmarks.bfcl_v3 import data as bfcl

    cases = []
    for _ in range(n):
        category, item, calls = _drawn(rng, items, 0.8)
        functions = _mutate_doc(rng, item["function"]) if rng.random() < 0.03 else item["function"]
        cases.append({"kind": "bfcl_ast", "id": item["id"], "category": category, "language": bfcl.language(category),
                      "functions": functions, "calls": calls, "possible_answer": item["ground_truth"],
                      "model_output": [{c["name"]: c["arguments"]} for c in calls]})
    return cases


def _raw_call(rng: random.Random, call: dict) -> str:
    name, args = call["name"], call["arguments"]
    body = {"name": name, "arguments": args}
    variants = [
        lambda: json.dumps(body), lambda: json.dumps(body, indent=2), lambda: json.dumps(body, ensure_ascii=False),
        lambda: json.dumps({"name": name, "arguments": json.dumps(args)}),  # arguments as a JSON string
        lambda: json.dumps({"name": name, "parameters": args}),
        lambda: json.dumps({"function": name, "arguments": args}),
        lambda: json.dumps({"arguments": args}), lambda: json.dumps([body]), lambda: json.dumps(body)[:-1],
        lambda: json.dumps(body).replace('"', "'"), lambda: json.dumps({"name": name, "arguments": args, "id": 1}),
        lambda: json.dumps({"name": name, "arguments": list(args.values())}), lambda: json.dumps({"name": name}),
        lambda: json.dumps({"name": [name], "arguments": args}), lambda: json.dumps({"name": None, "arguments": {}}),
    ]
    inner = variants[0]() if rng.random() < 0.4 else rng.choice(variants)()
    opens = ["<tool_call>\n"] * 6 + ["<tool_call>", "<tool_call> ", "<tool_call>\n\n", " <tool_call>\n",
                                     "<tool_call >\n", "<tool_call>\r\n"]
    closes = ["\n</tool_call>"] * 6 + ["</tool_call>", " </tool_call>", "\n\n</tool_call>", "\n</tool_call >", "\n",
                                       "", "\n</tool_call"]
    return rng.choice(opens) + inner + rng.choice(closes)


def bfcl_decode_cases(rng: random.Random, n: int, items: list[tuple[str, dict]]) -> list[dict]:
    cases = []
    for _ in range(n):
        _, item, calls = _drawn(rng, items, 0.2)
        seps = ["\n", "", "\n\n", " "]
        text = rng.choice(seps).join(_raw_call(rng, c) for c in calls)
        prefix = rng.choice(["", "", "Sure.\n", "<think>\nLet me call it.\n</think>\n\n", "<think>\nhmm</think>",
                             "<reason>plan</reason>\n", "```json\n"])
        suffix = rng.choice(["", "", "\n", "<|im_end|>", "\nDone.", "\n```"])
        cases.append({"kind": "bfcl_decode", "id": item["id"], "text": prefix + text + suffix})
    return cases


# ------------------------------------------------------------------------------------------ IFEval corpus
def ifeval_rows() -> tuple[list[dict], str]:
    shared = Path(__file__).resolve().parents[2] / "shared" / "data" / "ifeval.jsonl"
    path = shared if shared.is_file() else Path(__file__).resolve().parents[1] / "tests" / "data" / "ifeval.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()], str(path)


WORDS = ("the quick brown fox jumps over a lazy dog while seven curious owls watch from an old oak tree near "
         "the river bank under a pale moon").split()


def _ifeval_response(rng: random.Random, row: dict, kwargs: list[dict]) -> str:
    def sentence() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))).capitalize() + rng.choice([".", "!", "?"])

    paras = [" ".join(sentence() for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 6))]
    for kw in kwargs:  # sometimes honour what the instruction asks, so both verdicts occur
        for key in ("keywords", "forbidden_words"):
            if kw.get(key) and rng.random() < 0.6:
                paras[0] += " " + " ".join(kw[key])
        if kw.get("keyword") and rng.random() < 0.6:
            paras[-1] += (" " + kw["keyword"]) * (kw.get("frequency") or 1)
        if kw.get("end_phrase") and rng.random() < 0.6:
            paras[-1] += " " + kw["end_phrase"]
        if kw.get("postscript_marker") and rng.random() < 0.6:
            paras.append(f"{kw['postscript_marker']} {sentence()}")
        if kw.get("section_spliter") and rng.random() < 0.6:
            paras = [f"{kw['section_spliter']} {i + 1}\n{p}" for i, p in enumerate(paras)]
    sep = rng.choice(["\n\n", "\n\n***\n\n", "\n", " "])
    text = sep.join(paras)
    for op in rng.sample(range(12), rng.randint(0, 4)):
        text = [lambda t: t.lower(), lambda t: t.upper(), lambda t: t.replace(",", ""), lambda t: f'"{t}"',
                lambda t: f"<<{rng.choice(WORDS).title()}>>\n{t}", lambda t: "* " + t.replace("\n\n", "\n* "),
                lambda t: json.dumps({"answer": t}), lambda t: f"```json\n{json.dumps({'a': t})}\n```",
                lambda t: t + " [name] [address]", lambda t: t.replace("fox", "*fox*").replace("owl", "*owl*"),
                lambda t: row["prompt"] + "\n" + t, lambda t: t + "\nIs there anything else I can help with?"][op](text)
    return text if rng.random() > 0.01 else ""


def ifeval_cases(rng: random.Random, n: int) -> list[dict]:
    from rstar2_agent.eval.benchmarks.ifeval.instructions import kwargs_of

    rows, _ = ifeval_rows()
    cases = []
    for _ in range(n):
        row = rng.choice(rows)
        kwargs = kwargs_of(row)
        cases.append({"kind": "ifeval", "id": str(row["key"]), "prompt": row["prompt"],
                      "instruction_id_list": list(row["instruction_id_list"]), "kwargs": kwargs,
                      "response": _ifeval_response(rng, row, kwargs)})
    return cases


# ------------------------------------------------------------------------------------------ GPQA corpus
def gpqa_cases(rng: random.Random, n: int) -> list[dict]:
    forms = ["Answer: {L}", "Answer:{L}", "answer: {L}", "Answer: ${L}$", "Answer: {l}", "ANSWER: {L}",
             "**Answer: {L}**", "Answer: ({L})", "The answer is {L}.", "The answer is ({L})", "\\boxed{{{L}}}",
             "<answer>\\boxed{{{L}}}</answer>", "**{L}**", "{L}", "({L})", "Final answer: {L}", "Answer:\t{L}",
             "Answer: {L}) some text", "Answer: \\text{{{L}}}", "I think it's {L}", "Answer: E", "Answer: {L}{L2}"]
    cases = []
    for i in range(n):
        letter, other = rng.choice("ABCD"), rng.choice("ABCD")
        parts = [rng.choice(forms).format(L=letter, l=letter.lower(), L2=other)
                 for _ in range(rng.choice([1, 1, 1, 2]))]
        lead = rng.choice(["", "Let me think step by step. The energy is 4 eV.\n", "Option A is wrong; "])
        cases.append({"kind": "gpqa", "id": f"gpqa-{i}", "response": lead + "\n".join(parts)})
    return cases


# ------------------------------------------------------------------------------------------ ours, and the comparison
def ours(case: dict, variant: str = "ours") -> dict:
    """Our verdict on a case. `variant`: for BFCL's raw text, "execute" reads it as a multi-turn step (the calls our
    multi-turn path runs, written as BFCL writes them to execute them); for GPQA, the --gpqa-extraction."""
    kind = case["kind"]
    if kind == "bfcl_decode" and variant == "execute":
        from rstar2_agent.eval.benchmarks.bfcl_v3 import step_calls
        from rstar2_agent.eval.benchmarks.bfcl_v3.multi_turn import Call

        return {"executed": [Call(c.name, (), c.arguments).text() for c in step_calls(case["text"])]}
    if kind == "bfcl_ast":
        from rstar2_agent.eval.benchmarks.bfcl_v3.ast_checker import CRASH, check_ast

        r = check_ast(case["functions"], case["calls"], case["possible_answer"], case["category"], case["language"])
        return {"valid": r.valid, "error_type": r.error_type, "crash": r.error_type == CRASH}
    if kind == "bfcl_decode":
        from rstar2_agent.eval.benchmarks.bfcl_v3.decode import decode

        d = decode(case["text"])
        return {"error": d.error, "calls": d.calls, "made_call": d.made_call}
    if kind == "ifeval":
        from rstar2_agent.eval.benchmarks.ifeval.instructions import check

        rs = check(case["response"], case["instruction_id_list"], case["kwargs"], case["prompt"])
        return {"strict": all(r.strict for r in rs), "loose": all(r.loose for r in rs),
                "inst_strict": [r.strict for r in rs], "inst_loose": [r.loose for r in rs]}
    from rstar2_agent.eval.benchmarks.gpqa_diamond import GPQA_EXTRACTIONS

    return {"letter": GPQA_EXTRACTIONS[variant].read(case["response"])}


def compare(case: dict, mine: dict, official: dict) -> str | None:
    """None when the verdicts agree, else the disagreement's class."""
    kind = case["kind"]
    if kind == "bfcl_ast":
        if "raises" in official:  # the leaderboard has no pass for this item: ours must fail it
            return None if not mine["valid"] else "official_raises_ours_passes"
        if mine["valid"] != official["valid"]:
            return f"verdict:{official['error_type'] or 'valid'}->{mine['error_type'] or 'valid'}"
        return None
    if kind == "bfcl_decode" and "executed" in mine:  # a raise or an empty list: no call, the turn ends
        if "raises" in official:
            return "official_raises"
        theirs = [] if official["executed"] is None or official["execute_empty"] else official["executed"]
        if mine["executed"] == theirs:
            return None
        return "official_no_call" if not theirs else "ours_no_call" if not mine["executed"] else "different_calls"
    if kind == "bfcl_decode":
        if "raises" in official or official.get("decoded") is None:
            return None if mine["error"] is not None else "official_fails_ours_decodes"
        if mine["error"] is not None:
            return "ours_fails_official_decodes"
        theirs = [{"name": k, "arguments": v} for k, v in official["decoded"]]
        return None if json.dumps(theirs, sort_keys=True) == json.dumps(mine["calls"], sort_keys=True) \
            else "different_calls"
    if kind == "ifeval":
        if "raises" in official:
            return "official_raises"
        for level in ("strict", "loose", "inst_strict", "inst_loose"):
            if mine[level] != official[level]:
                diff = [i for i, (a, b) in enumerate(zip(mine["inst_loose" if "loose" in level else "inst_strict"],
                                                         official["inst_loose" if "loose" in level else "inst_strict"],
                                                         strict=True)) if a != b]
                ids = sorted({case["instruction_id_list"][i] for i in diff})
                if ids == ["keywords:letter_frequency"] and not all(
                        str(k.get("letter", "")).isascii() and str(k.get("letter", "")).isalpha()
                        for k, i in zip(case["kwargs"], case["instruction_id_list"], strict=True)
                        if i == "keywords:letter_frequency"):
                    return "random_letter"
                return f"{level}:{','.join(ids)}"
        return None
    theirs, mine_letter = official["letter"], mine["letter"]
    if theirs == mine_letter:
        return None
    if theirs is not None and theirs.islower():
        return "lowercase_letter"
    if "boxed" in case["response"] and mine_letter is not None:
        return "ours_reads_boxed"
    if theirs is None:
        return "ours_reads_stated"
    if mine_letter is None:
        return "letter_run" if re.search(r"(?i)Answer[ \t]*:[ \t]*\$?[A-D][A-Za-z]", case["response"]) \
            else "ours_misses"
    return "several_answers"


def corpus(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    items = bfcl_items()
    return [*bfcl_ast_cases(rng, n, items), *bfcl_decode_cases(rng, n, items), *ifeval_cases(rng, n),
            *gpqa_cases(rng, n)]


def conformance(seed: int = 0, n: int = 5000, home: Path | None = None) -> dict[str, Any]:
    cases = corpus(seed, n)
    official = run_official(cases, home)
    report: dict[str, Any] = {"seed": seed, "versions": official_versions(home), "benchmarks": {}}
    for label, kind, variant in CHECKERS:
        rows = [(c, o) for c, o in zip(cases, official, strict=True) if c["kind"] == kind]
        classes: Counter[str] = Counter()
        examples: dict[str, dict] = {}
        raises = 0
        for case, theirs in rows:
            raises += "raises" in theirs
            cls = compare(case, ours(case, variant), theirs)
            if cls:
                classes[cls] += 1
                examples.setdefault(cls, {"id": case["id"], "case": {k: v for k, v in case.items()
                                                                     if k in ("text", "response", "calls")}})
        explained = EXPLAINED.get(label, {})
        report["benchmarks"][label] = {
            "cases": len(rows), "agree": len(rows) - sum(classes.values()), "official_raises": raises,
            "agreement": round((len(rows) - sum(classes.values())) / max(1, len(rows)), 5),
            "disagreements": {c: {"count": k, "explained": explained.get(c), "example": examples[c]}
                              for c, k in classes.most_common()},
            "unexplained": sum(k for c, k in classes.items() if c not in explained)}
    report["unexplained"] = sum(b["unexplained"] for b in report["benchmarks"].values())
    return report


def bfcl_fixture(path: Path, seed: int = 52) -> None:
    """tests/data/bfcl_official_verdicts.json: 260 AST cases (every nested-type failure and 20 cases the official
    checker raises on among 3,000, the rest at random) and 220 raw-text cases, with the official verdicts."""
    rng = random.Random(seed)
    items = bfcl_items()
    ast, dec = bfcl_ast_cases(rng, 3000, items), bfcl_decode_cases(rng, 400, items)
    official = run_official(ast + dec[:220])
    oa, od = official[:len(ast)], official[len(ast):]
    nested = [i for i, o in enumerate(oa) if o.get("error_type") == "type_error:nested"]
    raises = [i for i, o in enumerate(oa) if "raises" in o][:20]
    rest = [i for i in range(len(ast)) if i not in nested and i not in raises]
    random.Random(0).shuffle(rest)
    chosen = sorted({*nested, *raises, *rest[: 260 - len(nested) - len(raises)]})
    docs = {(c, it["id"]): it["function"] for c, it in items}

    def row(case: dict, verdict: dict) -> dict:
        out = {"category": case["category"], "id": case["id"], "calls": case["calls"],
               "official": {"valid": False, "error_type": "raises"} if "raises" in verdict else verdict}
        return out | ({"functions": case["functions"]}
                      if case["functions"] != docs[(case["category"], case["id"])] else {})

    fixture = {"about": f"BFCL cases with bfcl-eval 2025.6.8's verdicts (bench/conformance.py bfcl_fixture, seed "
                        f"{seed}). ast: calls against the bundled item's possible answers (functions: a doc the case "
                        "mutates); decode: raw text -> QwenFCHandler.decode_ast as [[name, arguments]], or null when "
                        "it raises.",
               "ast": [row(ast[i], oa[i]) for i in chosen],
               "decode": [{"text": c["text"], "official": o.get("decoded")} for c, o in zip(dec, od, strict=False)]}
    path.write_text(json.dumps(fixture, separators=(",", ":")))


def bfcl_execute_fixture(path: Path, seed: int = 53, n: int = 300) -> None:
    """tests/data/bfcl_official_execute.json: `n` raw-text cases with what bfcl-eval's `QwenFCHandler.decode_execute`
    makes of them (the call strings a multi-turn step executes; null where it raises): every case among 3,000 where
    it and `decode_ast` differ on failing, 40 where it raises, 40 with several calls, the rest at random."""
    rng = random.Random(seed)
    cases = bfcl_decode_cases(rng, 3000, bfcl_items())
    official = run_official(cases)
    differ = [i for i, o in enumerate(official) if (o["decoded"] is None) != (o["executed"] is None)]
    raises = [i for i, o in enumerate(official) if o["executed"] is None and i not in differ][:40]
    several = [i for i, o in enumerate(official) if len(o["executed"] or []) > 1 and i not in differ][:40]
    rest = [i for i in range(len(cases)) if i not in {*differ, *raises, *several}]
    random.Random(0).shuffle(rest)
    chosen = sorted({*differ, *raises, *several, *rest[: n - len(differ) - len(raises) - len(several)]})
    about = (f"Raw text -> bfcl-eval 2025.6.8's QwenFCHandler.decode_execute after the </think> split: the call "
             f"strings, or null when it raises (bench/conformance.py bfcl_execute_fixture, seed {seed})")
    rows = ",\n".join(json.dumps({"text": cases[i]["text"], "official": official[i]["executed"]}) for i in chosen)
    path.write_text(f'{{"about": {json.dumps(about)},\n"execute": [\n{rows}\n]}}\n')  # a case a line
