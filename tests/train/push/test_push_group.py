"""The push group (train/push/collective.py) over gloo, two real members in two threads of this process: a
state dict of mixed dtypes arrives whole and exact in several buckets, and a receiver whose sender never sends
fails within the group's timeout with an error that names the wait."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rstar2_agent.train.push.collective import PushGroupError, WeightGroup, nbytes, plan

from conftest import free_port, timeout_scale
from conftest import push_group_members as members


def test_plan_splits_by_dtype_and_size():
    shapes = {"a": (torch.float32, (256, 256)), "b": (torch.bfloat16, (10,)), "c": (torch.float32, (256, 256)),
              "d": (torch.float32, (3,))}
    buckets = plan(shapes, bucket_mb=0.3)  # one 256x256 fp32 tensor is 0.25 MiB: a and c cannot share a bucket
    assert [(b.dtype, [e.name for e in b.entries]) for b in buckets] == [
        ("float32", ["a"]), ("bfloat16", ["b"]), ("float32", ["c", "d"])]  # a bucket is sent when it closes
    assert buckets[2].entries[1].offset == 256 * 256 and buckets[2].numel == 256 * 256 + 3


def test_a_state_dict_arrives_exact_in_buckets():
    torch.manual_seed(0)
    state = {"embed.weight": torch.randn(300, 64), "norm.weight": torch.randn(64).to(torch.bfloat16),
             "out.weight": torch.randn(300, 64), "steps": torch.tensor([7, 8], dtype=torch.int64)}
    state["lm_head.weight"] = state["embed.weight"]  # tied: travels once
    buckets = plan({k: (v.dtype, tuple(v.shape)) for k, v in state.items()}, bucket_mb=0.1,
                   aliases={"lm_head.weight": "embed.weight"})
    assert len(buckets) >= 4  # the two 75 KiB matrices do not share one 100 KiB bucket
    assert nbytes(buckets) == sum(v.numel() * v.element_size() for k, v in state.items() if k != "lm_head.weight")
    sender, *receivers = members(3, timeout_s=30)
    got: list[dict] = [{}, {}]
    threads = [threading.Thread(target=lambda i=i: got[i].update(receivers[i].receive(buckets))) for i in range(2)]
    for t in threads:
        t.start()
    kept = sender.send(state, buckets)  # what rank 0 keeps for a replacement worker: the same, on the CPU
    for t in threads:
        t.join(60)
    for g in (*got, kept):
        assert set(g) == set(state)
        for k, v in state.items():
            assert g[k].dtype == v.dtype and torch.equal(g[k], v), k
        assert g["lm_head.weight"].data_ptr() == g["embed.weight"].data_ptr()
    for m in (sender, *receivers):
        m.close()


def test_a_receiver_whose_sender_never_sends_times_out_with_a_clear_error():
    sender, receiver = members(2, timeout_s=2)
    buckets = plan({"w": (torch.float32, (4,))})
    t0 = time.monotonic()
    with pytest.raises(PushGroupError, match=r"weight push \(bucket 1/1\) failed on rank 1/2 .* died or stalled"):
        receiver.receive(buckets)
    assert time.monotonic() - t0 < 30 * timeout_scale()
    receiver.close()
    sender.close()


def test_a_member_that_never_joins_is_named():
    t0 = time.monotonic()
    with pytest.raises(PushGroupError, match="could not meet the others .* did not join"):
        WeightGroup("127.0.0.1", free_port(), 0, 2, timeout_s=2)
    assert time.monotonic() - t0 < 30 * timeout_scale()


def test_a_135m_push_is_received_bucket_by_bucket_holding_one_bucket(smol):
    """SmolLM2's state dict (bf16, tied lm_head) at 8 MB a bucket: the receiver takes it bucket by bucket, each a
    set of whole layers, exact; each bucket's buffer is freed (once its consumer dropped it) before the next bucket
    is received, so the receive buffers are one bucket, as the rollout GPU beside vLLM needs at 14B; only the
    bucket of the tied embeddings, which lm_head refers to at the end, is kept."""
    import weakref

    from safetensors.torch import load_file

    from rstar2_agent.train.push.weight_chunks import unit_of

    state = {k: v.to(torch.bfloat16) for k, v in load_file(f"{smol.path}/model.safetensors").items()}
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    buckets = plan({k: (v.dtype, tuple(v.shape)) for k, v in state.items()}, bucket_mb=8,
                   aliases={"lm_head.weight": "model.embed_tokens.weight"})
    n = len(buckets)
    assert n >= 20
    sender, receiver = members(2, timeout_s=60)
    events: list[tuple[str, int]] = []  # ("receive", k) when bucket k's broadcast starts, ("freed", k) at its end
    freed = {k: threading.Event() for k in range(n)}
    broadcast = receiver._broadcast

    def recording(tensor, what):
        k = int(what.split()[1].split("/")[0]) - 1
        # gloo's worker thread drops its reference to the last bucket's buffer a moment after wait() returns (in
        # this process: both members are here); a buffer that Python still holds would never be freed
        if k > 0 and k - 1 != kept:
            freed[k - 1].wait(2)
        events.append(("receive", k))
        broadcast(tensor, what)

    receiver._broadcast = recording
    thread = threading.Thread(target=sender.send, args=(state, buckets))
    thread.start()
    got: set[str] = set()
    kept, k = None, -1
    for part in receiver.receive_each(buckets):  # (enumerate's reused tuple would hold each part a step longer)
        k += 1
        layers = {unit_of(name) for name in part}
        assert all(sum(unit_of(e.name) in layers for e in b.entries) in (0, len(b.entries)) for b in buckets)
        for name, v in part.items():
            assert v.dtype == state[name].dtype and torch.equal(v, state[name]), name
        base = next(v for name, v in part.items() if name != "lm_head.weight")._base
        if "model.embed_tokens.weight" in part:
            kept = k
        weakref.finalize(base, lambda k=k: (events.append(("freed", k)), freed[k].set()))
        got |= set(part)
        del part, base, v
    thread.join(60)
    assert got == set(state)
    for k in range(n - 1):
        if k != kept:
            assert events.index(("freed", k)) < events.index(("receive", k + 1)), f"bucket {k} outlived the next"
    sender.close()
    receiver.close()


def test_closing_a_group_whose_shutdown_hangs_returns_in_time_fake_nccl_hang():
    """NCCL's shutdown of a communicator whose peer died can block forever (gloo's does not, so a group whose
    shutdown never returns stands in for it, in a real one-member group): close() gives up after its timeout with
    a warning, and the group is dropped so the next push builds another."""
    released = threading.Event()

    class Hangs:
        def shutdown(self) -> None:
            released.wait(60)

    group = WeightGroup("127.0.0.1", free_port(), 0, 1, timeout_s=30)
    real, group.pg = group.pg, Hangs()
    t0 = time.monotonic()
    group.close(timeout_s=0.5)
    assert time.monotonic() - t0 < 5 * timeout_scale() and group.pg is None and group.store is None
    released.set()
    real.shutdown()
