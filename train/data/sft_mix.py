"""The SFT data mix: recipe sources, each sampled to a size with a seed (`SOURCE@N`), `mix:paper` for the mix of
the paper's non-reasoning SFT (section 4.1), and what each source gives: rows, and tokens as training renders them.

`SOURCE@N` keeps N rows of what SOURCE gives after conversion, drawn without replacement by a generator seeded
with (seed, SOURCE) and kept in the source's order: the same seed gives the same rows, a source's rows do not
depend on the other sources, and a source with fewer rows gives them all, with a warning.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

from rstar2_agent.benchmark_data import DataError
from rstar2_agent.chat_format import ChatFormat

from .chat_data import DataStats, Example, load_examples
from .converters import Record, load_records

log = logging.getLogger(__name__)

# The paper's SFT mix (section 4.1): 117K function-calling rows, which it names "ToolACE11K, APIGen-MT-5K,
# Glaive-function-calling-v2-101k", 48K Magicoder rows as Python tool calls, 30K Tulu 3 instruction following, 27K
# Llama-Nemotron chat. ToolACE has 11.3K rows; 11K of them are sampled, as the paper's name for it says. Magicoder:
# Evol-Instruct-110K, as OSS-Instruct-75K has 38K Python rows, fewer than 48K. Tulu 3 instruction following: its
# persona IF set (29,980 rows; the mixture holds the same rows).
PAPER_MIX = (
    "hub:Team-ACE/ToolACE@11000",
    "hub:Salesforce/APIGen-MT-5k@5000",
    "hub:glaiveai/glaive-function-calling-v2@101000",
    "hub:ise-uiuc/Magicoder-Evol-Instruct-110K@48000",
    "hub:allenai/tulu-3-sft-personas-instruction-following@30000",
    "hub:nvidia/Llama-Nemotron-Post-Training-Dataset:chat@27000",
)


@dataclass
class Part:
    """One source's rows after sampling, and its counts."""
    source: str  # as given, with its @N
    records: list[Record]
    requested: int | None  # the N of @N
    available: int  # rows the source gave before sampling
    stats: DataStats = field(default_factory=DataStats)

    @property
    def hub_id(self) -> str | None:
        return self.source.removeprefix("hub:").split(":")[0].split("@")[0] if self.source.startswith("hub:") else None

    def report(self) -> dict[str, Any]:
        s = self.stats
        return {"source": self.source, "rows": len(self.records), "requested": self.requested,
                "available": self.available, "bad_rows": len(s.bad_lines), "filtered": s.filtered,
                "examples": s.examples, "dropped_long": s.dropped_long, "tokens": s.tokens,
                "target_tokens": s.target_tokens, **shape_shares(s)}


def expand(sources: list[str] | tuple[str, ...]) -> list[str]:
    """The sources with `mix:paper` replaced by its entries."""
    out = []
    for source in sources:
        if source.startswith("mix:"):
            if source != "mix:paper":
                raise DataError(f"unknown mix {source!r}: the one mix is mix:paper ({', '.join(PAPER_MIX)})")
            out += PAPER_MIX
        else:
            out.append(source)
    return out


def split_size(source: str) -> tuple[str, int | None]:
    """"hub:X@500" -> ("hub:X", 500); a source without @N -> (source, None)."""
    base, at, n = source.rpartition("@")
    if not at or not n.isdigit():
        return source, None
    return base, int(n)


def sample(records: list[Record], n: int | None, seed: int, source: str) -> list[Record]:
    if n is None or n >= len(records):
        if n is not None and n > len(records):
            log.warning("%s: asked for %d rows, it has %d: all are used", source, n, len(records))
        return records
    keep = sorted(random.Random(f"{seed}:{source}").sample(range(len(records)), n))
    return [records[i] for i in keep]


def load_mix(sources: list[str] | tuple[str, ...], seed: int = 0, on_bad_line: str = "skip",
             hub_dir: str | None = None) -> list[Part]:
    parts = []
    for source in expand(sources):
        base, n = split_size(source)
        stats = DataStats()
        records = load_records(base, on_bad_line, stats, hub_dir)
        parts.append(Part(source, sample(records, n, seed, base), n, len(records), stats))
    return parts


def render_parts(fmt: ChatFormat, parts: list[Part], max_len: int, overlong: str = "drop", shape: str = "format"
                 ) -> list[Example]:
    """Every part's records rendered as training renders them (in order, targets shaped as `shape` says:
    target_shape.py); each part's stats count its examples, tokens and targets in shape."""
    return [ex for p in parts for ex in load_examples(fmt, p.records, max_len, overlong, p.stats, shape)]


def shape_shares(s: DataStats) -> dict[str, float | None]:
    """The shares of examples whose every assistant turn has the rstar2-paper shape (target_shape.py), as written and
    as trained; None in a format without that shape."""
    n = s.shape_checked
    return {"in_shape_as_written": s.in_shape_as_written / n if n else None, "in_shape": s.in_shape / n if n else None}


def report(parts: list[Part]) -> dict[str, Any]:
    rows = [p.report() for p in parts]
    shares = ("in_shape_as_written", "in_shape")
    total = {k: sum(r[k] or 0 for r in rows) for k in rows[0] if k not in ("source", *shares)} if rows else {}
    whole = DataStats()
    for p in parts:
        whole.add(p.stats)
    return {"sources": rows, "total": {**total, **shape_shares(whole)}}


def write_mix(sources: list[str] | tuple[str, ...], out: str, *, seed: int = 0, hub_dir: str | None = None,
              model: str = "smollm2-135m", format_: str = "hermes", rewrite_cfg: Any = None) -> dict[str, Any]:
    """`rstar2 train data`: the sources as one chat JSONL at `out` (rewritten first, where their hub set asks for it,
    when `rewrite_cfg` (a rewrite.RewriteConfig) is given), and the report of each source's rows and tokens as
    `model`'s tokenizer renders them in `format_`."""
    import asyncio
    import dataclasses
    import json

    from transformers import AutoTokenizer

    from rstar2_agent.models import resolve_model

    from .converters import HUB
    from .rewrite import rewrite

    parts = load_mix(sources, seed, "skip", hub_dir)
    rewritten = {}
    if rewrite_cfg is not None:
        for part in parts:
            if part.hub_id in HUB and HUB[part.hub_id].rewrite:
                part.records, done = asyncio.run(rewrite(part.records, rewrite_cfg))
                rewritten[part.source] = dataclasses.asdict(done)
    resolved = resolve_model(model)
    fmt = ChatFormat(AutoTokenizer.from_pretrained(resolved.path), format_, resolved.spec.chat_template)
    render_parts(fmt, parts, max_len=1 << 30)
    with open(out, "w", encoding="utf-8") as f:
        for part in parts:
            for r in part.records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    result = {**report(parts), "out": out, "model": model, "format": format_, "seed": seed}
    if rewritten:
        result["rewrite"] = rewritten
    return result
