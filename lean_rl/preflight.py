"""What a run checks before it starts any process: each fault the user can fix becomes a ConfigError
naming the flag, file or directory, raised before Ray, the engines or the trainer cost a minute and
leave processes behind (lean_rl.cli turns it into one line and exit status 2).

parse_config already checked the flags (types, choices, contradictions) and that the prompt files
exist; Runtime loads every hook (load_extensions) and then, before Ray, reads the datasets (every row
opened, keys checked, rendered with the chat template) and calls `check_before_start` for the rest:

- the model directories (--hf-checkpoint, --opd-teacher-hf-checkpoint): config.json, a tokenizer that
  loads, safetensors weights whose index names only shards that exist;
- the checkpoints a run would load: --load's tracker and the step it names (a resume), --ref-load,
  --critic-load of a resumed PPO run;
- the ports the user chose (--sglang-base-port .., --router-port) are free (one node only: on a cluster
  they are bound on other nodes; not with --debug-train-only, which starts no engine);
- --save: can be created and written, and its filesystem has room for a checkpoint (weights + Adam;
  with LoRA, about the weights);
- --ray-address answers;
- with --sglang-<flag> / --router-<flag> given, the engines' and the router's command lines parse with
  SGLang's and sglang-router's own parsers (backends/sglang/flag_check.py: a flag they refuse is named);
- first of all, when the run's hooks use lean_rl.rollout.sandbox: --tool-sandbox bwrap builds its
  boundary here (check_tool_sandbox; it also logs whether a cgroup bounds each call's processes and memory).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from lean_rl.options import ConfigError

if TYPE_CHECKING:
    from lean_rl.config import Config

# bytes a checkpoint holds per parameter: fp32 weights + Adam's two fp32 moments (a bf16 model adds
# fp32 main params, but its weights take 2 bytes: 2 + 4 + 4 + 4 = 14 <= 16 holds both cases)
logger = logging.getLogger(__name__)

CHECKPOINT_BYTES_PER_PARAM = 16
GIB = 1024**3


def check_before_start(cfg: Config) -> None:
    if cfg.starts_engines:  # train-only and SFT run no rollout, so no tool code
        check_tool_sandbox(cfg)
        if cfg.engines.server_passthrough or cfg.engines.router_passthrough:
            # SGLang's and sglang-router's own parsers read the command lines (importing SGLang's costs
            # seconds: lean_rl's own flags alone are checked by tests/unit/test_slime_launch_plan.py)
            from lean_rl.backends.sglang.flag_check import check_engine_flags

            check_engine_flags(cfg.engines)
    model = check_model_dir(cfg.engines.model_path, "--hf-checkpoint")
    if cfg.distillation.teacher_hf_checkpoint:  # --use-opd: the teacher's engines serve it
        check_model_dir(cfg.distillation.teacher_hf_checkpoint, "--opd-teacher-hf-checkpoint")
    check_resume_checkpoints(cfg)
    if not cfg.engines.on_cluster and cfg.starts_engines:  # train-only and SFT start no engine
        check_ports(cfg)
    if cfg.train.checkpoint.save and not cfg.run.debug_rollout_only:
        # LoRA keeps optimizer state for the adapters only: its checkpoint is about the weights
        per_param = 4 if cfg.train.lora.enabled else CHECKPOINT_BYTES_PER_PARAM
        roles = 2 if cfg.algorithm.needs_critic else 1
        check_save_dir(cfg.train.checkpoint.save, "--save", model.num_params * roles, per_param)
    if cfg.run.ray_address:
        from lean_rl.utils.ray_utils import check_ray_address_reachable

        try:
            check_ray_address_reachable(cfg.run.ray_address)
        except (ConnectionError, OSError, ValueError) as err:
            raise ConfigError(str(err) if "--ray-address" in str(err) else f"--ray-address: {err}") from None


def check_tool_sandbox(cfg: Config) -> None:
    """--tool-sandbox: set it for the sandbox module; when the run's hooks use the sandbox (load_extensions
    imported them, and they import lean_rl.rollout.sandbox), prove bwrap builds the boundary here, by
    running it, and log what bounds a call, or stop with one line naming the cause and the fix. The
    per-call cgroup is probed too, but fails open: the line says whether it is in force, or why not."""
    uses_tools = "lean_rl.rollout.sandbox" in sys.modules  # looked up before the import below adds it
    from lean_rl.rollout import sandbox

    sandbox.use_backend(cfg.rollout.tool_sandbox)
    if not uses_tools:
        return
    try:
        logger.info("%s", sandbox.limits_in_force())
    except sandbox.BoundaryUnavailable as err:
        raise ConfigError(str(err)) from None


class ModelDir:
    def __init__(self, path: Path, num_params: int):
        self.path, self.num_params = path, num_params


def check_model_dir(path: str | os.PathLike, flag: str) -> ModelDir:
    """The HF checkpoint the engines serve and the trainer starts from: its config, tokenizer and weights."""
    from lean_rl.backends.megatron.checkpoint_paths import CheckpointError
    from lean_rl.buffer.prompt_source import load_tokenizer
    from lean_rl.convert.safetensors_io import HFSafetensors

    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"{flag} {path}: not a directory (an HF checkpoint: config.json, tokenizer, *.safetensors)")
    if not (root / "config.json").is_file():
        raise ConfigError(f"{flag} {path}: no config.json there")
    try:
        load_tokenizer(str(path))
    except Exception as err:  # noqa: BLE001 - transformers raises many types for a broken tokenizer
        raise ConfigError(f"{flag} {path}: the tokenizer does not load ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''})") from None
    try:
        weights = HFSafetensors(root)
    except (CheckpointError, OSError) as err:
        raise ConfigError(f"{flag} {path}: {err}") from None
    return ModelDir(root, sum(math.prod(info.shape) for info in weights.tensors.values()))


def check_resume_checkpoints(cfg: Config) -> None:
    from lean_rl.backends.megatron.trainer_init import latest_resume_step

    ckpt = cfg.train.checkpoint
    if cfg.run.debug_rollout_only:
        return
    if ckpt.load and not Path(ckpt.load).exists() and not _same_dir(ckpt.load, ckpt.save):
        # --load == --save is how a run resumes itself, and its first start finds nothing there yet; any
        # other missing --load is a typo that would silently start from scratch
        raise ConfigError(f"--load {ckpt.load}: no such directory (and it is not --save's, where this run would "
                          "write its first checkpoint): fix the path, or drop --load to start from --hf-checkpoint")
    step = latest_resume_step(ckpt.load, "--load") if ckpt.load else None
    if ckpt.ref_load is not None and not Path(ckpt.ref_load).is_dir():
        raise ConfigError(f"--ref-load {ckpt.ref_load}: not a directory (a Megatron checkpoint root)")
    if step and cfg.algorithm.needs_critic:
        from lean_rl.backends.megatron.checkpoint_paths import has_step

        critic = ckpt.critic_load_dir
        if critic is None or not has_step(critic, step):
            raise ConfigError(f"--load resumes the actor at step {step}, but the critic has no checkpoint of that step "
                              f"(--critic-load {critic}); point --critic-load at the critic saved with it")


def _same_dir(a: str, b: str | None) -> bool:
    return b is not None and os.path.abspath(a) == os.path.abspath(b)


def check_ports(cfg: Config) -> None:
    from lean_rl.utils.net import is_port_free

    engines = cfg.engines
    chosen = []
    if engines.base_port is not None:
        chosen += [(f"--sglang-base-port {engines.base_port} (engine {i})", port)
                   for i, port in enumerate(engines.engine_ports)]
    if engines.router_port is not None:
        chosen.append(("--router-port", engines.router_port))
    for what, port in chosen:
        if not is_port_free(port, engines.host):
            raise ConfigError(f"{what}: port {port} on {engines.host} is already in use; pick another or leave "
                              "the flag out (a free port is chosen)")


def check_save_dir(save: str, flag: str, num_params: int, bytes_per_param: int = CHECKPOINT_BYTES_PER_PARAM) -> None:
    """--save can be created and written, and its filesystem holds one more checkpoint. Creating the
    directory loses nothing: an existing one is left as it is."""
    root = Path(save)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".lean_rl-write-check-"):
            pass
    except OSError as err:
        raise ConfigError(f"{flag} {save}: cannot create or write there ({err.strerror or err})") from None
    needed = num_params * bytes_per_param
    free = shutil.disk_usage(root).free
    if free < needed:
        raise ConfigError(f"{flag} {save}: {free / GIB:.2f} GiB free on its filesystem, but a checkpoint of this "
                          f"model takes about {needed / GIB:.2f} GiB ({num_params:,} parameters: weights + Adam "
                          "state); free some space or point it at a larger disk")


class SaveSpaceError(ConfigError):
    """A checkpoint save ran out of disk: one line (lean_rl/cli.py), the run stops without training on."""


def no_space_left(err: BaseException | None) -> bool:
    """Whether `err` (or what it wraps: a rank's error reaches the driver as text) is ENOSPC."""
    while err is not None:
        if (isinstance(err, OSError) and err.errno == errno.ENOSPC) or "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def last_checkpoint_size(save: str) -> tuple[int | None, int]:
    """(step, bytes) of the latest complete checkpoint under --save; (None, 0) when there is none."""
    from lean_rl.backends.megatron.checkpoint_paths import iteration_dir, latest_step

    try:
        last = latest_step(save)
    except (ValueError, OSError):
        return None, 0
    if last is None:
        return None, 0
    return last, sum(f.stat().st_size for f in iteration_dir(save, last).rglob("*") if f.is_file())


def save_filled_the_disk(err: BaseException, save: str) -> bool:
    """Whether a failed save ran out of space: ENOSPC said so, or (torch's writers can report a short
    write as another error) --save's disk has less free than the last checkpoint took."""
    if no_space_left(err):
        return True
    _, taken = last_checkpoint_size(save)
    return taken > 0 and shutil.disk_usage(save).free < taken


def save_space_error(save: str, step: int) -> SaveSpaceError:
    """The one line for a save of `step` that filled --save's disk: the free space, what the last
    complete checkpoint took (the space one more needs), and that it stays loadable."""
    free = shutil.disk_usage(save).free
    last, taken = last_checkpoint_size(save)
    if last is None:
        kept = "no earlier checkpoint"
        size = ""
    else:
        kept, size = f"step {last}'s checkpoint stays loadable", f"; a checkpoint takes about {taken / GIB:.3f} GiB"
    return SaveSpaceError(f"--save {save}: no space left on its disk while saving step {step} ({free / GIB:.3f} GiB "
                          f"free{size}); {kept}: free some space or point --save at a larger disk, then rerun "
                          "the same command to resume")


@contextlib.contextmanager
def dataset_errors_as_config_errors():
    """Reading the prompt data: its errors (a missing file or key, a bad row, a prompt the chat template
    cannot render, a checkpoint's cursor that does not fit the data) name the flag and the row: user
    errors. A --data-source-path factory's own exceptions keep their traceback (the user's code)."""
    try:
        yield
    except (OSError, ValueError) as err:  # load_prompts starts each of its errors with the flag
        if not str(err).startswith(("--prompt-data", "--eval-prompt-data")):
            raise
        raise ConfigError(str(err)) from err
