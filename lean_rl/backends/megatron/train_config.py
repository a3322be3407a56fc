"""Typed, frozen trainer flags: optimizer and LR schedule, how a rollout becomes optimizer steps and
micro-batches, checkpoints, non-finite-step policy, and where the ranks run. Megatron / slime flag
names; built once by `train_config_from_args`; errors name the flag. Importing this does not import
Megatron."""

from __future__ import annotations

import argparse
from pathlib import Path
from dataclasses import dataclass, field

from lean_rl.backends.megatron.config import ConfigError

LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 1e-6
    min_lr: float = 0.0
    lr_warmup_iters: int = 0
    lr_warmup_init: float = 0.0
    lr_decay_iters: int | None = None
    lr_decay_style: str = "constant"
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0  # 0 disables
    use_distributed_optimizer: bool = False

    def __post_init__(self) -> None:
        _require(self.lr > 0, f"--lr must be > 0, got {self.lr}")
        _require(0 <= self.min_lr <= self.lr, f"--min-lr must be in [0, --lr {self.lr}], got {self.min_lr}")
        _require(self.lr_warmup_iters >= 0, f"--lr-warmup-iters must be >= 0, got {self.lr_warmup_iters}")
        _require(0 <= self.lr_warmup_init <= self.lr,
                 f"--lr-warmup-init must be in [0, --lr {self.lr}], got {self.lr_warmup_init}")
        _require(self.lr_decay_style in LR_DECAY_STYLES,
                 f"--lr-decay-style {self.lr_decay_style!r}: choose one of {', '.join(LR_DECAY_STYLES)}")
        if self.lr_decay_style in ("linear", "cosine"):
            _require(self.lr_decay_iters is not None and self.lr_decay_iters > self.lr_warmup_iters,
                     f"--lr-decay-style {self.lr_decay_style} needs --lr-decay-iters > --lr-warmup-iters "
                     f"({self.lr_warmup_iters})")
        _require(self.weight_decay >= 0, f"--weight-decay must be >= 0, got {self.weight_decay}")
        _require(0 <= self.adam_beta1 < 1, f"--adam-beta1 must be in [0, 1), got {self.adam_beta1}")
        _require(0 <= self.adam_beta2 < 1, f"--adam-beta2 must be in [0, 1), got {self.adam_beta2}")
        _require(self.adam_eps > 0, f"--adam-eps must be > 0, got {self.adam_eps}")
        _require(self.clip_grad >= 0, f"--clip-grad must be >= 0, got {self.clip_grad}")

    @property
    def scheduler_decay_iters(self) -> int:
        """Megatron's scheduler wants decay steps > warmup steps even when the LR is constant."""
        return self.lr_decay_iters if self.lr_decay_iters is not None else self.lr_warmup_iters + 1


@dataclass(frozen=True)
class BatchConfig:
    micro_batch_size: int = 1
    use_dynamic_batch_size: bool = False
    max_tokens_per_gpu: int | None = None
    global_batch_size: int | None = None  # samples per optimizer step
    num_steps_per_rollout: int | None = None  # alternative to global_batch_size
    balance_data: bool = False

    def __post_init__(self) -> None:
        _require(self.micro_batch_size >= 1, f"--micro-batch-size must be >= 1, got {self.micro_batch_size}")
        if self.use_dynamic_batch_size:
            _require(self.max_tokens_per_gpu is not None and self.max_tokens_per_gpu > 0,
                     "--use-dynamic-batch-size needs --max-tokens-per-gpu > 0")
        else:
            _require(self.max_tokens_per_gpu is None, "--max-tokens-per-gpu needs --use-dynamic-batch-size")
        _require(self.global_batch_size is None or self.global_batch_size >= 1,
                 f"--global-batch-size must be >= 1, got {self.global_batch_size}")
        _require(self.num_steps_per_rollout is None or self.num_steps_per_rollout >= 1,
                 f"--num-steps-per-rollout must be >= 1, got {self.num_steps_per_rollout}")

    def check_data_parallel(self, data_parallel_size: int) -> None:
        """Fixed micro-batches: every DP rank runs whole micro-batches of every optimizer step."""
        if self.use_dynamic_batch_size or self.global_batch_size is None:
            return
        unit = self.micro_batch_size * data_parallel_size
        _require(self.global_batch_size % unit == 0,
                 f"--global-batch-size {self.global_batch_size} must be a multiple of --micro-batch-size "
                 f"{self.micro_batch_size} x data-parallel size {data_parallel_size} = {unit}")

    def steps_for(self, num_samples: int, data_parallel_size: int) -> int:
        """Optimizer steps for a rollout of `num_samples`; errors name the flags that disagree."""
        if self.global_batch_size is not None:
            _require(num_samples % self.global_batch_size == 0,
                     f"the rollout has {num_samples} samples, not a multiple of --global-batch-size "
                     f"{self.global_batch_size}")
            steps = num_samples // self.global_batch_size
            _require(self.num_steps_per_rollout is None or self.num_steps_per_rollout == steps,
                     f"--num-steps-per-rollout {self.num_steps_per_rollout} disagrees with --global-batch-size "
                     f"{self.global_batch_size} for a rollout of {num_samples} samples ({steps} steps)")
        else:
            steps = self.num_steps_per_rollout or 1
            _require(num_samples % steps == 0,
                     f"the rollout has {num_samples} samples, not divisible by --num-steps-per-rollout {steps}")
        per_step = num_samples // steps
        if not self.use_dynamic_batch_size:
            unit = self.micro_batch_size * data_parallel_size
            _require(per_step % unit == 0,
                     f"{per_step} samples per optimizer step is not a multiple of --micro-batch-size "
                     f"{self.micro_batch_size} x data-parallel size {data_parallel_size} = {unit}")
        return steps


