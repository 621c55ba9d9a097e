"""Two FSDP2 learner ranks over gloo load the model as a node of GPU ranks must: only rank 0 reads the checkpoint
(rank 1 is not allowed to: its from_pretrained raises), and both end up with rank 0's weights and buffers, so the
sharded model answers exactly as the model loaded whole in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import free_port

pytestmark = pytest.mark.slow

RANK = """
import json, os, sys
import torch
import transformers
rank = int(os.environ["RANK"])
if rank != 0:
    def refuse(*a, **k):
        raise AssertionError("rank 1 read the checkpoint")
    transformers.AutoModelForCausalLM.from_pretrained = refuse
from rstar2_agent.train.learner.model import OptimConfig, TorchLearner
learner = TorchLearner(sys.argv[1], OptimConfig(), total_steps=1, dtype="fp32")
ids = torch.tensor([[1, 17, 300, 42, 9, 250, 3, 77]])
with torch.no_grad():
    logits = learner.logits({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
state = learner.full_state_dict()
if rank == 0:
    json.dump({"logits": logits[0, -1].tolist(), "names": sorted(state),
               "sums": {k: float(v.double().sum()) for k, v in state.items()}}, open(sys.argv[2], "w"))
learner.close()
"""


def test_only_rank_0_reads_the_checkpoint_and_every_rank_gets_its_weights(tiny_smollm2, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path / "rank0.json"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
           "OMP_NUM_THREADS": "1", "LOCAL_RANK": "0"}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, tiny_smollm2, str(out)], env={**env, "RANK": str(r)},
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        errs = [p.communicate(timeout=240)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-2000:] for e in errs)
    got = json.loads(out.read_text())
    whole = AutoModelForCausalLM.from_pretrained(tiny_smollm2, dtype=torch.float32)
    ids = torch.tensor([[1, 17, 300, 42, 9, 250, 3, 77]])
    with torch.no_grad():
        expected = whole(input_ids=ids).logits[0, -1]
    assert torch.allclose(torch.tensor(got["logits"]), expected, atol=1e-5)  # weights and rotary buffers arrived
    reference = whole.state_dict()
    assert got["names"] == sorted(reference)
    assert all(got["sums"][k] == pytest.approx(float(v.double().sum()), rel=1e-6, abs=1e-6)
               for k, v in reference.items())
