"""`distributed: ray` for `rstar2 train rl`: the learner group, beside the rollout engines and the sandbox as Ray
actors (those start in rollout/workers.py; this group pushes its weights into them).

- Learner group: `learners` actors, each one FSDP2 rank of the same Learner (torch.distributed over NCCL on
  GPUs, gloo on CPU; rank 0's node is the rendezvous). The driver splits the kept rollouts over the ranks;
  each rank computes the old policy's logprobs of its share, then its share of the token-level loss (the
  denominator is the whole step's token count) and FSDP reduces the gradients; ranks with fewer micro-batches
  run empty ones, in both passes, so the collectives line up.
- Rollout workers: `rollout_workers` engine actors (vLLM on GPU nodes, hf on CPU), behind a ReplicaPool
  (the `replica_policy`, KV-aware by default) so the agent loop in the driver sees one engine.
- Sandbox actors: `sandbox_actors` RaySandbox actors, each a warm isolated pool, on the nodes that have the
  `sandbox_resources` (CPU nodes) when given.
- Weight sync after every update (the recipe's `weight_push`, chosen once: train/push): every rank gathers the
  full state dict to rank 0, which `collective`: broadcasts it in flat buckets over a push group of rank 0
  and every rollout worker (torch.distributed, gloo on CPU, NCCL/RCCL when every member has a GPU; apart from the
  FSDP group), each worker receiving into buffers and loading them into its engine; or `object_store`: puts it once
  into Ray's object store, and every rollout worker loads it from there. Under `collective` rank 0 keeps a copy of
  the last pushed weights, so that a rollout worker that died is replaced holding them (rollout/ray_engine.py). Every
  push first pings every worker and replaces the dead (a broadcast that meets a dead member on NCCL ends in the
  watchdog tearing down rank 0, which is also an FSDP rank); the group is rebuilt when its members changed, or at
  once when a push fails anyway (a death during the push: then the push is retried once).

Checkpoints: every rank writes its own shards of the weights and optimizer, and its share of the HF export, to
the checkpoint folder (learner/checkpoint.py), which must be on a filesystem all learner nodes mount; their waits
run on a gloo group of the ranks under `checkpoint.timeout_s`, never under the FSDP group's `group_timeout_s`.

`ray.init(address)` (ray_cluster.py) joins a running cluster; with no address it starts one on this machine,
declaring at least as many logical CPUs as the actors ask for (they then share the cores), so the same path runs
on a laptop and is what the tests drive.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import threading
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import CheckpointConfig, OptimConfig, RayConfig
from ..ray_cluster import COLOCATED_SHARE, connect

if TYPE_CHECKING:
    from .update import UpdateConfig

log = logging.getLogger(__name__)
SHUTDOWN_TIMEOUT_S = 30.0  # a rank's orderly shutdown; past it the rank is killed
STATE_KEYS_NOT_RETURNED = ("optimizer", "scheduler", "rng")


def learner_placement(cfg: RayConfig, colocated: bool = False) -> Any:
    """A placement group of one bundle per learner rank, ready (or a TimeoutError naming what was asked and what
    the cluster has, after `start_timeout_s`: a request the cluster cannot meet would otherwise wait forever).
    `colocated`: each bundle also holds that rank's rollout worker (its CPUs; the GPU is shared, COLOCATED_SHARE)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    cpus = cfg.cpus_per_learner + (cfg.cpus_per_rollout_worker if colocated else 0)
    bundle = {"CPU": cpus, **({"GPU": cfg.gpus_per_learner} if cfg.gpus_per_learner else {})}
    if cfg.learner_placement not in LEARNER_PLACEMENTS:
        raise ValueError(f"ray.learner_placement is one of {', '.join(LEARNER_PLACEMENTS)}, not "
                         f"{cfg.learner_placement!r}")
    group = placement_group([bundle] * cfg.learners, strategy=cfg.learner_placement)
    try:
        ray.get(group.ready(), timeout=cfg.start_timeout_s)
    except ray.exceptions.GetTimeoutError as e:
        remove_placement_group(group)
        have = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
        raise TimeoutError(f"Ray did not grant the learner group {cfg.learners} x {bundle} "
                           f"({cfg.learner_placement}) within ray.start_timeout_s={cfg.start_timeout_s:.0f} s; the "
                           f"cluster has {have} in all (the rollout workers and sandbox actors need theirs too): "
                           f"lower ray.learners or the per-learner resources, or add nodes") from e
    return group


