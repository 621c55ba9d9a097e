"""The rollout engines as training drives them (engines/base.py `TrainableEngine`): the core's vllm and hf engines,
which only generate, with what an RL run asks beyond that. They sleep while a learner on the same GPU updates,
score a sequence for the checked push (push_check.py), and load pushed weights: vLLM's in messages of whole layers
(push/weight_chunks.py, through the worker extension push/vllm_worker_extension.py) or through vLLM's own weight
transfer (push/vllm_transfer_config.py, driven from the learner's rank 0 by push/vllm.py); hf's into its own model (or
nothing to load: colocated on the learner's model, see placement.py). `make_trainable_engine` builds one through
the core's factory, for this process (workers.py) or a Ray actor (ray_engine.py)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import torch

from rstar2_agent.engines import make_engine
from rstar2_agent.engines.base import EngineError, TrainableEngine, dtype_name, trainable
from rstar2_agent.engines.hf import HFEngine
from rstar2_agent.engines.vllm import VLLMEngine
from rstar2_agent.train.push.vllm_transfer_config import transfer_config
from rstar2_agent.train.push.weight_chunks import MESSAGE_LIMIT, chunks, not_loaded, not_loaded_error

log = logging.getLogger(__name__)

WORKER_EXTENSION = "rstar2_agent.train.push.vllm_worker_extension.WeightSync"  # imported by path in vLLM's workers


def make_trainable_engine(kind: str, model_path: str, *, context_length: int, **options: Any) -> TrainableEngine:
    """The core's `make_engine` for a rollout engine (hf or vllm; any other kind is refused by `trainable`)."""
    build = {"vllm": TrainableVLLMEngine, "hf": TrainableHFEngine}.get(kind)
    return trainable(make_engine(kind, model_path, context_length=context_length, build=build, **options))


