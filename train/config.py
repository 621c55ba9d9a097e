"""The training wing's configuration, at its bottom: the dataclasses a YAML recipe fills (recipe.py) and the checks
that read nothing but them. `RLConfig` (`rstar2 train rl`) with its `Stage`s, `SFTConfig` (`rstar2 train sft`), and
the sections they share or nest: `OptimConfig`, `CheckpointConfig`, `RayConfig` (`distributed: ray`), `StartCheck`
(the SFT -> RL hand-off, rollout/start_check.py), `PushCheck` (after every weight push, push_check.py). This module
imports no other module of the wing; everything above it imports its config from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

LOGPROB_CHUNK_TOKENS = 1024  # the LM head's token chunk (learner/chunked_head.py): ~2 GB of temporaries at Qwen3's
GROUP_TIMEOUT_S = 600.0  # the learner group's collectives (torch's NCCL default); checkpoints wait on their own group
EXPORT_DTYPES = ("fp32", "bf16")  # a checkpoint's HF export (learner/checkpoint.py)
Distributed = Literal["none", "ray"]
RolloutEngine = Literal["hf", "vllm"]  # what training can drive (engines/base.py TrainableEngine)
RolloutCorrection = Literal["auto", "none", "tis"]
PlacementName = Literal["separate", "colocated"]
DISTRIBUTED: tuple[str, ...] = get_args(Distributed)
ROLLOUT_ENGINES: tuple[str, ...] = get_args(RolloutEngine)
ROLLOUT_CORRECTIONS: tuple[str, ...] = get_args(RolloutCorrection)
PLACEMENTS: tuple[str, ...] = get_args(PlacementName)


@dataclass
class StartCheck:
    """The recipe's `start_check` (the SFT -> RL hand-off, rollout/start_check.py): its thresholds; 0 turns each off
    (a base model started on purpose, the tests' random tiny model)."""
    min_answer_share: float = 0.02  # rollouts that end with an answer the reward can read
    min_signal_share: float = 0.0  # groups with both a right and a wrong rollout (off by default: a hard start is fine)

    def __post_init__(self) -> None:
        for name in ("min_answer_share", "min_signal_share"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"start_check.{name} is a share between 0 and 1 (0: no check), not {value!r}")


@dataclass
class PushCheck:
    """The recipe's `push_check`: on (`enabled`); the bound on the largest per-token logprob difference (None:
    `calibration_factor` times the run's own calibrated gap, `calibrated_bound`); the probe's scored tokens; the
    largest `max_move_residual` of the learner's move the engine may miss once the move is decisive."""
    enabled: bool = True
    bound: float | None = None
    probe_tokens: int = 64
    calibration_factor: float = 2.5
    max_move_residual: float = 0.25

    def __post_init__(self) -> None:
        if not isinstance(self.probe_tokens, int) or self.probe_tokens < 1:
            raise ValueError(f"push_check.probe_tokens is the number of probe tokens scored, at least 1, not "
                             f"{self.probe_tokens!r}")
        if self.bound is not None and not self.bound > 0:
            raise ValueError(f"push_check.bound is a positive logprob difference (null: calibrated), not "
                             f"{self.bound!r}")
        if not self.calibration_factor >= 1:
            raise ValueError(f"push_check.calibration_factor multiplies the calibrated gap, at least 1, not "
                             f"{self.calibration_factor!r}")
        if not 0 < self.max_move_residual < 1:
            raise ValueError(f"push_check.max_move_residual is the share of the learner's move the engine may "
                             f"miss, between 0 and 1, not {self.max_move_residual!r}")


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_ratio: float = 0.04  # of the total steps
    warmup_steps: int | None = None  # overrides warmup_ratio
    schedule: str = "cosine"  # cosine (to min_lr_ratio * lr) or constant, after warm-up
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0


@dataclass
class CheckpointConfig:
    export_dtype: str = "fp32"  # the HF export's weights: fp32 (the learner's) or bf16 (half the disk; GPUs serve it)
    export_shard_mb: float = 5000.0  # the export's safetensors files are cut at this size; a rank holds one at a time
    timeout_s: float = 3600.0  # how long a rank waits for the others while a checkpoint is written or read
    # the newest checkpoints a run keeps in `out`: after each save the older ones are deleted (verl's
    # max_actor_ckpt_to_keep, HF's save_total_limit); 0 keeps them all. A 14B checkpoint with its AdamW state is
    # about 200 GB, so `save_every` without it fills a disk
    keep: int = 0

    def __post_init__(self) -> None:
        if self.export_dtype not in EXPORT_DTYPES:
            raise ValueError(f"checkpoint.export_dtype must be {' or '.join(EXPORT_DTYPES)}, not {self.export_dtype!r}")
        if not self.export_shard_mb > 0 or not self.timeout_s > 0:
            raise ValueError("checkpoint.export_shard_mb and checkpoint.timeout_s must be positive")
        if self.keep < 0:
            raise ValueError(f"checkpoint.keep is how many checkpoints a run keeps (0: all), not {self.keep!r}")


@dataclass
class RayConfig:
    address: str | None = None  # a running cluster ("auto", "ray://head:10001"); None: start one here
    learners: int = 1  # FSDP ranks
    gpus_per_learner: float = 0.0
    cpus_per_learner: float = 1.0
    rollout_workers: int = 2
    gpus_per_rollout_worker: float = 0.0  # vLLM tensor parallelism: set engine_options.tensor_parallel_size too
    cpus_per_rollout_worker: float = 1.0
    replica_policy: str = "kv_aware"
    sandbox_actors: int = 2
    cpus_per_sandbox_actor: float = 1.0
    sandbox_resources: dict[str, float] = field(default_factory=dict)  # e.g. {sandbox: 1}: only on CPU nodes
    weight_push_timeout_s: float = 600.0  # each wait of a push: the group's rendezvous, each bucket
    weight_bucket_mb: float = 256.0  # collective: whole layers in buckets of at most this; ipc: the packed buffer
    group_timeout_s: float = 600.0  # each collective of the learner ranks' FSDP group (checkpoints wait apart)
    max_worker_restarts: int = 3  # per rollout worker (and per sandbox actor): then the run stops with an error
    # the learner ranks go in one placement group, a bundle of (cpus, gpus)_per_learner each: PACK keeps them on as
    # few nodes as fit (FSDP's collectives stay on a node's fast links where they can), STRICT_PACK on one node
    learner_placement: str = "PACK"
    start_timeout_s: float = 1800.0  # the learner ranks' resources granted, then their model loaded and sharded

    def cpus_needed(self) -> float:
        return (self.learners * self.cpus_per_learner + self.rollout_workers * self.cpus_per_rollout_worker
                + self.sandbox_actors * self.cpus_per_sandbox_actor)


@dataclass
class SFTConfig:
    model: str = "smollm2-135m"  # registry name, folder or hub id
    data: list[str] = field(default_factory=lambda: ["synthetic:512:0"])  # see data/converters.py and data/sft_mix.py
    hub_dir: str | None = None  # read hub:ORG/NAME sources from hub_dir/ORG/NAME (local copies of the hub sets)
    seq_len: int = 1024  # packed row length; longer conversations are dropped or truncated (`overlong`)
    micro_batch: int = 4  # packed rows per forward pass
    grad_accum: int = 1  # micro-batches per optimizer step (per process)
    # examples per optimizer step, as the paper counts its batch (128); they are packed into rows of seq_len for the
    # forward passes, micro_batch rows each, however many that takes (grad_accum is then unused). 0: a step is
    # micro_batch x grad_accum x processes packed rows, each holding several examples
    batch_examples: int = 0
    # pack the examples of a row with their common leading tokens (the system prompt and tool list) once: the same
    # loss and gradients in fewer tokens (data/chat_data.py). Without batch_examples a row then holds more examples,
    # so a step of micro_batch x grad_accum rows is a larger batch. On one process without gradient checkpointing a
    # row is computed in two passes (the prefix, then its examples as a batch attending to the prefix's keys and
    # values, kept in the graph): attention over what each example sees, not the whole row; under FSDP or gradient
    # checkpointing, one pass with a block mask (the same loss and gradients, more attention compute)
    share_prefix: bool = False
    epochs: float = 1.0
    max_steps: int | None = None  # overrides epochs
    optim: OptimConfig = field(default_factory=OptimConfig)
    dtype: str = "auto"  # auto: bf16 on GPUs that have it, else fp32
    gradient_checkpointing: bool = False
    # the input embeddings (and a head tied to them) and the bottom N decoder layers are not trained: their backward
    # and optimizer state are skipped (SmolLM2-135M, 20 of 30 frozen: a step about 1.8x faster on a CPU); 0, the
    # default: every parameter trained, as the paper's SFT
    frozen_layers: int = 0
    # NEFTune (arXiv 2310.05914): uniform noise on the input embeddings while training, alpha / sqrt(L * d) in size
    # (its paper: alpha 5 to 15); 0, the default: none, as the paper's SFT
    neftune_alpha: float = 0.0
    gpu_memory_gib: float = 0.0  # the memory plan's GPU size (0: this machine's GPU); see train/plan/
    gpus: int = 0  # the node the recipe is written for: torchrun's processes the plan counts (0: $WORLD_SIZE, else 1)
    memory_check: bool = True  # false: start even when the memory plan says the recipe does not fit
    format: str = "hermes"
    # rstar2-paper targets: "format" converts assistant turns without the paper's shape (</reason> before each call,
    # each answer in <answer></answer>: what the RL reward reads) deterministically; "as_written" trains the rows'
    # own text (data/target_shape.py). Either way the run's info reports each source's shares
    target_shape: str = "format"
    seed: int = 0
    out: str = "runs/sft"
    save_every: int = 0  # steps; 0: only at the end
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # layout, export dtype, write timeout
    group_timeout_s: float = GROUP_TIMEOUT_S  # each collective of the torchrun ranks' group
    on_bad_line: str = "skip"  # skip or fail
    overlong: str = "drop"  # drop or truncate
    db: str | None = None  # the store (default $RSTAR2_HOME/rstar2.db)
    run: str | None = None  # run name in the store (default: the out folder's name)
    tensorboard: bool = False  # when installed
    wandb_project: str | None = None  # when installed


@dataclass
class Stage:
    steps: int
    max_response_tokens: int = 8192
    max_turns: int = 10
    # a problem generator: synthetic (synthetic.py) or tooltasks (data/tool_tasks.py); or problems: a file of
    # `rstar2 train problems` (problems:PATH or PATH.jsonl), or sources it curates at the stage start (hub:...,
    # dapo:PATH, ...; a list for several), cached in `out`
    data: str | list[str] = "synthetic"
    data_seed: int = 0  # the generator's problems from this seed; for problems, the seed of the sample
    data_size: int | None = None  # a generator's count (None: 512); for problems, a sample of this many (0/None: all)
    filter_solved: int = 0  # at the stage start, drop the problems the policy solves k of k (0: no filter)
    reset_optimizer: bool = False  # at the stage start, a fresh optimizer state (the schedule goes on)
    restart_schedule: bool = False  # with reset_optimizer, also restart the lr schedule and its warm-up (not the paper)

    def __post_init__(self) -> None:
        if self.restart_schedule and not self.reset_optimizer:
            raise ValueError("a stage's restart_schedule restarts the schedule of the optimizer reset_optimizer makes: "
                             "set reset_optimizer: true beside it, or drop restart_schedule")


@dataclass
class RLConfig:
    model: str = "runs/sft-smollm2-cpu/last"
    stages: list[Stage] = field(default_factory=lambda: [Stage(steps=2)])
    prompts_per_step: int = 4
    group_size: int = 4  # G: 2G rollouts per prompt, G kept
    positive_sampling: str = "paper"  # paper (probability 1/p) or topk (the release's ranking: lowest release p)
    # RoC keeps at least this many positives and negatives of a mixed group (the release: 2 each); group_size must
    # be at least their sum: set both to 1 to keep at least one of each side with G = 2 or 3
    roc_min_positive: int = 2
    roc_min_negative: int = 2
    # the sizes of the two sides RoC keeps: paper (section 2.2: half the negatives, the rest positives) or release
    # (each side round(share x G), half to even, with the floors above: microsoft/rStar's resample_of_correct)
    roc_sizes: str = "paper"
    roc: bool = True  # False: plain GRPO on G rollouts per prompt, all used (the ablation)
    temperature: float = 1.0
    top_p: float = 1.0
    # a seed per rollout (from its step, prompt and index): a rerun step samples the same rollouts. vLLM samples
    # seeded requests one by one with their own generators, off its batched (FlashInfer) sampler: false at scale
    seeded_rollouts: bool = True
    eps_low: float = 0.2
    eps_high: float = 0.28
    # optimizer steps per RL step: the kept rollouts cut in order into this many PPO mini-batches, each one step against
    # the same pre-update old logprobs. 1 (the release: train_batch_size = ppo_mini_batch_size) makes the ratio 1 and
    # the clip inert; the paper gives no mini-batch size. The lr schedule counts RL steps either way
    ppo_mini_batches: int = 1
    # the PPO ratio is against the learner's own logprobs of the rollouts (learner/update.py); `tis` also weights each
    # token by min(pi_learner / pi_engine, tis_cap) against the rollout engine's policy (verl's token-level rollout
    # correction, rollout_is_threshold 2.0); off as in the release. Logprobs of both are at `temperature`: with
    # top_p < 1 the engine's are renormalized over the nucleus and the learner's are not, so keep top_p 1 here
    # auto: none with max_staleness 0 (the release), tis with max_staleness >= 1 (then the loss is decoupled PPO, as
    # AReaL's: clipped against the learner's proximal logprobs, weighted by the truncated ratio to the behaviour policy)
    rollout_correction: RolloutCorrection = "auto"
    tis_cap: float = 2.0
    # bounded staleness: 0, the paper's synchronous step; k >= 1: the rollouts of the next k steps are generated while
    # the learner updates, on weights at most k updates old (rollout/version_gate.py). Needs a rollout engine with its
    # own weights (rollout_engine: vllm, or distributed: ray)
    max_staleness: int = 0
    partial_rollouts: bool = False  # a push interrupts the generations in flight, which go on with the new weights
    micro_batch: int = 8  # trajectories per forward pass (when micro_batch_tokens is 0)
    # tokens per forward pass: trajectories packed without padding up to this budget (0: micro_batch trajectories,
    # right-padded to the longest); the learner's activation memory follows it, not the longest rollout
    micro_batch_tokens: int = 0
    # the LM head's token chunk for the logprobs and entropy (learner/chunked_head.py: no full-vocabulary fp32 logits
    # kept for the backward); 0: the full logits
    logprob_chunk_tokens: int = LOGPROB_CHUNK_TOKENS
    gradient_checkpointing: bool = False  # recompute each layer's activations in the backward (the learner's memory)
    # the memory plan (train/plan/) runs before a GPU run and refuses a recipe that cannot fit: the GPUs' memory in
    # GiB (0: this machine's GPU), and false to start anyway
    gpu_memory_gib: float = 0.0
    memory_check: bool = True
    sandbox_workers: int = 2  # warm sandbox workers per template: this process's pool, or each Ray sandbox actor's
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6, warmup_steps=20, schedule="constant"))
    dtype: str = "auto"
    format: str = "hermes"
    answer_extraction: str = ""  # how the reward reads the answer (chat_format.EXTRACTIONS); "": the format's (paper)
    # the SFT -> RL hand-off, on step 0's rollouts before the first update (rollout/start_check.py): a policy whose
    # answers the reward cannot read stops the run with what to fix; 0 turns a threshold off
    start_check: StartCheck = field(default_factory=StartCheck)
    # after every push the engine and the learner score a fixed probe; past the bound (null: from their dtypes) the run
    # stops with PushCheckError, a push that silently did nothing (push_check.py)
    push_check: PushCheck = field(default_factory=PushCheck)
    seed: int = 0
    out: str = "runs/rl"
    save_every: int = 0  # steps; stage ends always save
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # layout, export dtype, write timeout
    db: str | None = None
    run: str | None = None
    tensorboard: bool = False  # per-step metrics to out/tensorboard, when tensorboard is installed
    wandb_project: str | None = None  # ... and to this Weights & Biases project, when wandb is installed
    data_dir: str | None = None  # benchmark mirrors that curating a stage's sources decontaminates against
    distributed: Distributed = "none"  # none: one process (rollout_engine below); ray: learner/ray_group.py
    # one process: hf shares the learner's weights (no sync); vllm runs vLLM in this process, prefix cache and
    # continuous batching, the new weights pushed after each update. engine_options: VLLMEngine's (kv_cache_gib...)
    rollout_engine: RolloutEngine = "hf"
    engine_options: dict[str, Any] = field(default_factory=dict)
    ray: RayConfig = field(default_factory=RayConfig)
    # where the learner and the rollout engines sit on the GPUs: separate (each on GPUs of its own), or colocated (the
    # same GPUs, as verl's hybrid engine: the engines asleep during the update, the new weights pushed in place;
    # synchronous steps only). learner/colocated.py
    placement: PlacementName = "separate"
    # how the new weights reach the rollout engines after each update (train/push: auto, shared, chunked, ipc, nccl,
    # collective, object_store); auto picks by the placement
    weight_push: str = "auto"
    sleep_level: int = 1  # colocated: vLLM's sleep level for the update (1: weights to host memory, KV cache dropped)

    @property
    def rollouts_per_prompt(self) -> int:
        """2G with Resample-on-Correct (G are kept), G without."""
        return 2 * self.group_size if self.roc else self.group_size


