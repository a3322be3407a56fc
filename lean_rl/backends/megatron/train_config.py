"""Typed, frozen trainer flags: optimizer and LR schedule, how a rollout becomes optimizer steps and
micro-batches, checkpoints, non-finite-step policy, and where the ranks run. Megatron / slime flag
names, each declared once on its field (lean_rl/options.py: `add_options(parser, TrainConfig,
"optimizer")`, `read_options(TrainConfig, args, ...)`); errors name the flag. Importing this does
not import Megatron."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lean_rl.backends.megatron.config import ParallelConfig
# LoraConfig (a flag group of TrainConfig) and TrainerLayout (PlacementConfig.layout's result) live in
# modules of their own, as does BatchPlan (batch_plan.py)
from lean_rl.backends.megatron.lora_config import LoraConfig
from lean_rl.backends.megatron.trainer_layout import TrainerLayout
from lean_rl.options import ConfigError, flag_of, group, option

LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = option(1e-6)
    min_lr: float = option(0.0)
    lr_warmup_iters: int = option(0)
    lr_warmup_init: float = option(0.0)
    lr_decay_iters: int | None = option(None)
    lr_decay_style: str = option("constant", choices=LR_DECAY_STYLES)
    weight_decay: float = option(0.0)
    adam_beta1: float = option(0.9)
    adam_beta2: float = option(0.999)
    adam_eps: float = option(1e-8)
    clip_grad: float = option(1.0, help="global grad-norm clip; 0 disables")
    use_distributed_optimizer: bool = option(False)

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
    micro_batch_size: int = option(1)
    use_dynamic_batch_size: bool = option(False)
    max_tokens_per_gpu: int | None = option(None)
    global_batch_size: int | None = option(None, help="samples per optimizer step")
    num_steps_per_rollout: int | None = option(None)  # alternative to global_batch_size
    balance_data: bool = option(False, help="even out tokens across data-parallel ranks")

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


@dataclass(frozen=True)
class CheckpointConfig:
    save: str | None = option(None)
    save_interval: int | None = option(None, help="rollouts between checkpoints")
    load: str | None = option(None, help="resume from the latest checkpoint here, if any")
    ref_load: str | None = option(None, help="torch_dist checkpoint of the reference model")
    critic_load: str | None = option(None, help="PPO critic checkpoints; default LOAD/critic")
    critic_save: str | None = option(None, help="default SAVE/critic")
    no_load_optim: bool = option(False)
    no_load_rng: bool = option(False)
    keep_last_checkpoints: int | None = option(
        None, positive=True, metavar="K",
        help="after each successful save, delete all but the newest K checkpoints, never the latest "
             "(PPO's critic keeps K+1; default: keep all)")
    save_hf: str | None = option(
        None, metavar="DIR",
        help="after each checkpoint, its HF model in DIR/step_N (the PPO critic's in DIR/critic/step_N), "
             "written in the background by `python -m lean_rl.convert megatron-to-hf` (hf_export.py)")
    # HF weights to start from when --load has none: the engines' --hf-checkpoint (one flag for
    # both, as in slime), passed by config.parse_config.
    hf_checkpoint: str | None = None

    def __post_init__(self) -> None:
        _require(self.save_interval is None or self.save_interval >= 1,
                 f"--save-interval must be >= 1, got {self.save_interval}")
        _require(self.save_interval is None or self.save is not None, "--save-interval needs --save")
        _require(self.save_hf is None or self.save is not None, "--save-hf needs --save")
        _require(self.keep_last_checkpoints is None or self.keep_last_checkpoints >= 1,
                 f"{flag_of(CheckpointConfig, 'keep_last_checkpoints')} must be >= 1, got {self.keep_last_checkpoints}")

    # The critic's checkpoints sit next to the actor's unless given: a slime-style launch script
    # that sets --save / --load resumes a PPO run without extra flags.
    @property
    def critic_save_dir(self) -> str | None:
        return self.critic_save or (str(Path(self.save) / "critic") if self.save else None)

    @property
    def critic_load_dir(self) -> str | None:
        return self.critic_load or (str(Path(self.load) / "critic") if self.load else None)

    def keep_last_for(self, role: str) -> int | None:
        """How many checkpoints the group of `role` keeps (None: all). The critic keeps one more than
        the actor: it saves first, so a crash between the two saves leaves the actor's latest step
        one save behind the critic's newest, and a resume needs the critic's checkpoint of that step."""
        if self.keep_last_checkpoints is None:
            return None
        return self.keep_last_checkpoints + (1 if role == "critic" else 0)

    def should_save(self, step: int, last: bool = False) -> bool:
        """Whether the driver saves after rollout `step` (1-based): every --save-interval rollouts,
        and after the last one whenever --save is set."""
        if self.save is None:
            return False
        return last or (self.save_interval is not None and step % self.save_interval == 0)


@dataclass(frozen=True)
class PlacementConfig:
    actor_num_nodes: int = option(1)
    actor_num_gpus_per_node: int = option(1)  # on GPU
    actor_num_procs_per_node: int = option(  # on CPU: processes (gloo ranks) per node
        1, help="CPU runs: trainer processes per node (the CPU counterpart of --actor-num-gpus-per-node)")
    # Deadlines of the trainer group (MegatronGroup): one call to every rank (a train step, a save), and
    # torch.distributed's collectives (Megatron's own flag name); both end the run with the ranks named.
    call_timeout_s: float = option(1800.0, flag="--trainer-call-timeout", positive=True,
                                   help="seconds one trainer call (a train step, a checkpoint save) may take")
    distributed_timeout_minutes: float = option(10.0, positive=True,
                                                help="torch.distributed timeout of the trainer's process groups")
    # Healing (lean_rl/trainer_heal.py): a lost rank, node or hung collective restarts the trainer group
    # from the last checkpoint of --save, the engines staying up; 0: the run ends naming the rank.
    max_trainer_restarts: int = option(2, at_least=0, help="times a run restarts its trainer group after a lost "
                                       "rank / node / hung collective (from the last --save checkpoint; 0: exit)")
    trainer_restart_wait_s: float = option(300.0, flag="--trainer-restart-wait", positive=True,
                                           help="seconds a restart waits for the trainer's nodes to be placeable")

    def __post_init__(self) -> None:
        for name in ("actor_num_nodes", "actor_num_gpus_per_node", "actor_num_procs_per_node"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value >= 1,
                     f"{flag_of(PlacementConfig, name)} must be >= 1, got {value!r}")

    def layout(self, parallel: ParallelConfig, device: str, on_cluster: bool = False) -> TrainerLayout:
        """`on_cluster`: the run joined a Ray cluster (--ray-address); more than one trainer node needs one."""
        per_node = self.actor_num_gpus_per_node if device == "cuda" else self.actor_num_procs_per_node
        return TrainerLayout.derive(parallel, self.actor_num_nodes * per_node, device,
                                    num_nodes=self.actor_num_nodes, on_cluster=on_cluster)


@dataclass(frozen=True)
class TrainConfig:
    """The trainer's flags. Added with the title "optimizer": the optimizer's flags and the three
    of the trainer itself (critic LR, non-finite-step policy, logits chunk) make one --help group."""

    optimizer: OptimizerConfig = group(OptimizerConfig)
    critic_lr: float | None = option(None, help="default --lr")
    max_consecutive_skipped_steps: int = option(
        5, help="stop the run after this many optimizer steps in a row with a non-finite loss or grad")
    logits_chunk_size: int = option(
        0, help="the actor's log-probs and entropy are made from its last hidden states this many tokens at "
                   "a time, never holding a micro-batch's float32 [tokens x vocab] logits (the backward "
                   "recomputes each chunk's; bench/long_sequence_memory.py: 8k tokens of a 49k vocabulary); 0: from "
                   "the model's full logits")
    batch: BatchConfig = group(BatchConfig, "train batches")
    checkpoint: CheckpointConfig = group(CheckpointConfig, "checkpoints")
    placement: PlacementConfig = group(PlacementConfig, "trainer placement")
    lora: LoraConfig = group(LoraConfig, "lora")
    # Derived by config.parse_config from the rollout side's flags: logits / T as the engine sampled
    # (training_temperature(--rollout-temperature)), and --seed.
    temperature: float = 1.0
    seed: int = 1234

    def __post_init__(self) -> None:
        _require(self.critic_lr is None or self.critic_lr > 0, f"--critic-lr must be > 0, got {self.critic_lr}")
        _require(self.max_consecutive_skipped_steps >= 1,
                 f"--max-consecutive-skipped-steps must be >= 1, got {self.max_consecutive_skipped_steps}")
        _require(self.temperature > 0, f"--rollout-temperature must be > 0 for training, got {self.temperature}")
        _require(isinstance(self.logits_chunk_size, int) and self.logits_chunk_size >= 0,
                 f"--logits-chunk-size must be an integer >= 0, got {self.logits_chunk_size!r}")


def training_temperature(rollout_temperature: float) -> float:
    """Log-probs are those of the distribution the engine sampled from: logits / T. Greedy rollouts
    (T = 0) have no such distribution; they are scored at T = 1."""
    return rollout_temperature if rollout_temperature and rollout_temperature > 0 else 1.0
