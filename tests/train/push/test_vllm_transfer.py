"""The push through vLLM's own weight transfer (train/push/vllm_transfer_config.py), as far as a CPU can build it:
NCCL, and so vLLM's transfer engines' receive and the trainer's broadcast, run only on GPUs (the GPU path's first
push is their test). Here: the engine config that turns it on, the backend vLLM's factory resolves, the source vLLM's
trainer engine checks element by element against what it declared, and the rank offsets of several engines."""

from __future__ import annotations

import pytest
import torch

from rstar2_agent.train.push.vllm import RolloutClient, source
from rstar2_agent.train.push.vllm_transfer_config import BACKEND, IPC_BACKEND, register, transfer_config


def test_vllms_transfer_is_what_the_push_chose_and_needs_a_gpu():
    assert transfer_config(on_gpu=True, weight_transfer="nccl") == {"backend": BACKEND}
    assert transfer_config(on_gpu=True, weight_transfer="ipc") == {"backend": IPC_BACKEND}
    assert transfer_config(on_gpu=False, weight_transfer=None) is None  # the chunked push
    assert transfer_config(on_gpu=True, weight_transfer=None) is None
    with pytest.raises(ValueError, match="needs a GPU"):
        transfer_config(on_gpu=False, weight_transfer="nccl")
    with pytest.raises(ValueError, match="nccl, ipc or None"):
        transfer_config(on_gpu=True, weight_transfer="vllm")
    client = RolloutClient([object(), object()], [1, 1], 10.0, ipc=True)
    assert client.init_payloads({"packed": False}) == [{"packed": False}] * 2  # IPC has no group, so no rank offsets


def test_vllm_takes_the_transfer_config_and_resolves_the_backend(smol):
    """vLLM's engine arguments take the config as the engine passes it, and its factory (in a worker: after
    vllm_worker_extension.py's import registered it) resolves the backend to vLLM's NCCL engine that keeps loaded
    names."""
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = AsyncEngineArgs(model=smol.path, weight_transfer_config=transfer_config(True, "nccl"))
    assert isinstance(args.weight_transfer_config, WeightTransferConfig)
    assert args.weight_transfer_config.backend == BACKEND
    import rstar2_agent.train.push.vllm_worker_extension  # noqa: F401 - what a vLLM worker imports: it registers the backend

    register()  # twice is harmless
    engine_cls = WeightTransferEngineFactory._registry[BACKEND]()
    assert issubclass(engine_cls, NCCLWeightTransferEngine) and engine_cls.__name__ == "CheckedNCCLEngine"
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine

    ipc_cls = WeightTransferEngineFactory._registry[IPC_BACKEND]()  # the colocated push's, names checked the same way
    assert issubclass(ipc_cls, IPCWeightTransferEngine) and ipc_cls.__name__ == "CheckedIPCEngine"


def test_the_source_is_what_vllms_trainer_engine_declared_in_bf16(tiny_smollm2):
    """vLLM's trainer engine sizes the workers' receive buffers from the source's metadata and checks each tensor
    it sends against it (a mismatch would hang NCCL or load garbage): the source passes that check, sends bf16 for
    the fp32 learner, the tied lm_head once (vLLM ties it itself), and keeps a CPU copy of all it sent."""
    from transformers import AutoModelForCausalLM
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_smollm2, dtype=torch.float32)
    kept: dict[str, torch.Tensor] = {}
    src = source(model, torch.bfloat16, keep=kept)
    meta = src.metadata()
    assert "lm_head.weight" not in {m.name for m in meta} and all(m.dtype == torch.bfloat16 for m in meta)
    sent = dict(NCCLTrainerWeightTransferEngine._checked_iter(src, meta))
    assert list(sent) == [m.name for m in meta] == list(kept)
    state = model.state_dict()
    for name, t in sent.items():
        assert t.dtype == torch.bfloat16 and torch.equal(t, state[name].to(torch.bfloat16))
        assert torch.equal(kept[name], t)
    assert len(list(src)) == len(meta)  # a fresh pass each round


def test_each_rollout_engine_gets_its_own_ranks_in_the_one_group():
    """vLLM's trainer engine gives its one engine rank offset 1; with three engines of tensor parallel 2 each takes
    the next two ranks of the group of 7, and vLLM's own init info takes each payload."""
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload

    client = RolloutClient([object()] * 3, [2, 2, 2], timeout_s=1)
    assert client.offsets() == [1, 3, 5]
    payload = worker_init_payload(NCCLWeightTransferInitInfo(  # what vLLM's trainer engine hands the client
        master_address="10.0.0.1", master_port=29600, rank_offset=1, world_size=7, packed=True))
    infos = [NCCLWeightTransferInitInfo(**p) for p in client.init_payloads(payload)]
    assert [(i.rank_offset, i.world_size) for i in infos] == [(1, 7), (3, 7), (5, 7)]


