"""One async interface over inference engines: token ids in, token ids and logprobs out."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class EngineError(RuntimeError):
    """The engine could not generate (crashed, unreachable, bad request); the loop records it."""


@dataclass
class SamplingParams:
    temperature: float = 0.6
    top_p: float = 1.0
    max_tokens: int = 1024
    seed: int | None = None
    stop: list[str] = field(default_factory=list)  # stop strings, kept in the output
    stop_token_ids: list[int] = field(default_factory=list)


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]  # of each sampled token, under the sampling temperature, before top-p
    finish_reason: str  # "stop" (end-of-turn token or stop string) or "length"
    stop_text: str | None = None  # the stop string that ended it, if any


OnTokens = Callable[[list[int]], None]


class Engine(abc.ABC):
    """`generate` is safe to call from many coroutines at once; engines batch what arrives together."""

    name: str = "engine"
    tokenizer: Any
    model_path: str
    context_length: int

    @abc.abstractmethod
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_tokens: OnTokens | None = None) -> Generation:
        """Generate one continuation. `on_tokens` receives new ids as they are produced (for streaming)."""

    async def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Swap in new weights (the trainer calls this after each update)."""
        raise NotImplementedError(f"the {self.name} engine cannot load new weights")

    async def close(self) -> None:  # noqa: B027 - optional
        pass

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def stop_at(text_of: Callable[[list[int]], str], ids: list[int], stops: list[str]) -> tuple[int, str] | None:
    """If the decoded `ids` contain a stop string, the shortest prefix length that includes it, and the string."""
    if not stops:
        return None
    text = text_of(ids)
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return None
    pos, s = min(hits)
    end = pos + len(s)
    for n in range(1, len(ids) + 1):  # the first prefix whose text reaches past the stop string
        if len(text_of(ids[:n])) >= end and s in text_of(ids[:n]):
            return n, s
    return len(ids), s
