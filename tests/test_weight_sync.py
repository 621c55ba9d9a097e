"""The weight-sync group (engines/weight_sync.py) over gloo, two real members in two threads of this process: a
state dict of mixed dtypes arrives whole and exact in several buckets, and a receiver whose sender never sends
fails within the group's timeout with an error that names the wait."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rstar2_agent.engines.weight_sync import WeightGroup, WeightSyncError, nbytes, plan

from conftest import free_port


def members(world: int, timeout_s: float) -> list[WeightGroup]:
    """`world` members of one group on a free loopback port (rank 0 hosts the store; all meet at once)."""
    port, groups, errors = free_port(), [None] * world, []

    def join(rank: int) -> None:
        try:
            groups[rank] = WeightGroup("127.0.0.1", port, rank, world, timeout_s=timeout_s)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return groups


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
    with pytest.raises(WeightSyncError, match=r"weight push \(bucket 1/1\) failed on rank 1/2 .* died or stalled"):
        receiver.receive(buckets)
    assert time.monotonic() - t0 < 30
    receiver.close()
    sender.close()


def test_a_member_that_never_joins_is_named():
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match="could not meet the others .* did not join"):
        WeightGroup("127.0.0.1", free_port(), 0, 2, timeout_s=2)
    assert time.monotonic() - t0 < 30
