"""The learner's sharded checkpoints (train/learner/checkpoint.py) on the 2-layer SmolLM2, with real gloo ranks (each
a process, as torchrun and Ray start them): saved on 2 ranks and resumed on 1, and the reverse, the weights and the
AdamW state equal; the HF export, gathered a file per rank, loads in transformers with the names save_pretrained
writes; a write made slow on one rank does not meet the learner group's (short) timeout, and one slower than the
checkpoint's own timeout fails saying which setting to raise; a checkpoint of the earlier layout still resumes, and a
model folder given to resume says what to do."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from rstar2_agent.train.config import CheckpointConfig, OptimConfig
from rstar2_agent.train.learner.checkpoint import CheckpointError
from rstar2_agent.train.learner.model import TorchLearner

OPTIM = OptimConfig(lr=1e-3, warmup_steps=0, schedule="cosine", weight_decay=0.01)
SLOW_S = 12.0  # a write made this slow ...
GROUP_TIMEOUT_S = 4.0  # ... is longer than the learner group's timeout in the slow-write test


def _steps(learner: TorchLearner, n: int) -> None:
    """`n` optimizer steps on a fixed batch that differs by rank (so the ranks' gradients differ)."""
    g = torch.Generator().manual_seed(1000 * learner.step + learner.rank)
    for _ in range(n):
        ids = torch.randint(0, 1000, (2, 24), generator=g)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        learner.sft_loss(batch, denominator=48).backward()
        learner.optimizer_step()


def _full(learner: TorchLearner) -> dict:
    """The whole state, gathered (rank 0 holds it): weights, the optimizer by parameter name, step and lr."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    many = learner.world > 1
    optim = get_optimizer_state_dict(learner.model, learner.optimizer,
                                     options=StateDictOptions(full_state_dict=many, cpu_offload=many))
    weights = {k: v.detach().cpu().clone() for k, v in learner.full_state_dict().items()}
    return {"weights": weights, "optim": optim, "step": learner.step, "lr": learner.scheduler.get_last_lr()}


def _slow(seconds: float, what: str) -> None:
    """Make this rank's writes of `what` (dcp: its DCP shards; export: its HF export files) `seconds` slower."""
    if what == "dcp":
        from torch.distributed.checkpoint.filesystem import FileSystemWriter

        real = FileSystemWriter.write_data

        def write_data(self, *a, **kw):
            time.sleep(seconds)
            return real(self, *a, **kw)

        FileSystemWriter.write_data = write_data
    else:
        from rstar2_agent.train.learner import checkpoint

        real_file = checkpoint.save_file

        def save_file(*a, **kw):
            time.sleep(seconds)
            return real_file(*a, **kw)

        checkpoint.save_file = save_file


def _rank(rank: int, world: int, port: int, job: str, model: str, folder: str, out: str, opts: dict) -> None:
    """One rank (torch.multiprocessing.spawn): build the learner, then `job`: save (two steps, then the checkpoint,
    then one more step, which needs the group intact) or load; rank 0 writes the gathered state to `out`."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK="0")
    torch.set_num_threads(1)
    learner = TorchLearner(model, OPTIM, 10, dtype="fp32", checkpoint=CheckpointConfig(**opts.get("checkpoint", {})),
                           group_timeout_s=opts.get("group_timeout_s", 600.0))
    if world > 1:  # the ranks start together, so only the slow write below can outlast the group's timeout
        torch.distributed.barrier(group=learner.io_group)
    if job == "save":
        _steps(learner, 2)
        for what, who in opts.get("slow", {}).items():
            if who == rank:
                _slow(SLOW_S, what)
        learner.save(folder, {"stage": 0}, {"format": "hermes", "step": learner.step})
        state = _full(learner)
        if rank == 0:  # before the next step, which moves the optimizer's tensors in place
            torch.save(state, out)
        _steps(learner, 1)  # the learner group's collectives still work after the save
    else:
        learner.load_state(folder)
        state = _full(learner)
        if rank == 0:
            torch.save(state, out)
    learner.close()


def _run(world: int, job: str, model: str, folder: Path, out: Path, **opts) -> dict:
    from conftest import free_port

    torch.multiprocessing.spawn(_rank, args=(world, free_port(), job, model, str(folder), str(out), opts),
                                nprocs=world, join=True)
    return torch.load(out, weights_only=False)


def _assert_same(a: dict, b: dict) -> None:
    assert a["step"] == b["step"] and a["lr"] == b["lr"]
    assert a["weights"].keys() == b["weights"].keys()
    for k, v in a["weights"].items():
        assert torch.equal(v, b["weights"][k]), k
    sa, sb = a["optim"]["state"], b["optim"]["state"]
    assert sa.keys() == sb.keys() and sa
    for name, s in sa.items():
        assert s.keys() == sb[name].keys() == {"step", "exp_avg", "exp_avg_sq"}, name
        for k, v in s.items():
            assert torch.equal(v.cpu(), sb[name][k].cpu()), (name, k)
    assert [g["lr"] for g in a["optim"]["param_groups"]] == [g["lr"] for g in b["optim"]["param_groups"]]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("saved_on", "resumed_on"), [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_on_another_number_of_ranks_with_the_same_state(tmp_path, tiny_smollm2, saved_on,
                                                                               resumed_on):
    """DCP reshards: each rank wrote its own shards, and a resume on another number of ranks reads its own slices
    of them. The export is cut into small files (0.1 MB) so the 2 ranks gather and write several, in rounds."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "checkpoint-2"
    opts = {"checkpoint": {"export_shard_mb": 0.1}}
    saved = _run(saved_on, "save", tiny_smollm2, folder, tmp_path / "saved.pt", **opts)
    assert sorted(p.name for p in (folder / "dcp").iterdir()) == [".metadata"] + [f"__{r}_0.distcp"
                                                                                 for r in range(saved_on)]
    assert not (tmp_path / "checkpoint-2.tmp").exists()
    resumed = _run(resumed_on, "load", str(folder), folder, tmp_path / "resumed.pt", **opts)
    _assert_same(saved, resumed)
    assert saved["step"] == 2 and json.loads((folder / "rstar2.json").read_text())["step"] == 2
    assert torch.load(folder / "trainer_state.pt", weights_only=False)["stage"] == 0

    # the export: the names and shapes save_pretrained writes (the tied lm_head once, under the embedding), split
    # into files by the index, and transformers loads exactly the saved weights from it
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) >= 3
    exported = {}
    for name in set(index.values()):
        with safe_open(folder / name, "pt") as f:
            exported |= {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open is not a dict
    assert exported.keys() == index.keys()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.save_pretrained(tmp_path / "hf")
    with safe_open(tmp_path / "hf" / "model.safetensors", "pt") as f:
        assert {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()} == {  # noqa: SIM118
            k: tuple(v.shape) for k, v in exported.items()}
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved["weights"][k]), k
    for name in ("config.json", "generation_config.json"):  # as save_pretrained writes them (not FSDPLlama...)
        assert json.loads((folder / name).read_text()) == json.loads((tmp_path / "hf" / name).read_text())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_slow_write_on_one_rank_does_not_meet_the_group_timeout(tmp_path, tiny_smollm2):
    """The learner group's timeout is short (4 s); rank 1's DCP shards and rank 0's export files each take 12 s to
    write. The other rank waits on the checkpoint's own group (its timeout sized for the write), never in the
    learner group's collectives, so the save succeeds and the step after it runs."""
    folder = tmp_path / "checkpoint-2"
    saved = _run(2, "save", tiny_smollm2, folder, tmp_path / "saved.pt", group_timeout_s=GROUP_TIMEOUT_S,
                 slow={"dcp": 1, "export": 0}, checkpoint={"timeout_s": 120.0})
    assert saved["step"] == 2 and (folder / "dcp" / ".metadata").is_file() and (folder / "model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_write_slower_than_the_checkpoint_timeout_fails_naming_it(tmp_path, tiny_smollm2):
    folder = tmp_path / "checkpoint-2"
    with pytest.raises(Exception, match=r"checkpoint\.timeout_s"):
        _run(2, "save", tiny_smollm2, folder, tmp_path / "saved.pt", slow={"dcp": 1}, checkpoint={"timeout_s": 3.0})
    assert not folder.exists()


@pytest.mark.slow
def test_the_export_in_bf16_resumes_the_fp32_weights(tmp_path, tiny_smollm2):
    """`export_dtype: bf16` halves the HF export; a resume takes the fp32 weights from the sharded state, not the
    rounded export. One process writes the same layout as the ranks. A save before the first step leaves the
    optimizer as it was."""
    from safetensors import safe_open

    learner = TorchLearner(tiny_smollm2, OPTIM, 10, dtype="fp32", checkpoint=CheckpointConfig(export_dtype="bf16"))
    # saved before any step, AdamW has no state yet: DCP's zero one is not left behind, nor made on resume
    first = learner.save(tmp_path / "checkpoint-0", {}, {})
    assert not learner.optimizer.state
    fresh = TorchLearner(str(first), OPTIM, 10, dtype="fp32")
    fresh.load_state(first)
    assert not fresh.optimizer.state and fresh.step == 0
    _steps(learner, 2)
    folder = learner.save(tmp_path / "checkpoint-2", {"stage": 0}, {"format": "hermes"})
    with safe_open(folder / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    assert (folder / "dcp" / "__0_0.distcp").is_file() and (folder / "tokenizer.json").is_file()
    saved = _full(learner)
    resumed = TorchLearner(str(folder), OPTIM, 10, dtype="fp32")  # built from the bf16 export, as a resume is
    embed = "model.embed_tokens.weight"
    assert not torch.equal(resumed.model.state_dict()[embed], saved["weights"][embed])
    resumed.load_state(folder)
    _assert_same(saved, _full(resumed))


@pytest.mark.slow
def test_a_checkpoint_of_the_earlier_layout_still_resumes(tmp_path, tiny_smollm2, caplog):
    """The HF folder plus one trainer_state.pt with the whole optimizer, as checkpoints were written before: it
    loads with a warning, and the next save is sharded. A model folder given to resume says what to do."""
    from rstar2_agent.train.learner.checkpoint import rng_state

    learner = TorchLearner(tiny_smollm2, OPTIM, 10, dtype="fp32")
    _steps(learner, 2)
    old = tmp_path / "checkpoint-2"
    learner.model.save_pretrained(old)
    learner.tokenizer.save_pretrained(old)
    torch.save({"step": learner.step, "optimizer": learner.optimizer.state_dict(),
                "scheduler": learner.scheduler.state_dict(), "rng": rng_state(), "stage": 0}, old / "trainer_state.pt")
    resumed = TorchLearner(str(old), OPTIM, 10, dtype="fp32")
    assert resumed.load_state(old)["stage"] == 0 and "earlier layout" in caplog.text
    _assert_same(_full(learner), _full(resumed))
    new = resumed.save(tmp_path / "checkpoint-3", {}, {})
    assert (new / "dcp" / ".metadata").is_file() and "optimizer" not in torch.load(new / "trainer_state.pt",
                                                                                    weights_only=False)
    with pytest.raises(CheckpointError, match="drop --resume"):
        resumed.load_state(tiny_smollm2)