# fields that lived in `ray:` and now have one home, whatever `distributed` says: refused by name where a recipe still
# spells them the old way (recipe.load)
MOVED = {"ray.rollout_engine": "rollout_engine", "ray.engine_options": "engine_options",
         "ray.sandbox_workers": "sandbox_workers"}


def refuse_moved(values: dict[str, Any]) -> None:
    """A recipe (as read) that spells a field where it used to live: ValueError saying where it lives now."""
    ray = values.get("ray") or {}
    found = [k for k in MOVED if k.removeprefix("ray.") in ray]
    if found:
        raise ValueError("; ".join(f"{k} has moved: set {MOVED[k]} at the top level of the recipe (one field whatever "
                                   "distributed says)" for k in found))


def check_distributed(cfg: RLConfig) -> None:
    """`distributed` and the one-process `rollout_engine` are names this wing knows."""
    if cfg.distributed not in DISTRIBUTED:
        raise ValueError(f"distributed must be {' or '.join(DISTRIBUTED)}, not {cfg.distributed!r}")
    if cfg.rollout_engine not in ROLLOUT_ENGINES:
        raise ValueError(f"rollout_engine must be {' or '.join(ROLLOUT_ENGINES)}, not {cfg.rollout_engine!r}")


def check_rollout_correction(mode: str, cap: float) -> None:
    if mode not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"rollout_correction must be one of {', '.join(ROLLOUT_CORRECTIONS)}, not {mode!r} "
                         "(tis: truncated importance weights against the rollout engine's policy; auto: none, or tis "
                         "when max_staleness >= 1)")
    if not cap > 0:
        raise ValueError(f"tis_cap must be a positive number (verl's default is 2.0), not {cap!r}")