def test_the_backend_keeps_the_names_its_model_loaded_with_a_fake_broadcast(monkeypatch):
    """vLLM's NCCL engine hands each received bucket to its model's load_weights and drops the names it returns;
    the backend keeps them for the push's check. NCCL cannot run here, so vLLM's packed receive is replaced by a
    fake that hands two buckets on as the real one does (named for it); the model is left as it was."""
    from vllm.distributed.weight_transfer import nccl_engine
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    from rstar2_agent.train.push.vllm_transfer_backends import CheckedNCCLEngine

    class Model(torch.nn.Module):
        def load_weights(self, weights):
            return {name.replace("q_proj", "qkv_proj") for name, _ in weights if "bogus" not in name}

    def fake_packed_receive(iterator, post_unpack_func, **_):
        items = [(name, torch.zeros(shape, dtype=dtype)) for name, (shape, dtype) in iterator]
        post_unpack_func(items[:1])
        post_unpack_func(items[1:])

    monkeypatch.setattr(nccl_engine, "packed_nccl_broadcast_consumer", fake_packed_receive)
    engine = object.__new__(CheckedNCCLEngine)  # vLLM's constructor needs a worker's config
    model = Model()
    engine.model, engine.model_update_group, engine.packed, engine.device = model, object(), True, "cpu"
    engine.packed_buffer_size_bytes, engine.packed_num_buffers = 1 << 20, 2
    engine.loaded = set()  # what start_weight_update sets (it also starts vLLM's layerwise reload)
    engine.receive_weights(NCCLWeightTransferUpdateInfo(
        names=["model.layers.0.self_attn.q_proj.weight", "model.layers.0.bogus.weight"],
        dtype_names=["bfloat16", "bfloat16"], shapes=[[4, 4], [4]]))
    assert engine.loaded == {"model.layers.0.self_attn.qkv_proj.weight"}
    assert "load_weights" not in vars(model) and model.load_weights.__func__ is Model.load_weights


def test_the_engine_arguments_on_a_gpu_and_on_the_cpu_build_without_a_gpu(smol):
    """What a GPU run hands vLLM, built here without one: vLLM's own server's step budget (8,192 tokens, not the
    engine arguments' 2,048 fallback) and chunked prefill left on, the share of the device; on the CPU build a capped
    KV cache and every prefill in one step. The core's engine names nothing of training; the trainable engine adds
    the worker extension and the weight transfer (`_engine_args`). vLLM's pinned AsyncEngineArgs takes every set."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from rstar2_agent.engines.vllm import DEFAULT_GPU_SHARE, GPU_BATCHED_TOKENS, engine_args
    from rstar2_agent.train.rollout.trainable import WORKER_EXTENSION, TrainableVLLMEngine

    def trainable(args, on_gpu, weight_transfer):
        engine = object.__new__(TrainableVLLMEngine)  # the hook alone: no engine is started
        engine._asked = {"weight_transfer": weight_transfer, "sleep_mode": False}
        return engine._engine_args(dict(args), on_gpu)

    gpu = engine_args(str(smol), on_gpu=True, context_length=12288)
    assert gpu["max_num_batched_tokens"] == GPU_BATCHED_TOKENS == 8192 and "enable_chunked_prefill" not in gpu
    assert gpu["gpu_memory_utilization"] == DEFAULT_GPU_SHARE and "kv_cache_memory_bytes" not in gpu
    assert gpu["enforce_eager"] is False and gpu["dtype"] == "auto"  # the model's own (bf16 for Qwen3)
    assert "worker_extension_cls" not in gpu and "weight_transfer_config" not in gpu  # serve's and eval's engine
    pushed = trainable(gpu, True, "nccl")
    assert pushed["weight_transfer_config"] == {"backend": BACKEND}
    assert pushed["worker_extension_cls"] == WORKER_EXTENSION
    mine = engine_args(str(smol), on_gpu=True, context_length=12288, max_num_batched_tokens=16384,
                       gpu_memory_utilization=0.5)
    assert mine["max_num_batched_tokens"] == 16384 and mine["gpu_memory_utilization"] == 0.5
    assert "weight_transfer_config" not in trainable(mine, True, None)
    cpu = engine_args(str(smol), on_gpu=False, context_length=4096, kv_cache_gib=1.5)
    assert cpu["max_num_batched_tokens"] == 4096 and cpu["enable_chunked_prefill"] is False
    assert cpu["kv_cache_memory_bytes"] == int(1.5 * 2**30) and cpu["dtype"] == "bfloat16"
    assert "weight_transfer_config" not in cpu and "gpu_memory_utilization" not in cpu
    chunked = trainable(cpu, False, None)  # the chunked push: the worker extension, no transfer of vLLM's
    assert chunked["worker_extension_cls"] == WORKER_EXTENSION and "weight_transfer_config" not in chunked
    for args in (gpu, pushed, mine, cpu, chunked):
        AsyncEngineArgs(**args)  # every name is one vLLM 0.32 knows


def test_a_vllm_worker_imports_the_worker_extension_and_nothing_else_of_training():
    """vLLM imports the worker extension by its path in every worker (which runs train/__init__.py and
    train/push/__init__.py): that brings the push's config types and the backends' registration, not the learner,
    the rollouts, Ray or the trainer's side of the push."""
    import json
    import subprocess
    import sys

    from rstar2_agent.train.rollout.trainable import WORKER_EXTENSION

    module, _, cls = WORKER_EXTENSION.rpartition(".")
    code = (f"import sys, importlib; getattr(importlib.import_module({module!r}), {cls!r}); "
            "import json; print(json.dumps(sorted(m for m in sys.modules if m.startswith('rstar2_agent.train') "
            "or m == 'ray')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == sorted(["rstar2_agent.train", "rstar2_agent.train.config", "rstar2_agent.train.push",
                                "rstar2_agent.train.push.error", "rstar2_agent.train.push.vllm_transfer_config",
                                module])
