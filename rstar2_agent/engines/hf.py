"""The `hf` engine: a transformers causal LM with its own decode loop, batching requests that arrive together.

It is the learner's engine (training shares these weights) and the one that runs anywhere torch runs.
Requests are gathered for a few milliseconds and decoded as one left-padded batch with a KV cache; each
row keeps its own sampling settings, seed, token budget and stop conditions.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from .base import Engine, EngineError, Generation, OnTokens, SamplingParams

log = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    on_tokens: OnTokens | None
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    stop_text: str | None = None


class HFEngine(Engine):
    """Inference with transformers. Training drives its subclass (train/rollout/trainable.py: moving the model off
    the GPU while a learner updates, scoring, loading pushed weights), under the same weights lock."""

    name = "hf"

    def __init__(self, model_path: str, *, device: str | None = None, dtype: torch.dtype | None = None,
                 max_batch: int = 32, batch_wait_s: float = 0.005, context_length: int | None = None,
                 model: Any = None, tokenizer: Any = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_path = model_path
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path)
        self.model = model or AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(self.device)
        self.model.eval()
        self.context_length = context_length or int(getattr(self.model.config, "max_position_embeddings", 4096))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.eos_ids = {self.tokenizer.eos_token_id}
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        self.eos_ids |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        self.max_batch, self.batch_wait_s = max_batch, batch_wait_s
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task | None = None
        self._weights_lock = threading.Lock()
        self.batches = 0  # how many batches ran (tests and the bench read it)

    # ------------------------------------------------------------------ async side
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_tokens: OnTokens | None = None) -> Generation:
        if not prompt_ids:
            raise EngineError("empty prompt")
        if sampling.constraint is not None:
            raise EngineError("the hf engine cannot constrain decoding (SamplingParams.constraint: tool_choice "
                              '"required" or a named function): use the vllm engine (--engine vllm), or tool_choice '
                              '"auto" with the call asked for in the prompt')
        if len(prompt_ids) >= self.context_length:
            raise EngineError(f"prompt of {len(prompt_ids)} tokens does not fit the context ({self.context_length})")
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._worker = asyncio.create_task(self._serve())
        req = _Request(list(prompt_ids), sampling, asyncio.get_running_loop().create_future(), on_tokens)
        await self._queue.put(req)
        return await req.future

    async def _serve(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            # Let concurrent callers join this batch: keep gathering while requests arrive less than
            # batch_wait_s apart (callers that render their prompts one after another), for at most 10 waits.
            deadline = loop.time() + 10 * self.batch_wait_s
            while len(batch) < self.max_batch and (left := deadline - loop.time()) > 0:
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), min(self.batch_wait_s, left)))
                except TimeoutError:
                    break
            batch = [r for r in batch if not r.future.cancelled()]
            if not batch:
                continue
            try:
                await asyncio.to_thread(self._decode, batch, loop)
            except Exception as e:  # noqa: BLE001 - surface to every caller of this batch
                log.exception("hf engine batch failed")
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(EngineError(f"hf engine failed: {e}"))
                continue
            for r in batch:
                if not r.future.done():
                    r.future.set_result(Generation(r.out, r.logprobs, r.finish or "length", r.stop_text))

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            self._worker = None
            self._queue = None

    # ------------------------------------------------------------------ decode loop (worker thread)
    @torch.inference_mode()
    def _decode(self, batch: list[_Request], loop: asyncio.AbstractEventLoop) -> None:
        from transformers import DynamicCache

        with self._weights_lock:
            self.batches += 1
            n = len(batch)
            width = max(len(r.prompt_ids) for r in batch)
            ids = torch.full((n, width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((n, width), dtype=torch.long)
            for i, r in enumerate(batch):
                ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
                mask[i, width - len(r.prompt_ids):] = 1
            ids, mask = ids.to(self.device), mask.to(self.device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            temps = torch.tensor([max(r.sampling.temperature, 0.0) for r in batch], device=self.device)
            top_p = torch.tensor([r.sampling.top_p for r in batch], device=self.device)
            gens = [self._generator(r.sampling.seed) for r in batch]
            budgets = [min(r.sampling.max_tokens, self.context_length - len(r.prompt_ids)) for r in batch]
            cache = DynamicCache()
            # the head at the last position only: the prompt's other logits would be dropped (a vocabulary's worth
            # per prompt token, most of a small model's prefill)
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                                use_cache=True, logits_to_keep=1).logits[:, -1, :].float()
            active = [b > 0 for b in budgets]
            for i, r in enumerate(batch):
                if not active[i]:
                    r.finish = "length"
            last_pos = positions[:, -1]
            while any(active):
                tokens, logps = self._sample(logits, temps, top_p, gens)
                for i, r in enumerate(batch):
                    if not active[i]:
                        continue
                    tok = int(tokens[i])
                    r.out.append(tok)
                    r.logprobs.append(float(logps[i]))
                    if r.on_tokens is not None:
                        loop.call_soon_threadsafe(r.on_tokens, [tok], [float(logps[i])])
                    if (tok in self.eos_ids and not r.sampling.ignore_eos) or tok in r.sampling.stop_token_ids:
                        r.finish, active[i] = "stop", False
                    elif self._hit_stop(r):
                        r.finish, active[i] = "stop", False
                    elif len(r.out) >= budgets[i]:
                        r.finish, active[i] = "length", False
                if all(not a or r.future.cancelled() for r, a in zip(batch, active, strict=True)):
                    break
                step = tokens.view(n, 1).to(self.device)
                mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=self.device)], dim=1)
                last_pos = last_pos + 1
                logits = self.model(input_ids=step, attention_mask=mask, position_ids=last_pos.view(n, 1),
                                    past_key_values=cache, use_cache=True).logits[:, -1, :].float()

    def _generator(self, seed: int | None) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
        return g

    @staticmethod
    def _sample(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor,
                gens: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row: greedy at temperature 0, else temperature + nucleus sampling. The logprob is that of the
        chosen token under the distribution sampled from (softmax(logits / T), renormalized over the top-p
        set), as vLLM's processed logprobs; greedy rows report the raw model logprob."""
        greedy = temps <= 0
        t = torch.where(greedy, torch.ones_like(temps), temps).unsqueeze(-1)
        probs = torch.softmax(logits / t, dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True)
        cut = (sorted_p.cumsum(-1) - sorted_p) > top_p.unsqueeze(-1)
        sorted_p = sorted_p.masked_fill(cut & ~greedy.unsqueeze(-1), 0.0)
        sorted_p = sorted_p / sorted_p.sum(-1, keepdim=True)
        choice = torch.empty(len(gens), dtype=torch.long, device=logits.device)
        chosen_p = torch.empty(len(gens), dtype=probs.dtype, device=logits.device)
        for i, g in enumerate(gens):
            k = 0 if bool(greedy[i]) else int(torch.multinomial(sorted_p[i], 1, generator=g))
            choice[i], chosen_p[i] = order[i, k], sorted_p[i, k]
        return choice, chosen_p.clamp_min(1e-30).log()

    def _hit_stop(self, r: _Request) -> bool:
        """A stop string is complete in the generated text (checked on the tail: it is new each step)."""
        if not r.sampling.stop:
            return False
        tail = self.tokenizer.decode(r.out[-32:], skip_special_tokens=False)
        for s in r.sampling.stop:
            if s in tail:
                r.stop_text = s
                return True
        return False
