"""One async interface over inference engines: token ids in, token ids and logprobs out."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass, field
from typing import Any


def dtype_name(dtype: Any) -> str | None:
    """A torch dtype (or its name) as "fp32", "bf16" or "fp16"; None for anything else (a quantized engine)."""
    name = str(dtype).removeprefix("torch.")
    return {"float32": "fp32", "float": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16",
            "float16": "fp16", "half": "fp16", "fp16": "fp16"}.get(name)


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
    ignore_eos: bool = False  # generate max_tokens whatever the model says (benchmarks)
    # a decoding constraint, engine-neutral: one key of vLLM's StructuredOutputsParams ("structural_tag", "grammar",
    # "json", "regex", "choice") and its value (tool_constraints.py builds the tool_choice ones); only an engine with
    # `constrains` takes it, the others raise EngineError
    constraint: dict[str, Any] | None = None


def call_seed(seed: int | None, call: int) -> int | None:
    """The seed of a trajectory's `call`-th generation (0, 1, ... over its turns and resumes): the trajectory's own
    seed for the first, then a different one per call, derived from both. One seed reused for every call would
    restart the engine's sampling noise at each turn (the same random draws at turn 1 as at turn 0), and seed + call
    would make trajectory s's second turn replay trajectory s + 1's first."""
    if seed is None or call == 0:
        return seed
    import hashlib

    digest = hashlib.blake2b(f"{seed}/{call}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF  # non-negative 31-bit: every engine and server takes it


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]  # of each sampled token under the distribution sampled from (temperature, top-p)
    finish_reason: str  # "stop" (end-of-turn token or stop string) or "length"
    stop_text: str | None = None  # the stop string that ended it, if any


OnTokens = Callable[[list[int], list[float]], None]  # new ids and their logprobs, as produced


class Engine(abc.ABC):
    """The inference interface every face uses. `generate` is safe to call from many coroutines at once; engines
    batch what arrives together.

    Optional capabilities, with their defaults here (a replica pool reads them): `kv_capacity`, the KV cache
    tokens the engine holds when it knows them (vLLM); `max_batch`, the most requests it decodes together
    (with no KV size, a pool assumes max_batch full contexts); `endpoint`, the server of a remote engine;
    `probe()`, which a remote engine uses to learn its context length and KV capacity before the first request;
    `stats()`, load figures for /health; `streams`, whether `on_tokens` hears tokens as they are produced (a
    watchdog can only judge progress where it does); `constrains`, whether it honours `SamplingParams.constraint`
    (guided decoding: vllm in this process; the others refuse a constraint with EngineError). What training asks
    of an engine beyond this is `TrainableEngine`'s."""

    name: str = "engine"
    tokenizer: Any
    model_path: str
    context_length: int
    kv_capacity: int | None = None
    max_batch: int = 1
    endpoint: str | None = None
    streams: bool = True
    constrains: bool = False

    async def probe(self) -> None:  # noqa: B027 - optional: local engines know their limits at construction
        pass

    def stats(self) -> dict[str, Any]:
        return {}

    @abc.abstractmethod
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_tokens: OnTokens | None = None) -> Generation:
        """Generate one continuation. `on_tokens` receives new ids and logprobs as produced (streaming)."""

    async def close(self) -> None:  # noqa: B027 - optional
        pass

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class TrainableEngine(Engine):
    """An engine that training can drive beyond generating: it sleeps while a learner on the same GPU updates,
    scores a sequence for the checked push, and loads new weights. vllm and hf are, and so are a replica pool over
    such engines and the Ray proxy (train/rollout/ray_engine.py); a remote server (openai) is not. Only training
    asks for one (`trainable`). `compute_dtype`: what `score` computes in ("fp32", "bf16", "fp16": dtype_name;
    None: unknown)."""

    compute_dtype: str | None = None

    @abc.abstractmethod
    async def sleep(self, level: int = 1) -> None:
        """Free the accelerator memory the engine holds between generations, for a learner on the same GPU (the
        colocated placement): level 1 keeps the weights in host memory and drops the KV cache, level 2 drops both
        (the next push brings the weights). No generation may be in flight."""

    @abc.abstractmethod
    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Back from `sleep`: `["weights"]` (what a push writes into), then `["kv_cache"]`; None: both."""

    @abc.abstractmethod
    async def score(self, ids: list[int], start: int) -> list[float]:
        """Teacher-forced logprobs of `ids[start:]`, each token given its prefix, at temperature 1 with no top-p
        (the model's own distribution): what the RL step's checked weight push (train/push_check.py) compares with
        the learner's. `start` >= 1."""

    async def score_each(self, ids: list[int], start: int) -> list[list[float]]:
        """`score` on every copy of the weights this engine holds: one list here, one per replica in a pool (a push
        reaches every replica, so a check reads every one)."""
        return [await self.score(ids, start)]

    @abc.abstractmethod
    async def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Swap in new weights (the trainer calls this after each update)."""

    async def load_weight_parts(self, parts: AsyncIterable[dict[str, Any]]) -> None:
        """Swap in new weights that arrive in parts (a collective push hands each received bucket on before it
        receives the next). Here the parts are gathered and loaded as one state dict; an engine that can load
        them one by one (vllm) keeps only one part at a time."""
        state: dict[str, Any] = {}
        async for part in parts:
            state.update(part)
        await self.load_weights(state)

    def untrainable(self) -> list[str]:
        """The engines inside this one that training cannot drive (a replica pool's replicas); empty: none."""
        return []


def trainable(engine: Engine) -> TrainableEngine:
    """`engine` as training drives it, or an EngineError naming it (or the replica in it) that cannot be trained."""
    names = engine.untrainable() if isinstance(engine, TrainableEngine) else [getattr(engine, "name", "?")]
    if not names:
        return engine  # type: ignore[return-value]
    raise EngineError(
        f"the {', '.join(sorted(set(names)))} engine cannot be trained: an RL run sleeps its rollout engine, scores "
        "with it and loads new weights into it, which a remote server does not take. Give the run an hf or vllm "
        "engine (rollout_engine: hf or vllm; distributed: ray for engines on other machines), or none to start the "
        "recipe's")
