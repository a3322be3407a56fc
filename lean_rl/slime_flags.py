"""slime's launch flags on lean_rl: one table, flag -> what lean_rl does with it.

    python -m lean_rl.slime_launch train.py --rollout-batch-size 8 --use-kl-loss ...   # a slime script's flags
    python -m lean_rl.slime_flags --markdown > docs/slime_flags.md                       # the table, as a doc

Every flag of slime's argument set (slime/utils/arguments.py) and every Megatron flag slime's launch
scripts pass has one entry (tests/unit/slime_flag_list.txt holds that list, with its slime commit):
    same     lean_rl has the flag, with slime's meaning: passed on as it is
    mapped   slime's meaning, said with lean_rl's flags (`to` renames it; `convert` for the rest)
    notice   accepted with a one-line notice: on lean_rl's trainer it changes no result (a memory,
             speed or logging knob), or its only allowed value is what lean_rl does anyway
    refused  a one-line error naming the lean_rl way
An entry with `allowed` is a notice for those values and refused for any other.
`--sglang-<flag>` and `--router-<flag>` go to SGLang and sglang-router in both. A flag lean_rl has
and slime lacks passes on unchanged; a flag only slime's parser knows reaches slime's `args` with a
notice (lean_rl/slime_launch.py); any other flag is left to lean_rl's parser (an error there).
slime's defaults that differ from lean_rl's (the data keys above all) are `slime_default`: given to
lean_rl when the script does not set the flag, so a slime script keeps its meaning.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lean_rl.options import ConfigError

logger = logging.getLogger(__name__)

STATUSES = ("same", "mapped", "notice", "refused")
PASSED_THROUGH = ("--sglang-", "--router-")

# slime's --rollout-function-path values that name its own rollout functions
SLIME_DEFAULT_ROLLOUT = "slime.rollout.sglang_rollout.generate_rollout"
SLIME_FULLY_ASYNC_ROLLOUT = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"
SLIME_SFT_ROLLOUT = "slime.rollout.sft_rollout.generate_rollout"
SLIME_DEFAULT_DATA_SOURCE = "slime.rollout.data_source.RolloutDataSourceWithBuffer"
LEAN_SFT_ROLLOUT = "lean_rl.rollout.sft.generate_rollout"
# --async-mode full bounds staleness; slime's fully-async worker does not (lean_rl requeues older samples)
FULLY_ASYNC_MAX_STALENESS = "1"

Given = dict[str, list[str]]  # the slime flags of a command line -> their values (a switch: [])
Convert = Callable[[list[str], Given], list[str]]


@dataclass(frozen=True)
class SlimeFlag:
    status: str
    text: str = ""  # mapped: what it becomes; notice: why it changes nothing here; refused: the lean_rl way
    to: str | None = None  # mapped: the lean_rl flag taking the same values
    convert: Convert | None = None  # mapped: (values, every slime flag given) -> lean_rl tokens
    allowed: tuple[str, ...] | None = None  # notice for these values (a switch: ()), refused for others
    slime_default: tuple[str, ...] | None = None  # lean_rl tokens that give slime's default when absent
    env: str | None = None  # mapped: the environment variable (of the run's processes) that takes the value

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r}: one of {STATUSES}")


ROLLOUT_BUFFER = ("in `args` for slime's rollout_buffer rollout function (--rollout-function-path); lean_rl itself "
                  "does nothing with it")


def same(text: str = "", slime_default: tuple[str, ...] | None = None) -> SlimeFlag:
    return SlimeFlag("same", text, slime_default=slime_default)


def renamed(to: str, text: str = "", slime_default: tuple[str, ...] | None = None) -> SlimeFlag:
    return SlimeFlag("mapped", text or f"`{to}`", to=to, slime_default=slime_default)


def mapped(convert: Convert, text: str, slime_default: tuple[str, ...] | None = None) -> SlimeFlag:
    return SlimeFlag("mapped", text, convert=convert, slime_default=slime_default)


def to_env(name: str) -> SlimeFlag:
    """A logging setting wandb reads from its environment."""
    return SlimeFlag("mapped", f"${name} of the run", env=name)


def notice(text: str, allowed: tuple[str, ...] | None = None) -> SlimeFlag:
    return SlimeFlag("notice", text, allowed=allowed)


def refused(text: str) -> SlimeFlag:
    return SlimeFlag("refused", text)


# ---------------------------------------------------------------- converters (values, given) -> tokens
def _one(values: list[str], flag: str) -> str:
    if len(values) != 1:
        raise ConfigError(f"{flag} takes one value, got {len(values)}: {' '.join(values) or '(none)'}")
    return values[0]


def _rollout_function(values: list[str], given: Given) -> list[str]:
    path = _one(values, "--rollout-function-path")
    if path in (SLIME_DEFAULT_ROLLOUT, SLIME_FULLY_ASYNC_ROLLOUT):
        return []  # lean_rl's default rollout; fully async: --async-mode full (see launch_mode)
    if path == SLIME_SFT_ROLLOUT:
        return ["--rollout-function-path", LEAN_SFT_ROLLOUT]
    return ["--rollout-function-path", path]


def _data_source(values: list[str], given: Given) -> list[str]:
    path = _one(values, "--data-source-path")
    return [] if path == SLIME_DEFAULT_DATA_SOURCE else ["--data-source-path", path]


def _eval_prompt_data(values: list[str], given: Given) -> list[str]:
    if len(values) == 1:  # slime's legacy form: one path, named "aime"
        values = ["aime", values[0]]
    if len(values) % 2:
        raise ConfigError(f"--eval-prompt-data takes NAME PATH pairs, got {len(values)} values")
    return [token for i in range(0, len(values), 2) for token in ("--eval-prompt-data", values[i], values[i + 1])]


def _use_kl_loss(values: list[str], given: Given) -> list[str]:
    coef = given.get("--kl-loss-coef", ["0"])
    return ["--kl-loss-coef", _one(coef, "--kl-loss-coef")]


def _kl_loss_coef(values: list[str], given: Given) -> list[str]:
    coef = _one(values, "--kl-loss-coef")
    if "--use-kl-loss" not in given and float(coef) != 0:
        logger.warning("slime flag --kl-loss-coef %s without --use-kl-loss: no KL loss, as in slime", coef)
    return []  # given by --use-kl-loss


def _custom_loss(values: list[str], given: Given) -> list[str]:
    if given.get("--loss-type") != ["custom_loss"]:
        logger.warning("slime flag --custom-loss-function-path without --loss-type custom_loss: not used, as in slime")
        return []
    return ["--custom-loss-function-path", _one(values, "--custom-loss-function-path")]


def _loss_type(values: list[str], given: Given) -> list[str]:
    kind = _one(values, "--loss-type")
    template = ["--apply-chat-template"] if kind == "sft_loss" and "--apply-chat-template" not in given else []
    return ["--loss-type", kind, *template]


def _sequence_parallel(values: list[str], given: Given) -> list[str]:
    tp = int(_one(given.get("--tensor-model-parallel-size", ["1"]), "--tensor-model-parallel-size"))
    return ["--sequence-parallel"] if tp > 1 else []


def _per_token_loss(values: list[str], given: Given) -> list[str]:
    return ["--loss-agg-mode", "token-mean"]


def _no_std_normalization(values: list[str], given: Given) -> list[str]:
    estimator = _one(given.get("--advantage-estimator", ["grpo"]), "--advantage-estimator")
    if estimator not in ("grpo", "gspo", "cispo"):
        raise ConfigError(f"--disable-grpo-std-normalization applies to grpo / gspo / cispo, not {estimator}")
    policy = [] if estimator == "grpo" else ["--policy-loss", estimator]
    return ["--advantage-estimator", "dr_grpo", *policy]


def _advantage_estimator(values: list[str], given: Given) -> list[str]:
    if "--disable-grpo-std-normalization" in given:
        return []  # said by --disable-grpo-std-normalization
    return ["--advantage-estimator", _one(values, "--advantage-estimator")]


def _disable_advantages(values: list[str], given: Given) -> list[str]:
    if given.get("--loss-type") == ["sft_loss"]:
        return []
    raise ConfigError("slime flag --disable-compute-advantages-and-returns: lean_rl computes advantages for every "
                      "policy loss; with --loss-type sft_loss they are not used")


def _debug_train_only(values: list[str], given: Given) -> list[str]:
    if given.get("--loss-type") == ["sft_loss"]:
        return []  # --loss-type sft_loss starts no engines in lean_rl
    return ["--debug-train-only"]


# slime's --rm-type names served by lean_rl's built-in rewards (rollout/rewards.py), with what differs
RM_TYPES = {
    "math": ("math", ""),
    "boxed_math": ("math", ""),
    "f1": ("f1", ""),
    "remote_rm": ("remote", ""),
    "deepscaler": ("math", "slime's deepscaler scores 0 a response without </think>; math grades it all"),
    "boxed_deepscaler": ("math", "slime's deepscaler scores 0 a response without </think>; math grades it all"),
    "dapo": ("math", "dapo scores +1/-1, math 1/0: GRPO's normalised advantages are the same, Dr. GRPO's halved"),
}


def _rm_type(values: list[str], given: Given) -> list[str]:
    name = _one(values, "--rm-type")
    if name not in RM_TYPES:
        raise ConfigError(f"--rm-type {name}: lean_rl's built-in rewards serve {', '.join(sorted(RM_TYPES))} "
                          "(and its own boxed, exact); for another, --custom-rm-path to an `async def rm(cfg, sample)`")
    target, difference = RM_TYPES[name]
    if difference:
        logger.warning("slime flag --rm-type %s -> --rm-type %s (%s)", name, target, difference)
    return ["--rm-type", target]


def _save_hf(values: list[str], given: Given) -> list[str]:
    path = _one(values, "--save-hf")
    if "{" in path:  # slime names each export by a template; lean_rl names them DIR/step_N
        raise ConfigError(f"--save-hf {path}: lean_rl writes each checkpoint's HF model to DIR/step_N; "
                          "give the directory DIR, not a {rollout_id} template")
    return ["--save-hf", path]


def _num_epoch(values: list[str], given: Given) -> list[str]:
    epochs = _one(values, "--num-epoch")
    if "--num-rollout" in given:  # slime: --num-rollout wins
        return ["--num-epochs", epochs]
    data = given.get("--prompt-data")
    if not data:
        raise ConfigError("--num-epoch without --num-rollout needs --prompt-data (the rollouts are counted from it)")
    rows = count_rows(_one(data, "--prompt-data"))
    batch = int(_one(given.get("--rollout-batch-size", ["0"]), "--rollout-batch-size"))
    if batch <= 0:
        raise ConfigError("--num-epoch needs --rollout-batch-size")
    rollouts = int(epochs) * rows // batch
    if rollouts < 1:
        raise ConfigError(f"--num-epoch {epochs}: {rows} prompts make no rollout of --rollout-batch-size {batch}")
    return ["--num-epochs", epochs, "--num-rollout", str(rollouts)]


def count_rows(path: str) -> int:
    """Rows of a jsonl / parquet prompt file (slime's --num-epoch counts rollouts from them)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--prompt-data: file {path!r} does not exist")
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(file).metadata.num_rows
    with file.open("rb") as f:
        return sum(1 for line in f if line.strip())


def _optimizer_steps(given: Given) -> int | None:
    """Optimizer steps of the whole run, from the batch flags (for Megatron's fraction flags)."""
    def value(flag: str) -> int | None:
        return int(given[flag][0]) if given.get(flag) else None

    rollouts, batch = value("--num-rollout"), value("--rollout-batch-size")
    if rollouts is None or batch is None:
        return None
    samples, global_batch = batch * (value("--n-samples-per-prompt") or 1), value("--global-batch-size")
    per_rollout = value("--num-steps-per-rollout") or (samples // global_batch if global_batch else 1)
    return rollouts * per_rollout


def _lr_warmup_fraction(values: list[str], given: Given) -> list[str]:
    steps = _optimizer_steps(given)
    if steps is None:
        raise ConfigError("--lr-warmup-fraction needs --num-rollout and --rollout-batch-size to count the "
                          "optimizer steps (or give --lr-warmup-iters)")
    tokens = ["--lr-warmup-iters", str(int(float(_one(values, "--lr-warmup-fraction")) * steps))]
    if "--lr-decay-iters" not in given:
        tokens += ["--lr-decay-iters", str(steps)]
    return tokens


def _lr_decay_style(values: list[str], given: Given) -> list[str]:
    style = _one(values, "--lr-decay-style")
    tokens = ["--lr-decay-style", style]
    if style in ("linear", "cosine") and "--lr-decay-iters" not in given and "--lr-warmup-fraction" not in given:
        steps = _optimizer_steps(given)  # Megatron decays over the whole run unless told otherwise
        if steps is not None:
            tokens += ["--lr-decay-iters", str(steps)]
    return tokens


def _ci_threshold(values: list[str], given: Given) -> list[str]:
    return ["--ci-test-max-mismatch", _one(values, "--ci-train-rollout-logprob-abs-diff-threshold")]


def _dump_details(values: list[str], given: Given) -> list[str]:
    return ["--save-debug-rollout-data", str(Path(_one(values, "--dump-details")) / "rollout_data" /
                                             "{rollout_id}.jsonl")]


def _rollout_max_context_len(values: list[str], given: Given) -> list[str]:
    length = int(_one(values, "--rollout-max-context-len"))
    tokens = ["--sglang-context-length", str(length)]
    if "--rollout-max-prompt-len" not in given:
        tokens += ["--rollout-max-prompt-len", str(length - 1)]
    return tokens


def _same_key(eval_flag: str, train_flag: str, slime_default: str | None) -> Convert:
    def convert(values: list[str], given: Given) -> list[str]:
        train = given.get(train_flag, [slime_default] if slime_default is not None else [])
        if values != train:
            raise ConfigError(f"slime flag {eval_flag} {' '.join(values)}: lean_rl reads evaluation sets with the training keys "
                              f"({train_flag} {' '.join(t for t in train if t) or '(none)'})")
        return []
    return convert


# slime's --update-weight-transport -> lean_rl's flags (nccl: lean_rl's own choice, --weight-sync-transport auto)
SLIME_TRANSPORTS = {"nccl": [], "disk": ["--weight-sync-transport", "disk"]}


def _update_weight_transport(values: list[str], given: Given) -> list[str]:
    transport = _one(values, "--update-weight-transport")
    if transport not in SLIME_TRANSPORTS:
        raise ConfigError(f"--update-weight-transport {transport}: slime's are {', '.join(SLIME_TRANSPORTS)}")
    return list(SLIME_TRANSPORTS[transport])


ARCH = ("architecture: lean_rl builds the model from --hf-checkpoint's config.json (lean_rl checks the "
        "Megatron flags it has against it)")
KERNEL = "a kernel / fusion choice: the same numbers on lean_rl's trainer"
MEMORY = "memory / speed only: lean_rl's trainer computes the same"
LOGGING = "logging only: lean_rl logs to --output-dir (tensorboard, metrics.jsonl) and wandb with --use-wandb"
PROFILING = "profiling only: not in lean_rl"
HEALTH = "lean_rl always health-checks its engines and restarts a lost one (--engine-request-timeout)"
CP = "context parallelism is not in lean_rl: --context-parallel-size 1 (long sequences: --use-dynamic-batch-size)"
NOT_YET = "not in lean_rl yet"

# fmt: off
SLIME_FLAGS: dict[str, SlimeFlag] = {
    # ---- cluster and placement
    "--train-backend": notice("lean_rl trains with Megatron-core", allowed=("megatron",)),
    "--actor-num-nodes": same(),
    "--actor-num-gpus-per-node": same(),
    "--rollout-num-gpus": same(),
    "--rollout-num-gpus-per-engine": same(),
    "--num-gpus-per-node": notice("lean_rl places the trainer and engines with Ray's view of each node"),
    "--colocate": same(),
    "--offload": notice("colocated on GPU lean_rl always offloads the trainer and releases the engines' memory"),
    "--offload-train": notice("colocated on GPU lean_rl always offloads the trainer while the engines generate"),
    "--no-offload-train": notice("colocated on GPU lean_rl always offloads the trainer while the engines generate"),
    "--offload-rollout": notice("colocated on GPU lean_rl always releases the engines' memory while training"),
    "--no-offload-rollout": notice("colocated on GPU lean_rl always releases the engines' memory while training"),
    "--distributed-backend": notice("lean_rl uses nccl on GPU and gloo on CPU", allowed=("nccl", "gloo")),
    "--distributed-timeout-minutes": same(),
    "--release-train": refused("the trainer stays up; --colocate offloads it while the engines generate"),
    "--train-env-vars": refused("export the variables before the launch: lean_rl's processes inherit them"),
    # ---- weight sync
    "--update-weight-mode": notice("lean_rl sends the full weights at every sync", allowed=("full",)),
    "--update-weight-transport": mapped(_update_weight_transport, "disk: `--weight-sync-transport disk`; nccl: "
                                        "lean_rl's default (a process group, CUDA IPC when colocated)"),
    "--update-weight-disk-dir": renamed("--weight-sync-disk-dir"),
    "--update-weight-disk-keep-files": notice("lean_rl removes each sync's files once the engines loaded them"),
    "--update-weight-delta-encoding": notice("only for --update-weight-mode delta, which lean_rl does not have"),
    "--update-weight-delta-checksum": notice("only for --update-weight-mode delta, which lean_rl does not have"),
    "--custom-update-weight-post-write-path": refused("no such hook: the disk transport needs a directory the "
                                                      "trainer and the engines share (--weight-sync-disk-dir)"),
    "--update-weight-local-checkpoint-dir": refused("only for delta sync, not in lean_rl: --weight-sync-transport"),
    "--update-weight-buffer-size": same(),
    "--update-weights-interval": notice("lean_rl syncs after every step", allowed=("1",)),
    "--keep-old-actor": notice("lean_rl syncs after every step, so in a synchronous run the weights it recomputes the "
                               "old log-probs with are the rollout's; stale samples of an async run: --decoupled-ppo "
                               "or --use-tis"),
    "--check-weight-update-equal": notice("lean_rl probes every sync (max |Δ log p| between trainer and engines)"),
    # ---- the trainer and its model
    "--qwen-gdn-backend": notice(KERNEL),
    "--custom-model-provider-path": refused("lean_rl builds the model from the HF config "
                                            "(lean_rl/backends/megatron/model.py)"),
    "--recompute-loss-function": notice(MEMORY),
    "--log-probs-chunk-size": notice(MEMORY),
    "--log-probs-max-tokens-per-gpu": notice(MEMORY),
    "--only-train-params-name-list": refused("lean_rl trains every parameter, or adapters: --lora-rank, "
                                             "--lora-target-modules"),
    "--freeze-params-name-list": refused("lean_rl trains every parameter, or adapters: --lora-rank, "
                                         "--lora-target-modules"),
    "--freeze-indexer": refused("DSA indexers (DeepSeek-V3.2, GLM-5) are not in lean_rl's model families"),
    "--allgather-cp": notice("only with --context-parallel-size > 1, which lean_rl refuses"),
    "--padded-vocab-size": notice("lean_rl pads the vocabulary from --make-vocab-size-divisible-by"),
    "--custom-megatron-init-path": refused("no Megatron init hook in lean_rl"),
    "--custom-megatron-before-log-prob-hook-path": refused("no such hook; a loss of your own: "
                                                           "--custom-loss-function-path"),
    "--custom-megatron-before-train-step-hook-path": refused("no such hook; a loss of your own: "
                                                             "--custom-loss-function-path"),
    "--megatron-deepgemm-forward-layers": refused("no FP8 in lean_rl: --bf16 / --fp16"),
    "--megatron-deepgemm-forward-modules": refused("no FP8 in lean_rl: --bf16 / --fp16"),
    "--megatron-deepgemm-moe-forward-layers": refused("no FP8 in lean_rl: --bf16 / --fp16"),
    "--megatron-deepgemm-moe-forward-modules": refused("no FP8 in lean_rl: --bf16 / --fp16"),
    "--mtp-num-layers": notice("lean_rl builds no multi-token-prediction layers (nothing of them is trained)"),
    "--mtp-loss-scaling-factor": notice("lean_rl builds no multi-token-prediction layers (nothing of them is trained)"),
    "--enable-mtp-training": refused("multi-token-prediction layers are not in lean_rl"),
    # ---- rollout
    "--hf-checkpoint": same(),
    "--model-name": notice("lean_rl reads the model family from --hf-checkpoint's config.json"),
    "--rollout-function-path": mapped(_rollout_function, f"slime's default -> lean_rl's; {SLIME_SFT_ROLLOUT} -> "
                                      f"{LEAN_SFT_ROLLOUT}; {SLIME_FULLY_ASYNC_ROLLOUT} -> --async-mode full; "
                                      "another path as it is"),
    "--rollout-temperature": same(),
    "--rollout-top-p": same(),
    "--rollout-top-k": same(),
    "--rollout-max-context-len": mapped(_rollout_max_context_len, "`--sglang-context-length N` (SGLang caps each "
                                        "request's new tokens to it) and `--rollout-max-prompt-len N-1` unless given"),
    "--rollout-max-prompt-len": same(),
    "--rollout-max-response-len": same(),
    "--rollout-skip-special-tokens": refused("lean_rl keeps special tokens in sample.response (the tokens are what "
                                             "trains); strip them in the reward function"),
    "--rollout-stop": same(),
    "--rollout-stop-token-ids": same(),
    "--rollout-shuffle": same(),
    "--rollout-seed": renamed("--seed", "`--seed` (lean_rl's one seed: prompt order and trainer)"),
    "--over-sampling-batch-size": same(),
    "--dynamic-sampling-filter-path": same(),
    "--partial-rollout": same(),
    "--mask-offpolicy-in-partial-rollout": refused("lean_rl trains a resumed sample's tokens with their per-token "
                                                   "policy versions: correct them with --use-tis or --decoupled-ppo"),
    "--custom-generate-function-path": same(),
    "--rollout-sample-hook-path": same(),
    "--custom-rollout-log-function-path": refused("return metrics from the rollout function "
                                                  "(RolloutOutput.metrics); samples: --dump-samples-interval"),
    "--custom-eval-rollout-log-function-path": refused("return metrics from --eval-function-path's function"),
    "--buffer-filter-path": refused("the buffer hands out groups in order; choose prompts with --data-source-path"),
    "--rollout-data-postprocess-path": refused("change what trains with --rollout-sample-filter-path or "
                                               "--custom-loss-function-path"),
    "--rollout-data-transport": notice("how rollout data reaches the trainer: lean_rl ships it through Ray"),
    "--rollout-external-engine-addrs": refused("lean_rl starts and supervises its own engines "
                                               "(--rollout-num-engines / --rollout-num-gpus)"),
    "--use-fault-tolerance": notice(HEALTH),
    "--rollout-health-check-interval": notice(HEALTH),
    "--rollout-health-check-timeout": notice(HEALTH),
    "--rollout-health-check-first-wait": notice(HEALTH),
    # ---- data
    "--num-rollout": same(),
    "--num-epoch": mapped(_num_epoch, "`--num-epochs N`; without --num-rollout also `--num-rollout "
                          "N * rows // --rollout-batch-size`, as slime counts it"),
    "--disable-rollout-global-dataset": refused("a source of your own: --data-source-path"),
    "--data-source-path": mapped(_data_source, "slime's default -> lean_rl's buffer; another path as it is"),
    "--prompt-data": same(),
    "--apply-chat-template": same(),
    "--apply-chat-template-kwargs": notice("lean_rl renders with the template's defaults", allowed=("{}",)),
    "--input-key": same(slime_default=("--input-key", "input")),
    "--label-key": same(slime_default=("--label-key", "")),
    "--multimodal-keys": same("image rows (lean_rl/buffer/images.py); video and audio are refused"),
    "--metadata-key": same(slime_default=("--metadata-key", "metadata")),
    "--tool-key": same(slime_default=("--tool-key", "tools")),
    "--start-rollout-id": refused("lean_rl starts at the step of the --load checkpoint (0 without one)"),
    "--rollout-batch-size": same(),
    "--n-samples-per-prompt": same(slime_default=("--n-samples-per-prompt", "1")),
    "--global-batch-size": same(),
    "--num-steps-per-rollout": same(),
    "--micro-batch-size": same(),
    "--balance-data": same(),
    "--balance-by-flops": notice("how micro-batches are packed: the same gradient"),
    "--use-dynamic-batch-size": same(),
    "--max-tokens-per-gpu": same(),
    # ---- evaluation
    "--eval-function-path": same(),
    "--eval-interval": same(),
    "--eval-prompt-data": mapped(_eval_prompt_data, "`--eval-prompt-data NAME PATH` once per pair (one path: "
                                 "named aime, as slime names it)"),
    "--eval-config": same("slime's YAML (eval: defaults, datasets); per-set sampling, reward, data keys"),
    "--skip-eval-before-train": notice("lean_rl does not evaluate before the first step"),
    "--eval-input-key": mapped(_same_key("--eval-input-key", "--input-key", "input"), "accepted when equal to --input-key"),
    "--eval-label-key": mapped(_same_key("--eval-label-key", "--label-key", None), "accepted when equal to --label-key"),
    "--eval-tool-key": mapped(_same_key("--eval-tool-key", "--tool-key", "tools"), "accepted when equal to --tool-key"),
    "--n-samples-per-eval-prompt": same(),
    "--eval-temperature": same(),
    "--eval-top-p": same(),
    "--eval-top-k": same(),
    "--eval-max-response-len": same(),
    "--eval-max-prompt-len": refused("--rollout-max-prompt-len applies to the evaluation sets too"),
    "--eval-min-new-tokens": refused(NOT_YET),
    "--eval-max-context-len": refused("one context length per engine: --rollout-max-context-len"),
    # ---- checkpoints
    "--ref-load": same("the reference model (a torch_dist checkpoint); the policy starts from --hf-checkpoint "
                       "when --load has none (slime: from --ref-load, usually the same weights)"),
    "--ref-ckpt-step": refused("lean_rl loads the latest checkpoint of --ref-load"),
    "--load": same(),
    "--save": same(),
    "--save-interval": same(),
    "--async-save": notice("lean_rl saves synchronously: the same checkpoint"),
    "--no-save-optim": refused("lean_rl always saves the optimizer state, so that a resume is exact"),
    "--save-hf": mapped(_save_hf, "`--save-hf DIR`: each checkpoint's HF model in DIR/step_N, written in the "
                                  "background; slime's `{rollout_id}` path template is refused"),
    "--seed": notice("the trainer's seed: lean_rl seeds prompt order and trainer from --seed "
                     "(slime's --rollout-seed)"),
    "--clip-grad": same(),
    "--lr": same(),
    # ---- algorithm
    "--num-critic-only-steps": refused(NOT_YET),
    "--megatron-config-path": refused("the critic takes the actor's flags, with --critic-lr, --critic-load, "
                                      "--critic-save"),
    "--eps-clip": same(),
    "--eps-clip-high": same(),
    "--eps-clip-c": same(),
    "--value-clip": same(),
    "--kl-coef": same(),
    "--loss-type": mapped(_loss_type, "the same (`--loss-type`); sft_loss adds `--apply-chat-template` (slime's SFT "
                          "renders each conversation with the chat template)"),
    "--custom-loss-function-path": mapped(_custom_loss, "kept with `--loss-type custom_loss` (as in slime; "
                                          "otherwise unused)"),
    "--calculate-per-token-loss": mapped(_per_token_loss, "`--loss-agg-mode token-mean` (slime's default is "
                                         "the mean over samples: `--loss-agg-mode seq-mean-token-mean`)",
                                         slime_default=("--loss-agg-mode", "seq-mean-token-mean")),
    "--kl-loss-type": same(),
    "--advantage-estimator": mapped(_advantage_estimator, "the same names (dr_grpo with "
                                    "--disable-grpo-std-normalization)"),
    "--disable-compute-advantages-and-returns": mapped(_disable_advantages, "accepted with --loss-type sft_loss "
                                                       "(advantages unused), refused otherwise"),
    "--custom-advantage-function-path": same(),
    "--use-kl-loss": mapped(_use_kl_loss, "`--kl-loss-coef` with slime's --kl-loss-coef (the KL loss term)"),
    "--kl-loss-coef": mapped(_kl_loss_coef, "given by --use-kl-loss; without it unused, as in slime"),
    "--use-unbiased-kl": refused(f"{NOT_YET}: --kl-loss-type k1 / k2 / k3 / low_var_kl"),
    "--ref-update-interval": refused("the reference stays fixed in lean_rl"),
    "--entropy-coef": same(),
    "--gamma": same(),
    "--lambd": same(),
    "--normalize-advantages": same(),
    "--disable-grpo-std-normalization": mapped(_no_std_normalization, "`--advantage-estimator dr_grpo` (with "
                                               "`--policy-loss gspo / cispo` for those estimators)"),
    "--disable-rewards-normalization": same(),
    "--use-rollout-entropy": notice("lean_rl computes the entropy where a loss needs it (--entropy-coef)"),
    "--get-mismatch-metrics": notice("lean_rl always logs the trainer/engine mismatch "
                                     "(train/rollout_logprob_abs_diff, train/mismatch_kl)"),
    "--reset-optimizer-states": refused(NOT_YET),
    "--use-stateless-adam": refused(NOT_YET),
    "--use-rollout-logprobs": same(),
    "--use-tis": same(),
    "--tis-clip": same(),
    "--tis-clip-low": same(),
    "--custom-tis-function-path": same(),
    "--custom-pg-loss-reducer-function-path": refused("--loss-agg-mode, or --custom-loss-function-path"),
    "--use-routing-replay": refused("lean_rl replays the engine's routing: --use-rollout-routing-replay"),
    "--use-rollout-routing-replay": same(),
    "--use-opsm": refused(f"{NOT_YET}; closest: --use-rs --rs-level sequence"),
    "--opsm-delta": refused(f"{NOT_YET}; closest: --use-rs --rs-level sequence"),
    "--use-opd": same(),
    "--opd-type": same(),
    "--opd-kl-coef": same(),
    "--opd-teacher-load": same(),
    "--opd-teacher-ckpt-step": refused("--opd-teacher-load DIR/iter_NNNNNNN (one step's directory)"),
    # ---- logging
    "--use-wandb": same(),
    "--wandb-mode": to_env("WANDB_MODE"),
    "--wandb-dir": to_env("WANDB_DIR"),
    "--wandb-key": to_env("WANDB_API_KEY"),
    "--wandb-host": to_env("WANDB_BASE_URL"),
    "--wandb-team": to_env("WANDB_ENTITY"),
    "--wandb-group": to_env("WANDB_RUN_GROUP"),
    "--wandb-run-id": to_env("WANDB_RUN_ID"),
    "--wandb-project": same(),
    "--disable-wandb-random-suffix": notice(LOGGING),
    "--wandb-always-use-train-step": notice(LOGGING),
    "--log-multi-turn": notice(LOGGING),
    "--log-passrate": notice(LOGGING),
    "--log-reward-category": notice(LOGGING),
    "--log-correct-samples": notice(LOGGING),
    "--use-tensorboard": notice("lean_rl writes tensorboard unless --no-tensorboard"),
    "--tb-project-name": notice(LOGGING),
    "--tb-experiment-name": notice(LOGGING),
    # ---- debugging
    "--debug-rollout-only": same(),
    "--debug-train-only": mapped(_debug_train_only, "the same (it needs --load-debug-rollout-data); with "
                                 "--loss-type sft_loss implied (no engines)"),
    "--load-debug-rollout-data": same("files that lean_rl's --save-debug-rollout-data wrote (JSON lines)"),
    "--save-debug-rollout-data": same("lean_rl's format: a JSON list of samples per group and line"),
    "--load-forge-rollout-data": refused("--load-debug-rollout-data (files of --save-debug-rollout-data)"),
    "--load-debug-rollout-data-subsample": refused(NOT_YET),
    "--save-debug-train-data": refused("--save-debug-rollout-data (the groups each step trains on)"),
    "--dump-details": mapped(_dump_details, "`--save-debug-rollout-data DIR/rollout_data/{rollout_id}.jsonl`"),
    "--memory-snapshot-dir": notice(PROFILING),
    "--memory-snapshot-num-steps": notice(PROFILING),
    "--profile-target": notice(PROFILING),
    "--memory-recorder": notice(PROFILING),
    "--record-memory-history": notice(PROFILING),
    "--ci-test": same(),
    "--ci-disable-kl-checker": notice("--ci-test's checks are lean_rl's own (lean_rl/ci_test.py)"),
    "--ci-train-rollout-logprob-abs-diff-threshold": mapped(_ci_threshold, "`--ci-test-max-mismatch`"),
    "--ci-save-grad-norm": refused(NOT_YET),
    "--ci-load-grad-norm": refused(NOT_YET),
    # ---- network, rewards
    "--http-proxy": refused("set $HTTP_PROXY / $HTTPS_PROXY for a remote reward server; the engines are lean_rl's"),
    "--use-distributed-post": notice("how requests reach the router: the same answers"),
    "--rm-type": mapped(_rm_type, "math, boxed_math -> math; f1 -> f1; remote_rm -> remote; deepscaler, dapo -> "
                        "math (with a notice of the difference); others refused"),
    "--reward-key": same(),
    "--eval-reward-key": same(),
    "--group-rm": same(),
    "--rm-url": same(),
    "--custom-rm-path": same(),
    "--custom-reward-post-process-path": same(),
    "--custom-convert-samples-to-train-data-path": refused("change what trains with --rollout-sample-filter-path "
                                                           "or --custom-loss-function-path"),
    # read through `args` by slime_plugins/rollout_buffer's rollout function (run as it is: docs/extending.md)
    "--rollout-buffer-url": notice(ROLLOUT_BUFFER),
    "--fetch-trajectory-retry-times": notice(ROLLOUT_BUFFER),
    "--min-batch-collection-ratio": notice(ROLLOUT_BUFFER),
    "--rollout-task-type": notice(ROLLOUT_BUFFER),
    "--loss-mask-type": notice("lean_rl's SFT finds the assistant turns through the tokenizer's chat template"),
    "--data-pad-size-multiplier": notice(MEMORY),
    "--rollout-sample-filter-path": same(),
    "--rollout-all-samples-process-path": same(),
    "--custom-config-path": same(),
    # ---- slime's SGLang / router flags (the other --sglang-* / --router-* pass through)
    "--sglang-router-ip": refused("lean_rl starts its own router (--router-port); cfg.engines.router_url"),
    "--sglang-router-port": refused("lean_rl starts its own router: --router-port"),
    "--sglang-router-request-timeout-secs": renamed("--engine-request-timeout"),
    "--sglang-server-concurrency": renamed("--rollout-max-concurrency", "`--rollout-max-concurrency` (requests "
                                           "in flight at once)"),
    "--prefill-num-servers": refused("prefill/decode disaggregation is not in lean_rl"),
    "--sglang-config": refused("one engine kind in lean_rl: --rollout-num-engines, --sglang-<flag>"),
    # ---- Megatron flags slime's scripts pass
    "--accumulate-allreduce-grads-in-fp32": notice("lean_rl's trainer reduces gradients in float32 buffers"),
    "--attention-softmax-in-fp32": notice(KERNEL),
    "--attention-backend": notice(KERNEL),
    "--adam-beta1": same(),
    "--adam-beta2": same(),
    "--add-qkv-bias": same(),
    "--bf16": same(),
    "--context-parallel-size": notice(CP, allowed=("1",)),
    "--expert-tensor-parallel-size": notice("experts are not split by tensor parallelism in lean_rl",
                                            allowed=("1",)),
    "--decoder-first-pipeline-num-layers": notice("pipeline stage sizes: the same model"),
    "--decoder-last-pipeline-num-layers": notice("pipeline stage sizes: the same model"),
    "--deterministic-mode": notice("lean_rl's CPU trainer is deterministic; on GPU this is not in lean_rl"),
    "--disable-bias-linear": same(),
    "--enable-experimental": notice("Megatron's experimental features: not used by lean_rl"),
    "--expert-model-parallel-size": same(),
    "--ffn-hidden-size": same(),
    "--fp8-format": refused("no FP8 in lean_rl: --bf16 / --fp16"),
    "--fp8-param-gather": refused("no FP8 in lean_rl: --bf16 / --fp16"),
    "--fp8-recipe": refused("no FP8 in lean_rl: --bf16 / --fp16"),
    "--group-query-attention": same(),
    "--hidden-dropout": same(slime_default=("--hidden-dropout", "0.1")),
    "--attention-dropout": same(slime_default=("--attention-dropout", "0.1")),
    "--hidden-size": same(),
    "--kv-channels": same(),
    "--lr-decay-style": mapped(_lr_decay_style, "the same; linear / cosine decay over the run's optimizer steps "
                               "unless --lr-decay-iters (Megatron's default)"),
    "--lr-warmup-fraction": mapped(_lr_warmup_fraction, "`--lr-warmup-iters` = fraction x the run's optimizer steps"),
    "--make-vocab-size-divisible-by": same(),
    "--max-position-embeddings": same(),
    "--min-lr": same(),
    "--moe-aux-loss-coeff": same(),
    "--moe-enable-deepep": notice(KERNEL),
    "--moe-grouped-gemm": notice(KERNEL),
    "--moe-permute-fusion": notice(KERNEL),
    "--moe-ffn-hidden-size": same(),
    "--moe-router-load-balancing-type": same(),
    "--moe-router-pre-softmax": same(),
    "--moe-router-topk": same(),
    "--moe-token-dispatcher-type": same(),
    "--moe-router-bias-update-rate": notice("expert-bias routing is not in lean_rl's model families"),
    "--moe-router-dtype": notice(KERNEL),
    "--moe-token-drop-policy": notice("lean_rl drops no tokens (no capacity factor)"),
    "--no-check-for-nan-in-loss-and-grad": notice("lean_rl skips a step with non-finite gradients "
                                                  "(--max-consecutive-skipped-steps)"),
    "--no-gradient-accumulation-fusion": notice(KERNEL),
    "--no-masked-softmax-fusion": notice(KERNEL),
    "--no-rope-fusion": notice(KERNEL),
    "--norm-epsilon": same(),
    "--normalization": same(),
    "--num-attention-heads": same(),
    "--num-experts": same(),
    "--num-layers": same(),
    "--num-query-groups": same(),
    "--optimizer": notice("lean_rl's optimizer is Adam(W)", allowed=("adam",)),
    "--optimizer-cpu-offload": notice(MEMORY),
    "--overlap-cpu-optimizer-d2h-h2d": notice(MEMORY),
    "--use-precision-aware-optimizer": notice(MEMORY),
    "--pipeline-model-parallel-size": same(),
    "--position-embedding-type": same(),
    "--qk-layernorm": same(),
    "--recompute-granularity": notice(MEMORY),
    "--recompute-method": notice(MEMORY),
    "--recompute-num-layers": notice(MEMORY),
    "--rotary-base": same(),
    "--seq-length": same(),
    "--sequence-parallel": mapped(_sequence_parallel, "the same with --tensor-model-parallel-size > 1; with 1 "
                                  "dropped, as Megatron drops it"),
    "--swiglu": same(),
    "--tensor-model-parallel-size": same(),
    "--transformer-impl": same(),
    "--untie-embeddings-and-output-weights": same(),
    "--use-distributed-optimizer": same(),
    "--vocab-size": same(),
    "--weight-decay": same(slime_default=("--weight-decay", "0.01")),
    "--spec": notice(ARCH),
    "--apply-layernorm-1p": notice(ARCH),
    "--attention-output-gate": notice(ARCH),
    "--kv-lora-rank": same(),
    "--moe-layer-freq": same(),
    "--moe-router-enable-expert-bias": same(),
    "--moe-router-group-topk": same(),
    "--moe-router-num-groups": same(),
    "--moe-router-score-function": same(),
    "--moe-router-topk-scaling-factor": same(),
    "--moe-shared-expert-gate": notice(ARCH),
    "--moe-shared-expert-intermediate-size": same(),
    "--mscale": same(),
    "--mscale-all-dim": same(),
    "--multi-latent-attention": same(),
    "--no-position-embedding": notice(ARCH),
    "--post-mlp-layernorm": same(),
    "--post-self-attn-layernorm": same(),
    "--q-lora-rank": same(),
    "--qk-head-dim": same(),
    "--qk-pos-emb-head-dim": same(),
    "--rotary-interleaved": same(),
    "--rotary-percent": same(),
    "--rotary-scaling-factor": same(),
    "--use-gated-attention": notice(ARCH),
    "--use-rope-scaling": notice(ARCH),
    "--use-rotary-position-embeddings": notice(ARCH),
    "--v-head-dim": same(),
}
# fmt: on

# flags lean_rl also has, with another meaning: slime's is not passed on (see their entries)
OTHER_MEANING_HERE = ("--seed",)

# slime's launchers: train.py (synchronous), train_async.py (the next rollout overlaps training)
LAUNCHERS = ("train.py", "train_async.py")


@dataclass(frozen=True)
class Translation:
    argv: list[str]  # lean_rl's flags
    asynchronous: bool  # run by lean_rl.train_async (with --async-mode in argv), else lean_rl.train
    notices: list[str] = dataclasses.field(default_factory=list)
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # for the run's processes


def split_flags(argv: Sequence[str]) -> list[tuple[str, list[str]]]:
    """(flag, values) in order; a flag owns the tokens after it up to the next `--flag`
    (`--flag=value` is one flag with one value)."""
    out: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            out.append((name, [value] if eq else []))
        elif not out:
            raise ConfigError(f"{token!r}: a value before any flag")
        else:
            out[-1][1].append(token)
    return out


def launch_mode(script: str, given: Given) -> tuple[bool, list[str], list[str]]:
    """(asynchronous, lean_rl flags, notices) for slime's `python3 train.py` / `train_async.py`:
    train_async.py overlaps the next rollout with training (--async-mode one-step); with slime's
    fully-async rollout function generation never stops (--async-mode full); slime's SFT has no rollout
    to overlap (the synchronous loop)."""
    name = Path(script).name
    if name not in LAUNCHERS:
        raise ConfigError(f"{script}: slime's launchers are {' and '.join(LAUNCHERS)}")
    if name == "train.py" or given.get("--loss-type") == ["sft_loss"]:
        return False, [], []
    if given.get("--rollout-function-path") == [SLIME_FULLY_ASYNC_ROLLOUT]:
        extra = ["--async-mode", "full"]
        notes = []
        if "--max-staleness" not in given:
            extra += ["--max-staleness", FULLY_ASYNC_MAX_STALENESS]
            notes.append(f"train_async.py with {SLIME_FULLY_ASYNC_ROLLOUT}: --async-mode full --max-staleness "
                         f"{FULLY_ASYNC_MAX_STALENESS} (older samples are generated again)")
        return True, extra, notes
    return True, ["--async-mode", "one-step"], []


def translate(script: str, argv: Sequence[str]) -> Translation:
    """slime's `python3 SCRIPT ARGV` as lean_rl's loop and flags; a refused flag raises ConfigError
    naming it and the lean_rl way."""
    flags = split_flags(argv)
    given: Given = {}
    for flag, values in flags:
        given[flag] = values
    asynchronous, out, notices = launch_mode(script, given)
    env: dict[str, str] = {}
    for flag, values in flags:
        rule = SLIME_FLAGS.get(flag)
        if rule is None:  # lean_rl's own, --sglang-* / --router-*, or unknown (lean_rl's parser says so)
            out += [flag, *values]
            continue
        if rule.status == "refused":
            raise ConfigError(f"slime flag {flag}: {rule.text}")
        if rule.status == "notice":
            if rule.allowed is not None and values and values[0] not in rule.allowed:
                raise ConfigError(f"slime flag {flag} {' '.join(values)}: only {' / '.join(rule.allowed)} in "
                                  f"lean_rl ({rule.text})")
            notices.append(f"slime flag {flag} accepted, no effect here: {rule.text}")
        elif rule.status == "same":
            out += [flag, *values]
        elif rule.env is not None:
            env[rule.env] = _one(values, flag)
        elif rule.to is not None:
            out += [rule.to, *values]
        elif rule.convert is not None:
            out += rule.convert(values, given)
        else:
            raise ValueError(f"{flag}: a mapped entry needs `to`, `env` or `convert`")
    for flag, rule in SLIME_FLAGS.items():  # slime's defaults where lean_rl's differ
        if rule.slime_default is not None and flag not in given and rule.slime_default[0] not in given:
            out += list(rule.slime_default)
    return Translation(argv=out, asynchronous=asynchronous, notices=notices, env=env)


def slime_hint(unknown: Sequence[str]) -> str:
    """For lean_rl's error on unknown flags: what lean_rl does with the first slime flag among them."""
    for token in unknown:
        rule = SLIME_FLAGS.get(token.partition("=")[0])
        if rule is not None and rule.status != "same":
            return (f" ({token.partition('=')[0]} is slime's: {rule.status}, {rule.text}; run a slime script's flags "
                    "with python -m lean_rl.slime_launch train.py ...)")
    return ""


def markdown() -> str:
    """docs/slime_flags.md: the table above, one row per flag."""
    counts = {status: sum(r.status == status for r in SLIME_FLAGS.values()) for status in STATUSES}
    lines = [
        "# slime's launch flags on lean_rl",
        "",
        "Generated by `python -m lean_rl.slime_flags --markdown` from the table in `lean_rl/slime_flags.py`;",
        "`tests/unit/test_slime_flags.py` checks that this page is current and that the table covers every flag",
        "of `tests/unit/slime_flag_list.txt` (slime's argument set and the Megatron flags of its launch scripts).",
        "A slime script runs with its launcher line changed: `python3 train.py ...` ->",
        "`python3 -m lean_rl.slime_launch train.py ...` (likewise `train_async.py`).",
        "",
        f"{len(SLIME_FLAGS)} flags: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES) + ". same: lean_rl has the "
        "flag with slime's meaning; mapped: slime's meaning in lean_rl's flags; notice: accepted with a one-line "
        "notice (no effect on results here); refused: a one-line error naming the lean_rl way. "
        "`--sglang-<flag>` / `--router-<flag>` pass through to SGLang / sglang-router in both.",
        "",
        "| slime flag | status | lean_rl | slime's default given when absent |",
        "|---|---|---|---|",
    ]
    for flag, rule in sorted(SLIME_FLAGS.items()):
        text = rule.text
        if rule.allowed is not None:
            text = f"only {' / '.join(rule.allowed)}: {text}"
        default = f"`{' '.join(rule.slime_default)}`" if rule.slime_default else ""
        lines.append(f"| `{flag}` | {rule.status} | {text.replace('|', '/')} | {default} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv != ["--markdown"]:
        print("usage: python -m lean_rl.slime_flags --markdown", file=sys.stderr)
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
