"""GPU check: learner step throughput and MFU, hf-engine generation tokens/s, and hf-engine logprob parity
(GPU bf16 and GPU fp32 against CPU fp32), on a randomly initialised Qwen2 model of Qwen2.5-0.5B's shape; and a
memory probe against the memory plan on a Qwen3-14B-shaped model of 2 and 4 layers.

Made for a machine with torch and transformers only (no vLLM, no Ray, no network) and a copy of this
repository that is not pip-installed: it puts the repository root first on sys.path and maps
`rstar2_agent.train` onto the top-level train/ folder itself, as pyproject's package-dir does. The random model
and a minimal offline tokenizer are saved to a temporary folder, so the project's own code paths load them:

1. learner: `TorchLearner` (fp32 weights and AdamW, bf16 autocast) running `policy_update` (the old-logprob forward,
   then the GRPO-RoC PPO-clip forward and backward) on --batch sequences of --seq tokens in micro-batches of
   --micro-batch, then `optimizer_step`; tokens/s over --steps timed steps after --warmup,
   MFU = 8 * params * tokens/s / peak (2N for the old-logprob pass, 6N for the update).
2. generation: `HFEngine` (bf16 on CUDA) with --gen-batch concurrent requests of --gen-tokens new tokens each
   (ignore_eos, temperature 1), tokens/s.
3. parity: the per-token logprobs of those prompts + generated ids from one forward pass, on CPU fp32 (the
   reference), the engine's own model (GPU bf16) and a GPU fp32 copy; plus the engine's decode-time logprobs.
   Max and mean absolute differences. With --device cpu this is cpu-vs-cpu.
4. memory: one RL update of --mem-rows x --mem-tokens tokens (8192) on a random Qwen3-14B-shaped model (its real
   width, heads and vocabulary) with 2 and 4 layers, with and without gradient checkpointing, under autocast and in
   bf16 weights: the peak memory (torch.cuda.max_memory_allocated; on CPU the resident set's peak) beside the
   memory plan's estimate (train/plan/formulas.py), and the per-layer slope (4 layers minus 2) beside the plan's.
5. fork, sdpa, fsdp (bench/gpu_probes.py): a fork after the project's GPU count can still use CUDA (and one
   after torch.cuda.is_available() cannot); which SDPA kernels the learner's padded, unpadded and packed masks
   allow at --sdpa-seq on a Qwen3-14B attention; one FSDP2 rank over NCCL: an update, the optimizer step and the
   full-state gather.
6. push (bench/gpu_push.py): CUDA IPC handles made by this process and opened by another, unpacked (a copy of the
   weights) and packed (one reusable buffer): checksums, GB/s and the sender's peak against the buffer's bound; and
   the learner's bf16 against fp32 probe scores, the gap the push check calibrates its bound on.
7. colocated (bench/gpu_colocated.py): two RL steps as `placement: colocated` runs them on one GPU (the learner and
   an hf engine with weights of its own, sleeping through the update, the push in place, the push check): each
   phase's peak memory beside the plan's, learner tokens/s and MFU.

On the device machine (one H200, a few minutes):   bash bench/gpu_check.sh --out $OUT/gpu.json
Here, on CPU (seconds):                             .venv/bin/python bench/gpu_check.py --device cpu --tiny
Prints human-readable lines as it goes and one JSON object at the end (also written to --out). A failing part
is recorded under "errors" and the others still run; the exit status is 1 if any part failed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import math
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def say(msg: str) -> None:
    print(msg, flush=True)


def project_imports() -> None:
    """Import the project from this working tree whether or not it is installed: the repository root first on
    sys.path (it wins over an editable install's finder, which sits after the path finder), and
    `rstar2_agent.train` registered from train/ before anything imports it."""
    if "rstar2_agent.bench" in sys.modules:  # `rstar2 bench gpu`: the installed package is the project
        return
    sys.path.insert(0, str(ROOT))
    import rstar2_agent

    if Path(rstar2_agent.__file__).resolve().parent != ROOT / "rstar2_agent":
        raise RuntimeError(f"rstar2_agent came from {rstar2_agent.__file__}, not {ROOT}")
    if "rstar2_agent.train" not in sys.modules:
        spec = importlib.util.spec_from_file_location("rstar2_agent.train", ROOT / "train" / "__init__.py",
                                                      submodule_search_locations=[str(ROOT / "train")])
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["rstar2_agent.train"] = mod
        spec.loader.exec_module(mod)
        rstar2_agent.train = mod  # type: ignore[attr-defined]


def sibling(name: str) -> Any:
    """A module of bench/ beside this file, as a sibling (this file run as a script) or in its package (`rstar2 bench
    gpu`)."""
    import importlib

    return importlib.import_module(f".{name}", __package__) if __package__ else importlib.import_module(name)


def gpu_probes() -> Any:
    return sibling("gpu_probes")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def model_config(tiny: bool) -> Any:
    from transformers import Qwen2Config

    if tiny:
        return Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                           tie_word_embeddings=True, bos_token_id=1, eos_token_id=1, pad_token_id=0)
    # Qwen2.5-0.5B's shape (about 494M parameters with the tied embedding)
    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       bos_token_id=1, eos_token_id=1, pad_token_id=0)


def write_model(folder: Path, tiny: bool, device: torch.device) -> dict[str, Any]:
    """A random fp32 model and a three-token WordLevel tokenizer (pad 0, eos 1, unk 2: all the learner and the
    engine read of it; generation uses ignore_eos and no stop strings) saved as an HF folder."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    cfg = model_config(tiny)
    torch.manual_seed(0)
    with torch.device(device):  # initialising 0.5B parameters is much faster on the GPU
        model = AutoModelForCausalLM.from_config(cfg).float()
    params = sum(p.numel() for p in model.parameters())  # the tied embedding counts once
    model.save_pretrained(folder)
    del model
    free(device)
    tok = Tokenizer(WordLevel({"<pad>": 0, "<eos>": 1, "<unk>": 2}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                            unk_token="<unk>").save_pretrained(folder)
    return {"params": params, "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size}


def random_ids(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=g).tolist()  # no pad, eos or unk


# ---------------------------------------------------------------------------------------------------- 1. learner
def bench_learner(folder: Path, info: dict[str, Any], args: argparse.Namespace, device: torch.device
                  ) -> dict[str, Any]:
    from rstar2_agent.train.config import OptimConfig
    from rstar2_agent.train.learner.model import TorchLearner
    from rstar2_agent.train.learner.update import UpdateConfig, UpdateItem, policy_update

    steps, warmup = args.steps, args.warmup
    learner = TorchLearner(str(folder), OptimConfig(lr=1e-5, warmup_steps=0), total_steps=steps + warmup,
                           dtype="bf16" if device.type == "cuda" else "auto")
    if learner.device != device:  # Learner picks CUDA whenever it exists; --device cpu on a GPU machine
        learner.device = device
        learner.model.to(device)  # the optimizer's state is created lazily, on the first step
    say(f"learner: {info['params'] / 1e6:.1f}M params on {learner.device}, bf16 autocast {learner.bf16}")
    prompt = args.seq // 8
    ids = random_ids(args.batch, args.seq, info["vocab"], seed=1)
    # engine logprobs near a random model's own (about -log V), as a rollout engine's would be
    old = -math.log(info["vocab"])
    items = [UpdateItem(s[:prompt], s[prompt:], [1] * (args.seq - prompt), [old] * (args.seq - prompt),
                        1.0 if i % 2 else -1.0) for i, s in enumerate(ids)]
    cfg = UpdateConfig(micro_batch=args.micro_batch, pad_id=0)
    total = sum(len(it.response_ids) for it in items)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times: list[float] = []
    for i in range(warmup + steps):
        sync(device)
        t0 = time.perf_counter()
        metrics = policy_update(learner, items, cfg, total)
        metrics |= learner.optimizer_step()
        sync(device)
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
        say(f"  step {i} {'(warm-up) ' if i < warmup else ''}{dt:.3f}s loss {metrics['loss']:.4f} "
            f"grad_norm {metrics['grad_norm']:.3f}")
    step_s = sum(times) / len(times)
    tokens = args.batch * args.seq  # every token is computed (old-logprob forward, forward, backward)
    tok_s = tokens / step_s
    peak = args.peak_tflops * 1e12
    # 8N per token for the weights (2N old-logprob forward + 6N update); causal attention adds
    # 8 * layers * seq * hidden (12 L s d forward and backward + 4 L s d old-logprob forward, halved: causal)
    attn = 8 * info["layers"] * args.seq * info["hidden"]
    out = {"batch": args.batch, "seq": args.seq, "micro_batch": args.micro_batch, "steps": steps,
           "step_s": step_s, "tokens_per_s": tok_s, "mfu": 8 * info["params"] * tok_s / peak,
           "mfu_with_attention": (8 * info["params"] + attn) * tok_s / peak, "bf16_autocast": learner.bf16}
    if device.type == "cuda":
        out["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    say(f"learner: {step_s:.3f}s/step, {tok_s:,.0f} tokens/s, MFU {out['mfu']:.1%} "
        f"({out['mfu_with_attention']:.1%} counting attention) at {args.peak_tflops:g} TFLOPS peak")
    del learner
    free(device)
    return out


# ---------------------------------------------------------------------------------------------------- 2. generation
async def _generate(engine: Any, prompts: list[list[int]], new_tokens: int) -> list[Any]:
    from rstar2_agent.engines.base import SamplingParams

    return await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=1.0, top_p=1.0, seed=i,
                                                                    max_tokens=new_tokens, ignore_eos=True))
                                  for i, p in enumerate(prompts)))