class TrainableVLLMEngine(VLLMEngine, TrainableEngine):
    """`max_message_mb`: the cap of one message of the chunked push (vLLM's msgpack cannot encode a bytes object of
    4 GiB); `weight_transfer`: vLLM's own transfer its workers hold ("nccl": a learner on other GPUs, "ipc": on this
    GPU, None: the chunked push); `sleep_mode`: vLLM's sleep mode, for a colocated learner (on a GPU only, where its
    cumem allocator can release the memory). The other options are VLLMEngine's."""

    def __init__(self, model_path: str, *, max_message_mb: float = 2048.0, weight_transfer: str | None = None,
                 sleep_mode: bool = False, **options: Any):
        if not 0 < max_message_mb < MESSAGE_LIMIT / 2**20:
            raise EngineError(f"max_message_mb is between 0 and {MESSAGE_LIMIT // 2**20} (vLLM's message limit), "
                              f"not {max_message_mb}")
        self.max_message_bytes = int(max_message_mb * 2**20)
        self._asked = {"weight_transfer": weight_transfer, "sleep_mode": sleep_mode}
        self._warned_sleep = False
        self._transfer: dict[str, Any] | None = None  # the push under way through vLLM's weight transfer
        super().__init__(model_path, **options)

    def _engine_args(self, args: dict[str, Any], on_gpu: bool) -> dict[str, Any]:
        self.sleep_mode = bool(self._asked["sleep_mode"]) and on_gpu
        if self.sleep_mode:
            args["enable_sleep_mode"] = True
        args["worker_extension_cls"] = WORKER_EXTENSION  # the chunked push's receiving side, in every worker
        transfer = transfer_config(on_gpu, self._asked["weight_transfer"])  # vLLM's own transfer, when the push uses it
        if transfer is not None:
            args["weight_transfer_config"] = transfer
        self.weight_transfer = self._asked["weight_transfer"] if transfer is not None else None
        return args

    @property
    def compute_dtype(self) -> str | None:  # type: ignore[override]
        return dtype_name(self.weights_dtype)

    async def score(self, ids: list[int], start: int) -> list[float]:
        """Teacher-forced logprobs of `ids[start:]` (see TrainableEngine.score), as vLLM's prompt logprobs of a
        one-token request: with `prompt_logprobs=0` each prompt position i >= 1 holds exactly the logprob of prompt
        token i given ids[:i] (vllm/v1/worker/gpu_model_runner.py `_get_prompt_logprobs_dict`: log-softmax of the raw
        logits, no temperature or top-p, whatever the logprobs mode; vllm/v1/engine/logprobs.py puts None at
        position 0). The request skips the prefix cache (vLLM sets skip_reading_prefix_cache for it), so every
        position is computed by this request's own forward pass."""
        from vllm import SamplingParams as VSampling
        from vllm import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if not 1 <= start < len(ids) or len(ids) >= self.context_length:
            raise EngineError(f"score needs 1 <= start < {len(ids)} tokens within the context "
                              f"({self.context_length}), not start {start}")
        params = VSampling(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False,
                           output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        try:
            (prompt,) = await self.engine.renderer.render_cmpl_async([TokensPrompt(prompt_token_ids=list(ids))])
            async for out in self.engine.generate(prompt, params, request_id=uuid.uuid4().hex):
                final = out
        except Exception as e:  # noqa: BLE001
            raise EngineError(f"vLLM could not score the sequence: {type(e).__name__}: {e}") from e
        rows = list(final.prompt_logprobs or []) if final is not None else []
        if len(rows) != len(ids):
            raise EngineError(f"vLLM returned {len(rows)} prompt logprobs for {len(ids)} tokens")
        return [rows[i][ids[i]].logprob for i in range(start, len(ids))]

    async def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode (the engine is built with enable_sleep_mode on a GPU, `sleep_mode`): level 1 offloads
        the weights to host memory and drops the KV cache, level 2 drops both. vLLM's CPU build has no sleep mode:
        there nothing is freed (a warning, once), so the colocated control flow still runs on a CPU."""
        if self.sleep_mode:
            await self.engine.sleep(level)
        else:
            self._no_sleep()

    async def wake_up(self, tags: list[str] | None = None) -> None:
        if self.sleep_mode:
            await self.engine.wake_up(tags)
        else:
            self._no_sleep()

    def _no_sleep(self) -> None:
        if not self._warned_sleep:
            log.warning("the vllm engine has no sleep mode here (vLLM's CPU build, or built without sleep_mode): it "
                        "stays awake and keeps its memory while the learner updates")
            self._warned_sleep = True

    async def load_weights(self, state_dict: dict[str, Any], *, max_message_bytes: int | None = None) -> None:
        """The state dict into every worker, in messages of whole layers under the cap (weight_chunks.py)."""
        async def one() -> AsyncIterator[dict[str, Any]]:
            yield state_dict

        await self.load_weight_parts(one(), max_message_bytes=max_message_bytes, planned=state_dict)

    async def load_weight_parts(self, parts: AsyncIterable[dict[str, Any]], *, max_message_bytes: int | None = None,
                                planned: dict[str, Any] | None = None) -> None:
        """New weights in parts (each part a state dict of whole layers, e.g. a received bucket), in one
        layerwise-reload session: each part goes in messages of at most `max_message_bytes` (default: the
        engine's `max_message_mb`), then the names vLLM loaded are checked against those sent (EngineError
        naming the missing). Generation pauses for the push. `planned`: the whole state dict when known up
        front, so that a layer over the cap is refused before anything is sent."""
        cap = int(max_message_bytes or self.max_message_bytes)
        if planned is not None:
            chunks(self._sizes(planned), cap)
        sent: list[str] = []
        loaded: list[set[str]] | None = None  # per worker (tensor parallel ranks each load their shard)
        await self.engine.pause_generation(mode="wait")
        try:
            await self.engine.collective_rpc("begin_weight_push")
            try:
                async for part in parts:
                    for names in chunks(self._sizes(part), cap):
                        blob = self._blob({k: part[k] for k in names})
                        if len(blob) > cap:  # the header budget of weight_chunks.py was short: a bug, not input
                            raise EngineError(f"a weight message of {len(blob)} bytes passed the cap of {cap}")
                        got = await self.engine.collective_rpc("load_weight_chunk", args=(blob,))
                        del blob
                        loaded = loaded or [set() for _ in got]
                        for mine, theirs in zip(loaded, got, strict=True):
                            mine |= set(theirs)
                        sent += names
                    del part  # before the next part is received: one part held at a time
            finally:  # also after a failure: the model must not stay half restored on the meta device
                await self.engine.collective_rpc("end_weight_push")
            await self.engine.reset_prefix_cache()  # KV computed with the old weights must not be reused
        finally:
            await self.engine.resume_generation()
        everywhere = set.intersection(*loaded) if loaded else set()
        missing = not_loaded(sent, everywhere, self.tied_embeddings)
        if missing:
            raise not_loaded_error(missing, len(sent), f"vLLM ({self.model_path})")

    def _sizes(self, state: dict[str, Any]) -> dict[str, int]:
        """Bytes of each tensor as it travels (floating point in the engine's dtype)."""
        return {k: v.numel() * (self.weights_dtype.itemsize if v.is_floating_point() else v.element_size())
                for k, v in state.items()}

    def _blob(self, tensors: dict[str, Any]) -> bytes:
        """One message: the tensors on the CPU in the engine's dtype, as safetensors."""
        from safetensors.torch import save

        seen: set[int] = set()
        out = {}
        for k, v in tensors.items():  # tied weights (embed_tokens and lm_head) share storage: copy the second
            v = v.detach().to("cpu", self.weights_dtype if v.is_floating_point() else v.dtype).contiguous()
            ptr = v.untyped_storage().data_ptr()
            out[k] = v.clone() if ptr in seen else v
            seen.add(ptr)
        return save(out)

    # ---- vLLM's own weight transfer (GPU): the learner's rank 0 drives these through push/vllm.py RolloutClient
    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        if self.weight_transfer is None:
            raise EngineError("this vLLM engine was started without a weight transfer (CPU, or "
                              "weight_transfer=fallback): push with load_weights")
        await self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))

    async def start_weight_transfer(self) -> None:
        await self.engine.pause_generation(mode="wait")
        self._transfer = {"names": []}
        try:
            await self.engine.start_weight_update()
        except BaseException:
            await self.abort_weight_transfer()
            raise

    async def receive_weight_transfer(self, update_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        if self._transfer is None:
            raise EngineError("receive_weight_transfer before start_weight_transfer")
        await self.engine.update_weights(WeightTransferUpdateRequest(update_info=update_info))
        self._transfer["names"] += list(update_info["names"])

    async def finish_weight_transfer(self) -> None:
        """End the push (vLLM finishes its layerwise reload), then check the names loaded against those sent."""
        if self._transfer is None:
            raise EngineError("finish_weight_transfer before start_weight_transfer")
        sent, self._transfer = self._transfer["names"], None
        try:
            await self.engine.finish_weight_update()
            await self.engine.reset_prefix_cache()
        finally:
            await self.engine.resume_generation()
        got = await self.engine.collective_rpc("transferred_weight_names")
        missing = not_loaded(sent, set.intersection(*(set(g) for g in got)), self.tied_embeddings)
        if missing:
            raise not_loaded_error(missing, len(sent), f"vLLM ({self.model_path})")

    async def abort_weight_transfer(self) -> int:
        """After a push that failed at any phase (before anything was sent, half way, at finish): every worker ends
        its open layerwise reload (each module holds weights again: new where they arrived whole, old elsewhere)
        and takes the next push, and generation resumes. Returns how many names the workers had loaded (0: the
        engine serves exactly the previous weights; else a mix, until the next push replaces them all)."""
        self._transfer = None
        try:
            got = await self.engine.collective_rpc("abort_weight_transfer")
            await self.engine.reset_prefix_cache()
        finally:
            await self.engine.resume_generation()
        return max((g["loaded"] for g in got), default=0)

    async def shutdown_weight_transfer(self) -> None:
        await self.abort_weight_transfer()
        await self.engine.shutdown_weight_transfer_engine()


class TrainableHFEngine(HFEngine, TrainableEngine):
    """Sleep moves the model off the GPU, `load_weights` loads a state dict into it, `score` runs one forward pass:
    each under the engine's weights lock (never beside a batch's decoding)."""

    async def sleep(self, level: int = 1) -> None:
        """On a GPU the model moves to host memory (both levels: the hf engine has no KV cache to drop, and dropping
        its weights would need a push of all of them to wake); on the CPU nothing moves."""
        if self.device.type != "cpu":
            await asyncio.to_thread(self._move, torch.device("cpu"))

    async def wake_up(self, tags: list[str] | None = None) -> None:
        if self.device.type != "cpu" and (tags is None or "weights" in tags):
            await asyncio.to_thread(self._move, self.device)

    def _move(self, device: torch.device) -> None:
        with self._weights_lock:
            self.model.to(device)
        if device.type == "cpu" and torch.cuda.is_available():
            torch.cuda.empty_cache()

    async def load_weights(self, state_dict: dict[str, Any]) -> None:
        def load() -> None:
            with self._weights_lock:
                missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
                if unexpected:
                    raise EngineError(f"unexpected weights: {unexpected[:5]}")
        await asyncio.to_thread(load)

    @property
    def compute_dtype(self) -> str | None:  # type: ignore[override]
        return dtype_name(next(self.model.parameters()).dtype)

    async def score(self, ids: list[int], start: int) -> list[float]:
        """Teacher-forced logprobs of `ids[start:]` at temperature 1 (see TrainableEngine.score): one forward pass over
        the whole sequence, under the weights lock (never while a push loads, nor beside a batch's decoding)."""
        if not 1 <= start < len(ids) or len(ids) > self.context_length:
            raise EngineError(f"score needs 1 <= start < {len(ids)} tokens within the context "
                              f"({self.context_length}), not start {start}")

        @torch.inference_mode()
        def run() -> list[float]:
            with self._weights_lock:
                tokens = torch.tensor([ids], device=self.device)
                logits = self.model(input_ids=tokens, use_cache=False).logits[0, start - 1:-1].float()
                return torch.log_softmax(logits, -1).gather(-1, tokens[0, start:, None])[:, 0].tolist()

        return await asyncio.to_thread(run)