@dataclass(frozen=True)
class CheckpointConfig:
    save: str | None = None
    save_interval: int | None = None
    load: str | None = None
    ref_load: str | None = None
    hf_checkpoint: str | None = None
    critic_load: str | None = None
    critic_save: str | None = None
    no_load_optim: bool = False
    no_load_rng: bool = False

    def __post_init__(self) -> None:
        _require(self.save_interval is None or self.save_interval >= 1,
                 f"--save-interval must be >= 1, got {self.save_interval}")
        _require(self.save_interval is None or self.save is not None, "--save-interval needs --save")

    # The critic's checkpoints sit next to the actor's unless given: a slime-style launch script
    # that sets --save / --load resumes a PPO run without extra flags.
    @property
    def critic_save_dir(self) -> str | None:
        return self.critic_save or (str(Path(self.save) / "critic") if self.save else None)

    @property
    def critic_load_dir(self) -> str | None:
        return self.critic_load or (str(Path(self.load) / "critic") if self.load else None)

    def should_save(self, step: int, last: bool = False) -> bool:
        """Whether the driver saves after rollout `step` (1-based): every --save-interval rollouts,
        and after the last one whenever --save is set."""
        if self.save is None:
            return False
        return last or (self.save_interval is not None and step % self.save_interval == 0)


@dataclass(frozen=True)
class PlacementConfig:
    actor_num_nodes: int = 1
    actor_num_gpus_per_node: int = 1  # on GPU
    actor_num_procs_per_node: int = 1  # on CPU: processes (gloo ranks) per node

    def __post_init__(self) -> None:
        for name in ("actor_num_nodes", "actor_num_gpus_per_node", "actor_num_procs_per_node"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value >= 1, f"--{name.replace('_', '-')} must be >= 1, got {value!r}")
        # distributed.py binds the rendezvous store to 127.0.0.1 (ranks on other nodes cannot reach
        # it) and gloo / NCCL to the loopback interface: one node until those follow the node address.
        _require(self.actor_num_nodes == 1,
                 f"--actor-num-nodes {self.actor_num_nodes}: the trainer runs on one node in this version")

    def world_size(self, device: str) -> int:
        per_node = self.actor_num_gpus_per_node if device == "cuda" else self.actor_num_procs_per_node
        return self.actor_num_nodes * per_node


@dataclass(frozen=True)
class TrainConfig:
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    critic_lr: float | None = None  # None: --lr
    max_consecutive_skipped_steps: int = 5
    temperature: float = 1.0  # logits / T, as the engine sampled (--rollout-temperature)
    seed: int = 1234

    def __post_init__(self) -> None:
        _require(self.critic_lr is None or self.critic_lr > 0, f"--critic-lr must be > 0, got {self.critic_lr}")
        _require(self.max_consecutive_skipped_steps >= 1,
                 f"--max-consecutive-skipped-steps must be >= 1, got {self.max_consecutive_skipped_steps}")
        _require(self.temperature > 0, f"--rollout-temperature must be > 0 for training, got {self.temperature}")