async def bench_generation(folder: Path, info: dict[str, Any], args: argparse.Namespace, device: torch.device
                           ) -> tuple[dict[str, Any], Any, list[list[int]], list[Any]]:
    from rstar2_agent.engines.hf import HFEngine

    engine = HFEngine(str(folder), device=str(device), max_batch=max(32, args.gen_batch))
    dtype = next(engine.model.parameters()).dtype
    say(f"hf engine: {dtype} on {engine.device}")
    prompts = random_ids(args.gen_batch, args.gen_prompt, info["vocab"], seed=2)
    await _generate(engine, prompts, 4)  # warm-up: kernels, allocator
    batches = engine.batches
    sync(device)
    t0 = time.perf_counter()
    gens = await _generate(engine, prompts, args.gen_tokens)
    sync(device)
    dt = time.perf_counter() - t0
    tokens = sum(len(g.token_ids) for g in gens)
    out = {"requests": len(prompts), "prompt_tokens": args.gen_prompt, "new_tokens": args.gen_tokens,
           "tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt, "batches": engine.batches - batches,
           "dtype": str(dtype).removeprefix("torch.")}
    say(f"hf engine: {tokens} tokens in {dt:.2f}s = {tokens / dt:,.0f} tokens/s "
        f"({out['batches']} batch(es) of {len(prompts)})")
    return out, engine, prompts, gens