LEARNER_PLACEMENTS = ("PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD")  # Ray's placement group strategies
class LearnerActor:
    """One rank of the learner group (wrapped with ray.remote at runtime)."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self.learner: Any = None
        self.group: Any = None  # rank 0: the push group (collective.WeightGroup)
        self.pushed: dict[str, Any] | None = None  # rank 0, collective: the last pushed weights (for replacements)
        self.pushed_ref_: list[Any] = []
        self.transfer: Any = None  # every rank, vLLM's weight transfer: its NCCL or IPC trainer engine
        self.guard: Any = None  # with it, the push's failure record (push/vllm.Guard) and the engines' client
        self.rollout_client: Any = None
        self.kept: dict[str, Any] = {}  # rank 0, vLLM's weight transfer: CPU copies of what it sends

    def address(self) -> tuple[str, int]:
        """This node's address as Ray knows it (reachable from the other nodes) and a free port."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, master: tuple[str, int], model_path: str, optim: dict[str, Any], total_steps: int,
              dtype: str, checkpoint: dict[str, Any], group_timeout_s: float,
              gradient_checkpointing: bool = False) -> str:
        import torch

        from .model import TorchLearner

        os.environ.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world), LOCAL_RANK="0")  # Ray gives each actor its own GPUs
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        self.learner = TorchLearner(model_path, OptimConfig(**optim), total_steps, dtype=dtype,
                                    checkpoint=CheckpointConfig(**checkpoint), group_timeout_s=group_timeout_s,
                                    gradient_checkpointing=gradient_checkpointing)
        return str(self.learner.device)

    def update(self, minis: list[list[Any]], cfg: UpdateConfig, totals: list[int], batches: list[int]
               ) -> dict[str, float]:
        from .update import ppo_update

        return ppo_update(self.learner, minis, cfg, totals, batches=batches, scale=self.world)

    def score(self, ids: list[int], start: int) -> list[float]:
        """Every rank runs the forward (FSDP gathers the shards); the push check reads rank 0's."""
        return self.learner.score(ids, start)

    def compute_dtype(self) -> str:
        return self.learner.compute_dtype

    def weights(self, dtype: str | None) -> list[Any]:
        """Every rank gathers; rank 0 puts the full state dict into the object store and returns [its ref]."""
        import ray
        import torch

        state = self.learner.full_state_dict()
        if self.rank != 0:
            return []
        if dtype == "bf16":
            state = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state.items()}
        return [ray.put({k: v.detach().cpu().contiguous() for k, v in state.items()})]

    def device(self) -> str:
        return str(self.learner.device)

    def weight_plan(self, dtype: str | None, bucket_mb: float) -> list[Any]:
        """Rank 0: the buckets a collective push sends (names, shapes and dtypes of the full state dict)."""
        import torch

        from ..push.collective import plan

        cast = torch.bfloat16 if dtype == "bf16" else None
        model = self.learner.model
        shapes = {k: (cast if cast is not None and v.is_floating_point() else v.dtype, tuple(v.shape))
                  for k, v in model.state_dict().items()}
        first: dict[int, str] = {}  # tied parameters (one Parameter under two names) travel once
        aliases = {name: first.setdefault(id(p), name) for name, p in model.named_parameters(remove_duplicate=False)}
        return plan(shapes, bucket_mb, {k: v for k, v in aliases.items() if k != v and k in shapes})

    def join_weight_group(self, host: str, port: int, world: int, device: str, timeout_s: float) -> None:
        from ..push.collective import WeightGroup

        self.leave_weight_group()
        self.group = WeightGroup(host, port, 0, world, device=device, timeout_s=timeout_s)

    def leave_weight_group(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            group.close()
        transfer, self.transfer = self.transfer, None
        if transfer is not None:
            transfer.shutdown()

    def join_vllm_transfer(self, host: str, port: int, world: int, rollout: list[Any], tensor_parallel: list[int],
                           dtype: str | None, bucket_mb: float, timeout_s: float) -> None:
        """Every rank: vLLM's trainer-side NCCL weight transfer (rank 0 sends; the others take part in the
        gathers), to the rollout workers' actors `rollout` (engines of `tensor_parallel` ranks each)."""
        import torch
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

        from ..push.vllm import Guard, GuardedClient, RolloutClient, source

        self.leave_weight_group()
        self.rollout_client = RolloutClient(rollout, tensor_parallel, timeout_s)
        if self.rank == 0:
            self.rollout_client.shutdown_weight_transfer_engine()  # a previous group's, on the workers that had one
        self.kept = {}
        self.guard = Guard("nccl", self.rank)
        src = source(self.learner.model, torch.bfloat16 if dtype == "bf16" else None,
                     keep=self.kept if self.rank == 0 else None, guard=self.guard)
        info = NCCLTrainerInitInfo(master_address=host, master_port=port, world_size=world, rank=self.rank,
                                   packed=True, packed_buffer_size_bytes=int(bucket_mb * 2**20))
        self.transfer = NCCLTrainerWeightTransferEngine.trainer_init(
            info, client=GuardedClient(self.rollout_client, self.guard), source=src)

    def join_vllm_ipc(self, rollout: list[Any], dtype: str | None, bucket_mb: float, timeout_s: float) -> None:
        """Every rank: vLLM's trainer-side CUDA IPC transfer to the engines on the ranks' own GPUs (colocated: NCCL
        cannot join two ranks on one GPU). Each rank exports handles of the full tensors it gathers on its GPU (the
        all-gather of the handles runs on the FSDP group); rank 0 sends the merged handles, and each engine maps those
        of its own GPU: no host copy (so no copy kept for a replacement worker either: it gets the next push)."""
        import torch

        from ..push.vllm import Guard, GuardedClient, RolloutClient, ipc_trainer, source

        self.leave_weight_group()
        self.rollout_client = RolloutClient(rollout, [1] * len(rollout), timeout_s, ipc=True)
        self.kept = {}
        self.guard = Guard("ipc", self.rank)
        src = source(self.learner.model, torch.bfloat16 if dtype == "bf16" else None, guard=self.guard)
        self.transfer = ipc_trainer(GuardedClient(self.rollout_client, self.guard), src, self.rank, bucket_mb)

    def send_weights_vllm(self) -> None:
        """Every rank: one push through vLLM's weight transfer; rank 0 keeps what it sent (for a replacement)."""
        from ..push.vllm import send

        if self.transfer is None:
            raise RuntimeError("this rank is in no vLLM weight transfer: the learner group sets it up before a push")
        self.guard.reset()  # a fresh record for this push (the source and the client hold this guard)
        self.forget_pushed()
        send(self.transfer, self.guard, self.rollout_client.abort)
        if self.rank == 0:  # the IPC push keeps no copy, so a replacement worker waits for the next push
            self.pushed = dict(self.kept) if self.kept else None
            if not self.kept:
                log.debug("the colocated push keeps no host copy: a replaced rollout worker serves its loaded weights "
                         "until the next push")

    def send_weights(self, buckets: list[Any]) -> int:
        """Every rank gathers; rank 0 broadcasts the buckets to the push group and keeps what it sent (a
        replacement rollout worker loads it). Returns the bytes sent (0 on the other ranks)."""
        from ..push.collective import nbytes

        self.forget_pushed()
        state = self.learner.full_state_dict()
        if self.rank != 0:
            return 0
        if self.group is None:
            raise RuntimeError("rank 0 is in no push group: the learner group sets it up before a push")
        names = {e.name for b in buckets for e in b.entries}
        if names != set(state):
            raise RuntimeError(f"the weight plan and the state dict differ ({sorted(names ^ set(state))[:5]}): "
                               f"rebuild the push group")
        self.pushed = self.group.send(state, buckets)
        return nbytes(buckets)

    def forget_pushed(self) -> None:
        """Rank 0 drops the previous push's host copy (and its object-store reference) before the next push
        gathers: at most one host copy of the weights at any moment, not the last push's beside the new one."""
        self.pushed, self.pushed_ref_ = None, []
        self.kept.clear()

    def pushed_ref(self) -> list[Any]:
        """Rank 0: [an object reference to the last pushed weights] (put once per push), or [] before any."""
        import ray

        if self.pushed is not None and not self.pushed_ref_:  # the collective's tensors are views of the sent
            # buckets (each would carry its whole bucket into the object store): those go as their own copy; once in
            # the object store, rank 0's own copy is dropped (the reference holds the one copy)
            self.pushed_ref_ = [ray.put({k: v.clone() if v.untyped_storage().nbytes() > v.nbytes else v
                                         for k, v in self.pushed.items()})]
            self.pushed = None
            self.kept.clear()
        return self.pushed_ref_

    def save(self, folder: str, extra: dict[str, Any], meta: dict[str, Any]) -> str:
        return str(self.learner.save(folder, extra, meta))

    def load_state(self, folder: str) -> dict[str, Any]:
        state = self.learner.load_state(folder)
        return {k: v for k, v in state.items() if k not in STATE_KEYS_NOT_RETURNED}

    def reset_optimizer(self, restart_schedule: bool = False) -> None:
        self.learner.reset_optimizer(restart_schedule)

    def release_memory(self) -> None:
        self.learner.release_memory()

    def shutdown(self) -> None:
        import torch

        self.leave_weight_group()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


class LearnerGroup:
    """The `Learner` protocol (protocol.py) over `learners` FSDP ranks."""

    def __init__(self, cfg: RayConfig, model_path: str, optim: Any, total_steps: int, *, dtype: str = "auto",
                 checkpoint: Any = None, gradient_checkpointing: bool = False, colocated: bool = False,
                 rollout_engine: str = "hf"):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        from transformers import AutoTokenizer

        self.connected_here = connect(cfg)  # then close() disconnects
        self.actors: list[Any] = []
        self.cfg, self.step = cfg, 0
        self.rollout_engine = rollout_engine  # the recipe's (top level since rollout_engine left RayConfig)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.members: tuple[Any, ...] | None = None  # the rollout workers (and incarnations) of the push group
        self.plan: list[Any] = []
        self.pushing = asyncio.Lock()  # one push at a time (a push overlapping another would mix their buckets)
        self.failed_broadcasts = 0  # pushes whose broadcast met a dead or stalled member (then retried once)
        self.colocated = colocated  # each rank's bundle also holds a rollout worker (start_rollout's `bundles`)
        gpus = cfg.gpus_per_learner * (COLOCATED_SHARE if colocated else 1)
        # a replacement rollout worker asks rank 0 for the last pushed weights while an update may be running
        cls = ray.remote(num_cpus=cfg.cpus_per_learner, num_gpus=gpus,
                         concurrency_groups={"weights": 1})(LearnerActor)
        try:
            self.placement = learner_placement(cfg, colocated)
            self.actors = [cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement, placement_group_bundle_index=r)).remote(r, cfg.learners)
                for r in range(cfg.learners)]
            master = ray.get(self.actors[0].address.remote(), timeout=cfg.start_timeout_s)
            saving = asdict(checkpoint or CheckpointConfig())
            devices = ray.get([a.setup.remote(master, model_path, asdict(optim), total_steps, dtype, saving,
                                              cfg.group_timeout_s, gradient_checkpointing) for a in self.actors],
                              timeout=cfg.start_timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            self.close()
            raise TimeoutError(f"the {cfg.learners} learner ranks did not load and shard {model_path} within "
                               f"ray.start_timeout_s={cfg.start_timeout_s:.0f} s: raise it for a large model on "
                               "slow storage, or see `ray logs` for a rank that is stuck") from e
        except BaseException:  # the placement's own timeout, a rank that failed to start: leave nothing behind
            self.close()
            raise
        log.info("learner group: %d ranks on %s", len(self.actors), ", ".join(devices))

    @property
    def push_dtype(self) -> str | None:
        """What the weights travel as: bf16 to vLLM rollout workers (they hold bf16), as held to the hf ones."""
        return "bf16" if self.rollout_engine == "vllm" else None

    def _all(self, method: str, *args: Any) -> list[Any]:
        import ray

        return ray.get([getattr(a, method).remote(*args) for a in self.actors])

    def update(self, items: list[Any], cfg: UpdateConfig, total_tokens: int,
               stop: threading.Event | None = None) -> dict[str, float]:
        """Each rank takes its share of each PPO mini-batch (update.py `mini_shards`, then `shards`: items r, r +
        world, ..., or balanced by tokens under a token budget); the per-rank metrics are token-weighted shares, so
        they add. `stop` set: `UpdateStopped` at once (the ranks go on until close() kills them)."""
        import ray

        from .update import check_stop, mini_shards

        parts, totals, batches = mini_shards(items, len(self.actors), cfg)
        refs = [a.update.remote(s, cfg, totals, batches) for a, s in zip(self.actors, parts, strict=True)]
        while stop is not None and ray.wait(refs, num_returns=len(refs), timeout=0.5)[1]:
            check_stop(stop)  # the ranks' update is abandoned: close() kills them without waiting for it
        parts = ray.get(refs)
        self.step += 1
        same = ("grad_norm", "lr", "ppo_mini_batches")  # one value for all ranks; the rest are token-weighted shares
        shares = {k for p in parts for k in p} - set(same)
        summed = {k: sum(p.get(k, 0.0) for p in parts) for k in sorted(shares)}
        return {**summed, **{k: parts[0][k] for k in same}, "update_tokens": total_tokens}

    def score(self, ids: list[int], start: int) -> list[float]:
        """Teacher-forced logprobs of `ids[start:]` (TorchLearner.score): every rank takes part in the forward,
        rank 0's result is returned."""
        return self._all("score", list(ids), start)[0]

    @functools.cached_property
    def compute_dtype(self) -> str:
        """Rank 0's (every rank computes alike; asked once: it does not change)."""
        import ray

        return ray.get(self.actors[0].compute_dtype.remote())

    def weights(self) -> Any:
        """A Ray object reference to the full state dict (bf16 for vLLM rollout workers)."""
        refs = self._all("weights", self.push_dtype)
        return refs[0][0]

    def shares_weights(self, engine: Any) -> bool:
        return False

    async def push(self, engine: Any, how: str) -> None:
        """The new weights to every rollout worker behind `engine` (a RayEngine or a ReplicaPool of them), by `how`:
        the recipe's weight push (train/push: object_store, collective, nccl or ipc)."""
        async with self.pushing:
            await self._push(engine, how)

    async def _push(self, engine: Any, how: str) -> None:
        if how == "object_store":
            await engine.load_weights(await asyncio.to_thread(self.weights))
            return
        from rstar2_agent.engines.base import EngineError

        from ..rollout.ray_engine import ray_workers

        workers = ray_workers(engine)
        await asyncio.gather(*(w.ensure_alive() for w in workers))  # the dead replaced before the broadcast
        try:
            await self._broadcast(workers, how)
        except Exception as e:  # noqa: BLE001 - a member died or stalled: replace the dead, rebuild, once more
            log.warning("weight push failed (%s): checking the rollout workers, rebuilding the group", e)
            self.failed_broadcasts += 1
            self.members = None
            await asyncio.gather(*(w.ensure_alive() for w in workers))
            try:
                await self._broadcast(workers, how)
            except Exception as e2:  # noqa: BLE001
                raise EngineError(f"the weight push ({how}) failed twice ({e2}); if the rollout workers are alive, "
                                  f"the nodes may not reach each other on the group's port: set "
                                  f"weight_push: object_store") from e2
        for w in workers:
            w.weights = self._last_pushed

    async def _group(self, workers: list[Any], how: str) -> None:
        """(Re)build the push's group when its members changed (first push, a replaced worker): vLLM's weight
        transfer (`nccl`, `ipc`: every engine must hold it) or the collective push group."""
        members = tuple((id(w), w.incarnation) for w in workers)
        if members == self.members:
            return
        rank0, timeout = self.actors[0], self.cfg.weight_push_timeout_s
        if how in ("nccl", "ipc"):
            transfers = await asyncio.gather(*(w.actor.weight_transfer.remote() for w in workers))
            if {kind for kind, _ in transfers} != {how}:
                raise ValueError(f"weight_push: {how} needs every rollout engine started with vLLM's {how} transfer, "
                                 f"and they hold {sorted({str(k) for k, _ in transfers})}")
        host, port = await rank0.address.remote()
        if how == "ipc":  # colocated: each engine on a learner rank's GPU
            await asyncio.wait_for(asyncio.gather(*(
                a.join_vllm_ipc.remote([w.actor for w in workers], self.push_dtype, self.cfg.weight_bucket_mb,
                                       timeout) for a in self.actors)), timeout + 30)
        elif how == "nccl":
            tensor_parallel = [tp for _, tp in transfers]
            await asyncio.wait_for(asyncio.gather(*(
                a.join_vllm_transfer.remote(host, port, 1 + sum(tensor_parallel), [w.actor for w in workers],
                                            tensor_parallel, self.push_dtype, self.cfg.weight_bucket_mb, timeout)
                for a in self.actors)), timeout + 30)
        else:
            devices = await asyncio.gather(rank0.device.remote(), *(w.actor.device.remote() for w in workers))
            device = "cuda" if all(d.startswith("cuda") for d in devices) else "cpu"
            world = 1 + len(workers)
            await asyncio.wait_for(asyncio.gather(
                rank0.join_weight_group.remote(host, port, world, device, timeout),
                *(w.actor.join_weight_group.remote(host, port, 1 + i, world, device, timeout)
                  for i, w in enumerate(workers))), timeout + 30)
            self.plan = await rank0.weight_plan.remote(self.push_dtype, self.cfg.weight_bucket_mb)
        self.members = members
        log.info("weight push (%s): learner rank 0 and %d rollout workers", how, len(workers))

    async def _broadcast(self, workers: list[Any], how: str) -> None:
        await self._group(workers, how)
        if how in ("nccl", "ipc"):
            sends = [a.send_weights_vllm.remote() for a in self.actors]
        else:
            sends = [*(a.send_weights.remote(self.plan) for a in self.actors),
                     *(w.actor.receive_weights.remote(self.plan) for w in workers)]
        await asyncio.wait_for(asyncio.gather(*sends), self.cfg.weight_push_timeout_s + 30)

    async def _last_pushed(self) -> Any:
        refs = await self.actors[0].pushed_ref.options(concurrency_group="weights").remote()
        return refs[0] if refs else None

    def save(self, folder: str | Path, extra: dict[str, Any], meta: dict[str, Any]) -> Path:
        return Path(self._all("save", str(folder), extra, meta)[0])

    def load_state(self, folder: str | Path) -> dict[str, Any]:
        state = self._all("load_state", str(folder))[0]
        self.step = state["step"]
        return state

    def reset_optimizer(self, restart_schedule: bool = False) -> None:
        self._all("reset_optimizer", restart_schedule)

    def release_memory(self) -> None:
        """Every rank's cached accelerator memory back to its GPU (colocated: before the engine there wakes)."""
        self._all("release_memory")

    def _remove_placement(self) -> None:
        from ray.util.placement_group import remove_placement_group

        group, self.placement = getattr(self, "placement", None), None
        if group is not None:
            remove_placement_group(group)

    def close(self) -> None:
        """Idempotent: stops the ranks, then leaves Ray if this group connected this process to it (a cluster
        we joined keeps running; one we started here stops)."""
        import ray

        actors, self.actors = self.actors, []
        if not actors:
            self._remove_placement()
            return
        try:  # a rank still in an abandoned update (a stopped command) does not answer: it is killed below
            ray.get([a.shutdown.remote() for a in actors], timeout=SHUTDOWN_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            log.warning("learner ranks did not shut down within %.0f s (an update still running?): killed",
                        SHUTDOWN_TIMEOUT_S)
        finally:
            for a in actors:
                ray.kill(a)
            self._remove_placement()
            if self.connected_here:
                ray.shutdown()

