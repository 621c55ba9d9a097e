"""`rstar2 train problems-verify`: keep the problems whose labelled answer a strong model reproduces.

The paper keeps an OpenMathReasoning problem when at least 2 of Qwen3-32B's 16 samples reach its integer label
(rStar2-Agent section 4.2). This asks any OpenAI-compatible server (vLLM or SGLang serving that model, or
`rstar2 serve`) for `samples` answers per problem in one request (`n`), grades each with the core's math
grader, and appends one progress line per problem, so a killed run resumes without asking a finished problem
again. The output, written once every problem is done, keeps the input's order.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rstar2_agent.benchmark_data import DataError
from rstar2_agent.grading.math import MathGrader

from .journal import Journal
from .problems import Problem, read_problems, write_problems

log = logging.getLogger(__name__)

# The question as the verifier sees it: Qwen's math prompt (its models' cards ask for \boxed{} this way).
PROMPT = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."


@dataclass
class VerifyConfig:
    url: str
    served_model: str | None = None  # None: the server's first model
    samples: int = 16  # the paper: 16 samples of Qwen3-32B
    min_agree: int = 2  # the paper: kept when at least 2 reach the label
    concurrency: int = 8  # problems in flight
    temperature: float = 0.6  # Qwen3's recommended thinking-mode sampling (the paper gives none for this step)
    top_p: float = 0.95
    max_tokens: int | None = None  # None: the server's default
    timeout: float = 1800.0  # seconds per request (16 long answers of a 32B model)
    api_key: str | None = None

    def settings(self) -> dict[str, Any]:
        """What the recorded answers depend on: a resume with other settings would mix two experiments."""
        return {"served_model": self.served_model, "samples": self.samples, "temperature": self.temperature,
                "top_p": self.top_p, "max_tokens": self.max_tokens, "prompt": PROMPT}


@dataclass
class VerifyCounts:
    read: int = 0
    done_before: int = 0  # recorded by an earlier run, not asked again
    asked: int = 0
    failed: int = 0
    kept: int = 0

    def as_json(self) -> dict[str, int]:
        return asdict(self)


def progress_path(out: str | os.PathLike) -> Path:
    return Path(f"{out}.progress.jsonl")


def read_progress(journal: Journal, settings: dict[str, Any]) -> dict[str, int]:
    """Correct answers per problem id recorded so far; a journal recorded with other settings is refused."""
    done: dict[str, int] = {}
    for row in journal.rows:
        if "settings" in row:
            if row["settings"] != settings:
                changed = ", ".join(f"{k}: {row['settings'].get(k)!r} -> {v!r}" for k, v in settings.items()
                                    if row["settings"].get(k) != v)
                raise DataError(f"{journal.path} was recorded with other settings ({changed}); rerun with the same "
                                "ones, or give another --out to start over")
        else:
            done[row["id"]] = row["correct"]
    return done


class Verifier:
    def __init__(self, cfg: VerifyConfig):
        from openai import AsyncOpenAI

        base = cfg.url.rstrip("/")
        self.cfg = cfg
        self.client = AsyncOpenAI(base_url=base if base.endswith("/v1") else base + "/v1",
                                  api_key=cfg.api_key or "none", timeout=cfg.timeout, max_retries=2)
        self.grader = MathGrader()

    async def model(self) -> str:
        if self.cfg.served_model is None:
            models = await self.client.models.list()
            if not models.data:
                raise DataError(f"the server at {self.cfg.url} serves no model")
            self.cfg.served_model = models.data[0].id
        return self.cfg.served_model

    async def correct(self, problem: Problem) -> int:
        """How many of `samples` answers reach the problem's label."""
        cfg = self.cfg
        response = await self.client.chat.completions.create(
            model=await self.model(), messages=[{"role": "user", "content": PROMPT.format(problem=problem.text)}],
            n=cfg.samples, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens)
        if len(response.choices) != cfg.samples:
            raise DataError(f"the server answered {len(response.choices)} choices to a request for n={cfg.samples}; "
                            "serve the model with a server that samples n answers per request (vLLM, SGLang)")
        grades = await asyncio.gather(*(self.grader.grade(c.message.content or "", problem.answer)
                                        for c in response.choices))
        return sum(g.correct for g in grades)

    async def close(self) -> None:
        self.grader.close()
        await self.client.close()


async def verify(inp: str | os.PathLike, out: str | os.PathLike, cfg: VerifyConfig,
                 on_problem: Callable[[int, int], None] | None = None) -> VerifyCounts:
    """Ask for every problem of `inp` not yet in the progress file; write `out` when none is left."""
    import openai

    problems = read_problems(inp)
    verifier = Verifier(cfg)
    try:
        await verifier.model()
        journal = Journal(progress_path(out))
        done = read_progress(journal, cfg.settings())
        counts = VerifyCounts(read=len(problems), done_before=sum(p.id in done for p in problems))
        todo = list({p.id: p for p in problems if p.id not in done}.values())
        with journal:
            if not journal.rows:
                journal.append({"settings": cfg.settings()})
            queue: asyncio.Queue[Problem] = asyncio.Queue()
            for p in todo:
                queue.put_nowait(p)

            async def worker() -> None:
                while not queue.empty():
                    p = queue.get_nowait()
                    try:
                        done[p.id] = await verifier.correct(p)
                    except openai.APITimeoutError as e:  # this problem's answers are long: the next may not be
                        counts.failed += 1
                        log.warning("problem %s not verified in --timeout %s s (%s); a rerun asks it again", p.id,
                                    cfg.timeout, e)
                        continue
                    except (openai.APIConnectionError, openai.AuthenticationError, openai.PermissionDeniedError,
                            openai.NotFoundError):
                        raise  # every problem would fail the same way: stop (a rerun resumes)
                    except openai.APIError as e:
                        counts.failed += 1
                        log.warning("problem %s not verified (%s: %s); a rerun asks it again", p.id,
                                    type(e).__name__, str(e)[:200])
                        continue
                    journal.append({"id": p.id, "correct": done[p.id], "samples": cfg.samples})
                    counts.asked += 1
                    if on_problem:
                        on_problem(counts.asked + counts.failed, len(todo))

            workers = [asyncio.create_task(worker()) for _ in range(max(1, cfg.concurrency))]
            try:
                await asyncio.gather(*workers)
            finally:
                for w in workers:  # one worker's fatal error stops the others
                    w.cancel()
    except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError) as e:
        raise DataError(f"the server at {cfg.url} refused the request ({type(e).__name__}: {e}); check --url, "
                        "--served-model and --api-key") from e
    except openai.APIConnectionError as e:
        raise DataError(f"no OpenAI-compatible server answers at {cfg.url} ({e}); start it or fix --url") from e
    finally:
        await verifier.close()
    if counts.failed == 0:
        kept = [p for p in problems if done.get(p.id, 0) >= cfg.min_agree]
        write_problems(out, kept)
        counts.kept = len(kept)
    return counts