def check_staleness(cfg: RLConfig) -> None:
    if not isinstance(cfg.max_staleness, int) or cfg.max_staleness < 0:
        raise ValueError(f"max_staleness must be 0 (synchronous) or a positive number of policy versions, not "
                         f"{cfg.max_staleness!r}")
    if (cfg.max_staleness or cfg.partial_rollouts) and cfg.distributed == "none" and cfg.rollout_engine == "hf":
        raise ValueError("max_staleness >= 1 and partial_rollouts need a rollout engine with its own weights: the hf "
                         "engine in this process shares the learner's model, which the update changes under it. Set "
                         "rollout_engine: vllm (or distributed: ray)")


def check_placement(cfg: RLConfig) -> None:
    """The placement's own fields; whether its weight push can run is the push's to say (push.choose)."""
    if cfg.placement not in PLACEMENTS:
        raise ValueError(f"placement must be {' or '.join(PLACEMENTS)}, not {cfg.placement!r}")
    if cfg.placement != "colocated":
        return
    if cfg.max_staleness or cfg.partial_rollouts:
        raise ValueError("placement: colocated runs synchronous steps (the engines sleep while the learner updates on "
                         "the same GPUs, so no rollout can run beside the update): set max_staleness: 0 and "
                         "partial_rollouts: false, or use placement: separate (the learner and the engines on GPUs of "
                         "their own) for bounded staleness")
    if cfg.distributed == "ray" and cfg.ray.rollout_workers != cfg.ray.learners:
        raise ValueError(f"placement: colocated puts one rollout worker on each learner rank's GPU: set "
                         f"ray.rollout_workers to ray.learners ({cfg.ray.learners}), not {cfg.ray.rollout_workers}")
    if cfg.distributed == "ray" and int(cfg.engine_options.get("tensor_parallel_size", 1)) != 1:
        raise ValueError("placement: colocated runs one engine per GPU (data parallel across the node's GPUs): set "
                         "engine_options.tensor_parallel_size to 1, or use placement: separate for engines that "
                         "span GPUs")
    if cfg.sleep_level not in (1, 2):
        raise ValueError(f"sleep_level is vLLM's: 1 (weights to host memory, KV cache dropped) or 2 (both dropped), "
                         f"not {cfg.sleep_level!r}")


def check_micro_batch_tokens(cfg: RLConfig) -> None:
    """A token budget holds the longest response a stage allows (a longer trajectory would be a micro-batch of its
    own, over the budget the learner's memory is planned for)."""
    longest = max((s.max_response_tokens for s in cfg.stages), default=0)
    if cfg.micro_batch_tokens and cfg.micro_batch_tokens < longest:
        raise ValueError(f"micro_batch_tokens ({cfg.micro_batch_tokens}) is below the longest stage's "
                         f"max_response_tokens ({longest}): set micro_batch_tokens to at least {longest} plus the "
                         f"prompt length, or 0 for micro_batch trajectories per forward pass")