# ---------------------------------------------------------------------------------------------------- 3. parity
@torch.inference_mode()
def forward_logprobs(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """Logprob of each token given the ones before it (T = 1), as the learner computes them."""
    from rstar2_agent.train.loss import token_logprobs

    device = next(model.parameters()).device
    ids = ids.to(device)
    logits = model(input_ids=ids).logits.float()
    return token_logprobs(logits[:, :-1], ids[:, 1:], 1.0).float().cpu()


def diff(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    d = (a - b).abs()
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean())}


def parity(folder: Path, engine: Any, prompts: list[list[int]], gens: list[Any], args: argparse.Namespace,
           device: torch.device) -> dict[str, Any]:
    """Same ids everywhere: the first --parity-rows prompts with their generated tokens (equal lengths: the
    prompts are, and ignore_eos makes every generation --gen-tokens long, so no padding enters)."""
    from transformers import AutoModelForCausalLM

    rows = min(args.parity_rows, len(prompts))
    ids = torch.tensor([prompts[i] + gens[i].token_ids for i in range(rows)])
    p = len(prompts[0])
    cpu = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ref = forward_logprobs(cpu, ids)
    del cpu
    engine_lp = forward_logprobs(engine.model, ids)
    decode_lp = torch.tensor([gens[i].logprobs for i in range(rows)])  # the engine's, from its KV-cache decode
    engine_dtype = str(next(engine.model.parameters()).dtype).removeprefix("torch.")
    out: dict[str, Any] = {
        "mode": "gpu-vs-cpu" if device.type == "cuda" else "cpu-vs-cpu", "rows": rows, "tokens": int(ids.numel()),
        "reference": "cpu float32 forward", "ref_mean_logprob": float(ref.mean()),
        f"engine_{engine_dtype}_forward": diff(engine_lp, ref),
        # decode-time logprobs cover the generated tokens only (positions p.. of the sequence, p-1.. of ref)
        f"engine_{engine_dtype}_decode": diff(decode_lp, ref[:, p - 1:]),
        f"engine_{engine_dtype}_decode_vs_own_forward": diff(decode_lp, engine_lp[:, p - 1:]),
    }
    if device.type == "cuda":
        gpu32 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
        out["gpu_float32_forward"] = diff(forward_logprobs(gpu32, ids), ref)
        del gpu32
        free(device)
    for k, v in out.items():
        if isinstance(v, dict):
            say(f"parity {k}: max {v['max_abs']:.3g}, mean {v['mean_abs']:.3g}")
    return out