def add_train_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    opt = parser.add_argument_group("optimizer")
    opt.add_argument("--lr", type=float, default=1e-6)
    opt.add_argument("--min-lr", type=float, default=0.0)
    opt.add_argument("--lr-warmup-iters", type=int, default=0)
    opt.add_argument("--lr-warmup-init", type=float, default=0.0)
    opt.add_argument("--lr-decay-iters", type=int, default=None)
    opt.add_argument("--lr-decay-style", default="constant", choices=LR_DECAY_STYLES)
    opt.add_argument("--weight-decay", type=float, default=0.0)
    opt.add_argument("--adam-beta1", type=float, default=0.9)
    opt.add_argument("--adam-beta2", type=float, default=0.999)
    opt.add_argument("--adam-eps", type=float, default=1e-8)
    opt.add_argument("--clip-grad", type=float, default=1.0, help="global grad-norm clip; 0 disables")
    opt.add_argument("--use-distributed-optimizer", action="store_true")
    opt.add_argument("--critic-lr", type=float, default=None, help="default --lr")
    opt.add_argument("--max-consecutive-skipped-steps", type=int, default=5,
                     help="stop the run after this many optimizer steps in a row with a non-finite loss or grad")
    batch = parser.add_argument_group("train batches")
    batch.add_argument("--micro-batch-size", type=int, default=1)
    batch.add_argument("--use-dynamic-batch-size", action="store_true")
    batch.add_argument("--max-tokens-per-gpu", type=int, default=None)
    batch.add_argument("--global-batch-size", type=int, default=None, help="samples per optimizer step")
    batch.add_argument("--num-steps-per-rollout", type=int, default=None)
    batch.add_argument("--balance-data", action="store_true", help="even out tokens across data-parallel ranks")
    ckpt = parser.add_argument_group("checkpoints")
    ckpt.add_argument("--save", default=None)
    ckpt.add_argument("--save-interval", type=int, default=None, help="rollouts between checkpoints")
    ckpt.add_argument("--load", default=None, help="resume from the latest checkpoint here, if any")
    ckpt.add_argument("--ref-load", default=None, help="torch_dist checkpoint of the reference model")
    if "--hf-checkpoint" not in parser._option_string_actions:  # one flag for engines and trainer, as in slime
        ckpt.add_argument("--hf-checkpoint", default=None, help="HF weights to start from when --load has none")
    ckpt.add_argument("--critic-load", default=None, help="PPO critic checkpoints; default LOAD/critic")
    ckpt.add_argument("--critic-save", default=None, help="default SAVE/critic")
    ckpt.add_argument("--no-load-optim", action="store_true")
    ckpt.add_argument("--no-load-rng", action="store_true")
    place = parser.add_argument_group("trainer placement")
    place.add_argument("--actor-num-nodes", type=int, default=1)
    place.add_argument("--actor-num-gpus-per-node", type=int, default=1)
    place.add_argument("--actor-num-procs-per-node", type=int, default=1,
                       help="CPU runs: trainer processes per node (the CPU counterpart of --actor-num-gpus-per-node)")
    return parser


def _training_temperature(rollout_temperature: float) -> float:
    """Log-probs are those of the distribution the engine sampled from: logits / T. Greedy rollouts
    (T = 0) have no such distribution; they are scored at T = 1."""
    return rollout_temperature if rollout_temperature and rollout_temperature > 0 else 1.0


def train_config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        optimizer=OptimizerConfig(
            lr=args.lr, min_lr=args.min_lr, lr_warmup_iters=args.lr_warmup_iters, lr_warmup_init=args.lr_warmup_init,
            lr_decay_iters=args.lr_decay_iters, lr_decay_style=args.lr_decay_style, weight_decay=args.weight_decay,
            adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps, clip_grad=args.clip_grad,
            use_distributed_optimizer=args.use_distributed_optimizer),
        batch=BatchConfig(
            micro_batch_size=args.micro_batch_size, use_dynamic_batch_size=args.use_dynamic_batch_size,
            max_tokens_per_gpu=args.max_tokens_per_gpu, global_batch_size=args.global_batch_size,
            num_steps_per_rollout=args.num_steps_per_rollout, balance_data=args.balance_data),
        checkpoint=CheckpointConfig(
            save=args.save, save_interval=args.save_interval, load=args.load, ref_load=args.ref_load,
            hf_checkpoint=args.hf_checkpoint, critic_load=args.critic_load, critic_save=args.critic_save,
            no_load_optim=args.no_load_optim, no_load_rng=args.no_load_rng),
        placement=PlacementConfig(
            actor_num_nodes=args.actor_num_nodes, actor_num_gpus_per_node=args.actor_num_gpus_per_node,
            actor_num_procs_per_node=args.actor_num_procs_per_node),
        critic_lr=args.critic_lr,
        max_consecutive_skipped_steps=args.max_consecutive_skipped_steps,
        temperature=_training_temperature(getattr(args, "rollout_temperature", 1.0)),
        seed=getattr(args, "seed", 1234),
    )
