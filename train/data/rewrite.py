"""An optional step of `rstar2 train data`: a stronger model rewrites the prompts and responses of chat rows, as
the paper did for its Tulu 3 and Llama-Nemotron rows (section 4.1), over any OpenAI-compatible endpoint (vLLM,
`rstar2 serve`, a hosted API).

Of each conversation, the last user prompt and the last answer are rewritten, the prompt first so that the answer
is rewritten for the new prompt. Every answer goes to a cache file (JSONL, keyed by model, kind and text) as it
arrives: a run that stops (killed, a timeout, an endpoint error) is resumed by running the same command again,
which asks only for what is not in the cache.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from .journal import Journal

log = logging.getLogger(__name__)

PROMPT_INSTRUCTION = (
    "Rewrite the user request below so that it is clear, specific and well written. Keep its intent, its language "
    "and every constraint it states (format, length, keywords, style). Reply with the rewritten request only.\n\n"
    "<request>\n{text}\n</request>"
)
RESPONSE_INSTRUCTION = (
    "Below are a user request and a response to it. Rewrite the response so that it is correct, helpful and well "
    "written and follows every instruction of the request (format, length, keywords, style). Answer directly, "
    "without reasoning aloud and without remarks about the rewrite. Reply with the rewritten response only.\n\n"
    "<request>\n{context}\n</request>\n\n<response>\n{text}\n</response>"
)
KINDS = ("prompt", "response", "both")


class RewriteError(RuntimeError):
    """The endpoint failed; what was answered before is in the cache."""


@dataclass
class RewriteConfig:
    url: str  # the endpoint's base URL, e.g. http://localhost:8000/v1
    model: str
    what: str = "both"  # prompt, response or both
    cache: str = "rewrite-cache.jsonl"
    concurrency: int = 8  # requests in flight
    timeout: float = 300.0  # seconds per request
    max_tokens: int = 4096
    temperature: float = 0.0
    api_key: str | None = None  # default: $OPENAI_API_KEY, else a placeholder (local servers take any)


@dataclass
class RewriteStats:
    asked: int = 0  # requests sent
    cached: int = 0  # answers found in the cache
    empty: int = 0  # empty answers: the original text is kept


def _key(model: str, kind: str, text: str, context: str) -> str:
    return hashlib.sha256(json.dumps([model, kind, context, text], ensure_ascii=False).encode()).hexdigest()


def _last(messages: list[dict[str, Any]], role: str) -> int | None:
    return next((i for i in range(len(messages) - 1, -1, -1) if messages[i]["role"] == role), None)


async def rewrite(records: list[dict[str, Any]], cfg: RewriteConfig) -> tuple[list[dict[str, Any]], RewriteStats]:
    """The records with their last prompt and/or answer rewritten (in the same order)."""
    import openai

    if cfg.what not in KINDS:
        raise ValueError(f"rewrite what={cfg.what!r}: choose one of {', '.join(KINDS)}")
    client = openai.AsyncOpenAI(base_url=cfg.url, api_key=cfg.api_key or os.environ.get("OPENAI_API_KEY", "EMPTY"),
                                timeout=cfg.timeout, max_retries=2)
    cache, gate, stats = Journal(cfg.cache), asyncio.Semaphore(cfg.concurrency), RewriteStats()
    answers = {row["key"]: row["text"] for row in cache.rows}
    failed: list[openai.OpenAIError] = []  # once a request fails, no new one is sent; those in flight finish

    async def ask(kind: str, text: str, context: str) -> str:
        key = _key(cfg.model, kind, text, context)
        answer = answers.get(key)
        if answer is not None:
            stats.cached += 1
        else:
            template = PROMPT_INSTRUCTION if kind == "prompt" else RESPONSE_INSTRUCTION
            request = [{"role": "user", "content": template.format(text=text, context=context)}]
            async with gate:
                if failed:
                    return text
                try:
                    r = await client.chat.completions.create(model=cfg.model, messages=request,
                                                             temperature=cfg.temperature, max_tokens=cfg.max_tokens)
                except openai.OpenAIError as e:
                    failed.append(e)
                    return text
            answer = (r.choices[0].message.content or "").strip()
            answers[key] = answer
            cache.append({"key": key, "text": answer})
            stats.asked += 1
        stats.empty += not answer
        return answer or text

    async def one(record: dict[str, Any]) -> dict[str, Any]:
        messages = [dict(m) for m in record["messages"]]
        u = _last(messages, "user")
        a = _last(messages, "assistant")
        if u is None or a is None or a < u:
            return record
        if cfg.what in ("prompt", "both"):
            messages[u]["content"] = await ask("prompt", messages[u]["content"], "")
        if cfg.what in ("response", "both"):
            messages[a]["content"] = await ask("response", messages[a]["content"], messages[u]["content"])
        return {**record, "messages": messages}

    try:
        out = await asyncio.gather(*(one(r) for r in records))
    finally:
        cache.close()
        await client.close()
    if failed:
        e = failed[0]
        raise RewriteError(f"the rewrite at {cfg.url} failed ({type(e).__name__}: {e}); {len(answers)} answers "
                           f"are kept in {cfg.cache}: run the same command again to go on from there") from e
    return list(out), stats