# ---------------------------------------------------------------------------------------------------- 4. memory
# the real Qwen3-14B's width, heads and vocabulary (layers: --mem-layers); small: the CPU test's; tiny: --tiny's
MEMORY_SHAPES = {"qwen3-14b": dict(hidden_size=5120, intermediate_size=17408, num_attention_heads=40,
                                   num_key_value_heads=8, head_dim=128, vocab_size=151936),
                 "small": dict(hidden_size=256, intermediate_size=768, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=64, vocab_size=4096),
                 "tiny": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=16, vocab_size=512)}


class PeakMemory:
    """Peak memory above the level at `start()`: torch.cuda.max_memory_allocated on a GPU; on CPU the process's peak
    resident set (VmHWM, reset through /proc/self/clear_refs) with glibc told to return every block of 64 KiB or
    more to the system when freed (mallopt: no dynamic mmap threshold, trimming at once), so that resident memory
    follows the live tensors instead of the allocator's free lists."""

    def __init__(self, device: torch.device):
        self.device, self.base = device, 0
        if device.type == "cpu":
            import ctypes

            self.libc = ctypes.CDLL("libc.so.6")
            self.libc.mallopt(-3, 65536)  # M_MMAP_THRESHOLD
            self.libc.mallopt(-1, 65536)  # M_TRIM_THRESHOLD

    @staticmethod
    def _status(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {key} in /proc/self/status")

    def start(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            self.libc.malloc_trim(0)
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
            self.base = self._status("VmRSS")

    def peak(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self.base
        return self._status("VmHWM") - self.base


def _probe_items(rows: int, seq: int, vocab: int) -> list[Any]:
    """`rows` trajectories, the first `seq` tokens long and the others a quarter shorter (so a micro-batch of several
    is right-padded and gets a 4D mask, as the RL learner's are), a prompt of seq / 8."""
    from rstar2_agent.train.learner.update import UpdateItem

    out = []
    for i, ids in enumerate(random_ids(rows, seq, vocab, seed=3)):
        n = seq if i == 0 else seq - seq // 4
        p = seq // 8
        out.append(UpdateItem(ids[:p], ids[p:n], [1] * (n - p), [-math.log(vocab)] * (n - p), 1.0 if i % 2 else -1.0))
    return out


def memory_probe(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """One RL update (`policy_update`: the old-logprob pass, then the PPO-clip forward and backward of one micro-batch
    of --mem-rows x --mem-tokens tokens) on a random Qwen3 model of --mem-shape at each of --mem-layers depths, with
    and without gradient checkpointing, in each precision: autocast (fp32 weights, bf16 autocast: one process) and
    bf16 (bf16 weights, no autocast: what FSDP2's MixedPrecisionPolicy computes in). The peak above the model, its
    gradients (allocated first) and its inputs, against the memory plan's estimate (plan/formulas.py `activations`,
    plus the autocast cache's weight copies)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from rstar2_agent.train.learner.model import TorchLearner
    from rstar2_agent.train.learner.update import UpdateConfig, policy_update
    from rstar2_agent.train.model_shape import from_config
    from rstar2_agent.train.plan.formulas import GIB, activations, compute_copies

    dims = MEMORY_SHAPES[args.mem_shape]
    rows, seq = args.mem_rows, args.mem_tokens
    meter = PeakMemory(device)
    runs = []
    for precision in [p.strip() for p in args.mem_precisions.split(",") if p.strip()]:
        for layers in [int(x) for x in args.mem_layers.split(",")]:
            for ckpt in (False, True):
                cfg = Qwen3Config(**dims, num_hidden_layers=layers, max_position_embeddings=max(4096, seq),
                                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=1, pad_token_id=0)
                torch.manual_seed(0)
                with torch.device(device):
                    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").float()
                if precision == "bf16":
                    model.to(torch.bfloat16)
                if ckpt:
                    model.gradient_checkpointing_enable()
                learner = TorchLearner.around(model, device, bf16=precision == "autocast")
                for p in model.parameters():  # the gradients exist before the peak is measured from
                    p.grad = torch.zeros_like(p)
                upd = UpdateConfig(micro_batch=rows, pad_id=0, logprob_chunk_tokens=args.mem_logits_chunk)
                warm = _probe_items(rows, 64, dims["vocab_size"])  # kernels and allocator set up, at a small size
                policy_update(learner, warm, upd, sum(len(i.response_ids) for i in warm))
                items = _probe_items(rows, seq, dims["vocab_size"])
                meter.start()
                policy_update(learner, items, upd, sum(len(i.response_ids) for i in items))
                measured = meter.peak()
                shape = from_config(cfg.to_dict())
                est = activations(shape, rows * seq, seq, precision=precision, checkpointing=ckpt, masked=rows > 1,
                                  logits_chunk=args.mem_logits_chunk)
                estimate = est.total + compute_copies(shape, precision, ckpt, 1)
                runs.append({"precision": precision, "layers": layers, "checkpointing": ckpt, "tokens": rows * seq,
                             "measured_gib": measured / GIB, "estimate_gib": estimate / GIB,
                             "ratio": measured / estimate})
                say(f"memory {precision} {layers} layers checkpointing {ckpt}: measured {measured / GIB:.3f} GiB, "
                    f"plan {estimate / GIB:.3f} GiB (x{measured / estimate:.2f})")
                del learner, model
                free(device)
    slopes = []
    by = {(r["precision"], r["layers"], r["checkpointing"]): r for r in runs}
    depths = sorted({r["layers"] for r in runs})
    for (precision, layers, ckpt), r in by.items():
        if layers == depths[-1] and len(depths) > 1:
            lo = by[(precision, depths[0], ckpt)]
            m, e = r["measured_gib"] - lo["measured_gib"], r["estimate_gib"] - lo["estimate_gib"]
            slopes.append({"precision": precision, "checkpointing": ckpt, "layers": f"{depths[0]}->{layers}",
                           "measured_gib": m, "estimate_gib": e, "ratio": m / e if e else None})
    return {"shape": args.mem_shape, "rows": rows, "seq": seq, "method": "cuda max_memory_allocated"
            if device.type == "cuda" else "VmHWM (clear_refs), mallopt mmap threshold 64 KiB", "runs": runs,
            "slopes": slopes}


# ---------------------------------------------------------------------------------------------------- main
# the parts `--skip` can leave out, in the order they run
PARTS = ("learner", "fork", "sdpa", "fsdp", "push_ipc", "push_probe", "generation", "parity", "memory", "colocated")


def skipped(text: str) -> set[str]:
    """The part names of a `--skip` value."""
    return {s.strip() for s in text.split(",") if s.strip()}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer, hidden-64 model and small sizes (CPU test)")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200: 989)")
    ap.add_argument("--batch", type=int, help="learner sequences per step (8; tiny 4)")
    ap.add_argument("--seq", type=int, help="learner tokens per sequence (2048; tiny 64)")
    ap.add_argument("--micro-batch", type=int, help="sequences per forward pass (4; tiny 2)")
    ap.add_argument("--steps", type=int, default=5, help="timed learner steps")
    ap.add_argument("--warmup", type=int, default=2, help="learner steps before timing")
    ap.add_argument("--gen-batch", type=int, help="concurrent generation requests (16; tiny 4)")
    ap.add_argument("--gen-prompt", type=int, help="prompt tokens (128; tiny 16)")
    ap.add_argument("--gen-tokens", type=int, help="new tokens per request (256; tiny 16)")
    ap.add_argument("--parity-rows", type=int, default=4, help="generations compared for logprob parity")
    ap.add_argument("--sdpa-seq", help="sequence lengths of the SDPA kernel probe (8192,12288; tiny 64)")
    ap.add_argument("--fsdp-seq", type=int, help="tokens per sequence of the one-rank FSDP2 step (1024; tiny 32)")
    ap.add_argument("--ipc-total-mb", type=float, help="push probe: MB of bf16 weights pushed over CUDA IPC (1024; "
                    "tiny 32)")
    ap.add_argument("--ipc-buffer-mb", type=float, help="push probe: the packed buffer (128; tiny 16)")
    ap.add_argument("--mem-shape", choices=sorted(MEMORY_SHAPES), help="memory probe's model (qwen3-14b; tiny tiny)")
    ap.add_argument("--mem-tokens", type=int, help="memory probe: tokens of the longest trajectory (8192; tiny 128)")
    ap.add_argument("--mem-rows", type=int, help="memory probe: trajectories in the micro-batch (1; tiny 2)")
    ap.add_argument("--mem-logits-chunk", type=int, default=0,
                    help="memory probe: the LM head's token chunk (0: full fp32 logits, the plan's checked case)")
    ap.add_argument("--mem-layers", default="2,4", help="memory probe: the depths (comma-separated)")
    ap.add_argument("--mem-precisions", default="autocast,bf16", help="memory probe: autocast and/or bf16")
    ap.add_argument("--skip", default="", help=f"comma-separated parts to skip: {', '.join(PARTS)}")
    args = ap.parse_args(argv)
    unknown = sorted(skipped(args.skip) - set(PARTS))
    if unknown:  # a misspelled part would otherwise run, unnoticed
        ap.error(f"--skip: no part named {', '.join(unknown)}; the parts: {', '.join(PARTS)}")
    sizes = {"batch": (8, 4), "seq": (2048, 64), "micro_batch": (4, 2), "gen_batch": (16, 4),
             "gen_prompt": (128, 16), "gen_tokens": (256, 16), "mem_shape": ("qwen3-14b", "tiny"),
             "mem_tokens": (8192, 128), "mem_rows": (1, 2), "sdpa_seq": ("8192,12288", "64"), "fsdp_seq": (1024, 32),
             "ipc_total_mb": (1024.0, 32.0), "ipc_buffer_mb": (128.0, 16.0)}
    for k, (full, tiny) in sizes.items():
        if getattr(args, k) is None:
            setattr(args, k, tiny if args.tiny else full)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    t_start = time.perf_counter()
    project_imports()
    import transformers

    device = torch.device(args.device)
    skip = skipped(args.skip)
    result: dict[str, Any] = {
        "device": str(device), "tiny": args.tiny, "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "peak_tflops": args.peak_tflops, "errors": {}}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)  # fp32 matmuls stay IEEE (torch's default: no TF32)
    say(f"gpu_check on {result.get('gpu', device)}: torch {torch.__version__}, transformers {transformers.__version__}")

    def part(name: str, fn: Any, *a: Any) -> Any:
        if name in skip:
            return None
        try:
            return fn(*a)
        except Exception as e:  # noqa: BLE001 - record it and go on with the other parts
            traceback.print_exc()
            result["errors"][name] = f"{type(e).__name__}: {e}"[:2000]
            free(device)
            return None

    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        info = part("model", write_model, folder, args.tiny, device)
        if info is None:
            return finish(result, args, t_start)
        result["model"] = info | {"write_s": time.perf_counter() - t0}
        say(f"random model: {info['params'] / 1e6:.1f}M params written in {result['model']['write_s']:.1f}s")
        result["learner"] = part("learner", bench_learner, folder, info, args, device)
        probes = gpu_probes()
        result["fork"] = part("fork", probes.fork_poison, ROOT)
        result["sdpa"] = part("sdpa", probes.sdpa_kernels, [int(x) for x in args.sdpa_seq.split(",")], device)
        result["fsdp"] = part("fsdp", probes.fsdp_one_rank, folder, device, args.fsdp_seq, 2)
        push = sibling("gpu_push")
        result["push_ipc"] = part("push_ipc", push.ipc, device, args.ipc_total_mb, args.ipc_buffer_mb)
        result["push_probe"] = part("push_probe", push.probe, folder, device)
        free(device)

        loop = asyncio.new_event_loop()  # one loop for the engine's life: its worker task lives on it
        try:
            got = part("generation", lambda: loop.run_until_complete(bench_generation(folder, info, args, device)))
            if got is not None:
                result["generation"], engine, prompts, gens = got
                if "parity" not in skip:
                    result["parity"] = part("parity", parity, folder, engine, prompts, gens, args, device)
                loop.run_until_complete(engine.close())
                del engine
                free(device)
            elif "parity" not in skip:
                result["errors"].setdefault("parity", "needs the generation part's output")
        finally:
            loop.close()
    result["memory"] = part("memory", memory_probe, args, device)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:  # 7. the colocated step, on a model of its own
        folder = Path(tmp)
        colocated = part("model", write_model, folder, args.tiny, device) if "colocated" not in skip else None
        if colocated is not None:
            result["colocated"] = part("colocated", sibling("gpu_colocated").colocated_step, folder, colocated, args,
                                       device, PeakMemory(device), say)
            free(device)
    return finish(result, args, t_start)


def finish(result: dict[str, Any], args: argparse.Namespace, t_start: float) -> int:
    result["wall_s"] = time.perf_counter() - t_start
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    say(text)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
