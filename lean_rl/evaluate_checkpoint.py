"""`python -m lean_rl.evaluate`: one checkpoint scored on the run's evaluation sets, with no training.

The checkpoint is an HF directory (--hf-checkpoint) or a Megatron torch_dist one (--load: a root, its
latest iteration, or one iter_* directory), converted first by the project's converter
(convert/megatron_to_hf.py) into a directory beside --eval-output that is removed at the end. The
rest is a run with --debug-rollout-only and nothing but its evaluation: the same flags (engines,
sampling, reward, --rm-hf-checkpoint / judge), the same engine start (engine_start.start_engines with
no trainer), the same evaluation rollout (rollout/evaluation.py, or --eval-function-path) on the
--eval-config / --eval-prompt-data sets, with pass@k at --eval-pass-k (rollout/pass_at_k.py). One line
per set on stdout and the JSON file --eval-output."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lean_rl.options import ConfigError, option, read_options

if TYPE_CHECKING:
    from lean_rl.config import Config
    from lean_rl.rollout.base import RolloutOutput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvaluateOptions:
    """The flags of `python -m lean_rl.evaluate` beside a run's own."""

    eval_output: str | None = option(None, metavar="PATH", help=(
        "python -m lean_rl.evaluate: write the scores of every set here (JSON; required)"))


@dataclass(frozen=True)
class CheckpointSource:
    """What is evaluated: the HF directory the engines serve, and the --load it came from (or None)."""

    hf_dir: Path
    load: str | None
    converted: bool  # hf_dir was written from --load here (removed at the end)


def _flag_value(args: argparse.Namespace, name: str) -> Any:
    return getattr(args, name, None)


def _without_flag(argv: list[str], flag: str) -> list[str]:
    """argv with every `flag VALUE` / `flag=VALUE` removed."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


def checkpoint_source(args: argparse.Namespace, eval_output: Path) -> CheckpointSource:
    """The HF directory to serve: --hf-checkpoint, or --load converted (config and tokenizer from
    --hf-checkpoint when given, else the checkpoint's own hf_config/). One-line errors name the flag."""
    from lean_rl.backends.megatron.checkpoint_paths import HF_CONFIG_DIR, CheckpointError, find_checkpoint

    load, hf = _flag_value(args, "load"), _flag_value(args, "hf_checkpoint")
    if load is None:
        if hf is None:
            raise ConfigError("give the checkpoint to evaluate: --hf-checkpoint DIR (HF) or --load DIR (Megatron)")
        if not (Path(hf) / "config.json").is_file():
            what = "no config.json there" if Path(hf).is_dir() else "no such directory"
            raise ConfigError(f"--hf-checkpoint {hf}: {what} (an HF checkpoint: config.json, tokenizer, *.safetensors)")
        return CheckpointSource(Path(hf), None, converted=False)
    try:
        _, directory = find_checkpoint(load)
    except CheckpointError as err:
        raise ConfigError(f"--load {load}: {err}") from None
    if hf is None and not any((d / HF_CONFIG_DIR / "config.json").is_file() for d in (directory, directory.parent)):
        raise ConfigError(f"--load {load}: the checkpoint carries no {HF_CONFIG_DIR}/config.json; pass --hf-checkpoint "
                          "DIR (the HF model it was trained from: its config.json and tokenizer)")
    if hf is not None and not (Path(hf) / "config.json").is_file():
        raise ConfigError(f"--hf-checkpoint {hf}: no config.json there (with --load it gives the config and tokenizer)")
    return CheckpointSource(eval_output.parent / f".{eval_output.name}.hf", str(load), converted=True)


def convert_loaded(source: CheckpointSource, hf_config: str | None) -> None:
    """--load -> source.hf_dir (atomic: the directory appears only complete); one left by an
    interrupted evaluation is replaced."""
    from lean_rl.backends.megatron.checkpoint_paths import CheckpointError
    from lean_rl.convert.megatron_to_hf import convert_megatron_to_hf

    assert source.load is not None
    shutil.rmtree(source.hf_dir, ignore_errors=True)
    logger.info("converting --load %s to HF in %s", source.load, source.hf_dir)
    try:
        convert_megatron_to_hf(source.load, source.hf_dir, hf_config=hf_config)
    except CheckpointError as err:
        raise ConfigError(f"--load {source.load}: {err}") from None


def run_argv(argv: list[str], args: argparse.Namespace, hf_dir: Path) -> list[str]:
    """The run's flags for an evaluation only: --debug-rollout-only (no trainer), the HF directory, and
    --prompt-data (which a run requires) set to the first evaluation set's file when not given."""
    from lean_rl.rollout.eval_config import EvalConfig
    from lean_rl.utils.custom_config import load_yaml_mapping

    ev = read_options(EvalConfig, args)
    if not ev.config_path and not ev.datasets:
        raise ConfigError("nothing to evaluate: give --eval-config FILE (or --eval-prompt-data NAME PATH)")
    sets = ev.with_sets(load_yaml_mapping(ev.config_path, "--eval-config")).sets
    out = _without_flag(_without_flag(argv, "--load"), "--hf-checkpoint")
    out += ["--debug-rollout-only", "--hf-checkpoint", str(hf_dir)]
    if not _flag_value(args, "prompt_data") and not _flag_value(args, "data_source_path"):
        out += ["--prompt-data", sets[0].path]
    return out


def evaluate(cfg: Config) -> RolloutOutput:
    """Start the engines (and any reward model / judge engines) with no trainer, run the evaluation
    rollout once, stop everything."""
    from lean_rl.engine_start import end_ray, start_engines
    from lean_rl.extensions import install
    from lean_rl.preflight import check_before_start, dataset_errors_as_config_errors
    from lean_rl.rollout.base import call_rollout_function, install_on_close
    from lean_rl.rollout.evaluation import load_eval_datasets
    from lean_rl.run_lock import lock_run_directories
    from lean_rl.utils.ray_utils import init_ray

    extensions = install(cfg)
    closers: list = []
    install_on_close(cfg, closers.append)
    locks = lock_run_directories(cfg.run.output_dir, None)
    started, ray_started = None, False
    try:
        check_before_start(cfg)
        with dataset_errors_as_config_errors():
            load_eval_datasets(cfg)  # every set read (a bad row named) before any process starts
        ray_started = init_ray(cfg.run.ray_address)
        started = start_engines(cfg, Path(cfg.run.output_dir), None, colocated=False)

        async def one_evaluation() -> RolloutOutput:
            try:
                return await call_rollout_function(cfg, extensions.evaluation_rollout, 0, None, True)
            finally:
                for close in closers:
                    await close()

        return asyncio.run(one_evaluation())
    finally:
        if started is not None:
            started.stop_rewarders()
            for stop in (started.monitor.stop, started.engines.stop,
                         *([started.teacher.stop] if started.teacher is not None else [])):
                try:
                    stop()
                except Exception:  # noqa: BLE001 - stop everything, report each failure
                    logger.exception("error while stopping the engines")
        if ray_started:
            end_ray()
        for lock in locks:
            lock.release()


def set_results(cfg: Config, out: RolloutOutput) -> dict[str, dict[str, Any]]:
    """Per set: its size, samples per prompt, pass@k's, and every eval/<set>/ metric the rollout gave."""
    from lean_rl.rollout.pass_at_k import PASS_REWARD

    results = {}
    for eval_set in cfg.eval.sets:
        prefix = f"eval/{eval_set.name}/"
        metrics = {key[len(prefix):]: value for key, value in out.metrics.items() if key.startswith(prefix)}
        samples = out.samples.get(eval_set.name, [])
        correct: dict[int, int] = {}  # per prompt: its samples at full reward (what pass@k counts)
        for s in samples:
            correct[s.group_index] = correct.get(s.group_index, 0) + int(s.reward is not None and s.reward >= PASS_REWARD)
        results[eval_set.name] = {
            "path": eval_set.path, "n_samples_per_prompt": eval_set.n_samples_per_prompt,
            "samples": len(samples), "correct_per_prompt": [correct[i] for i in sorted(correct)],
            "pass_at_k": {str(k): metrics[f"pass@{k}"] for k in eval_set.ks if f"pass@{k}" in metrics},
            "metrics": metrics}
    return results


def set_line(name: str, result: dict[str, Any]) -> str:
    """`NAME: pass@1 0.5000  pass@4 0.7500  reward_mean 0.4200  (48 samples, 4 per prompt, 0 failed)`"""
    metrics = result["metrics"]
    scores = [f"pass@{k} {v:.4f}" for k, v in result["pass_at_k"].items()]
    if "reward_mean" in metrics:
        scores.append(f"reward_mean {metrics['reward_mean']:.4f}")
    return (f"{name}: {'  '.join(scores) or 'no scores'}  ({result['samples']} samples, "
            f"{result['n_samples_per_prompt']} per prompt, {int(metrics.get('failed', 0))} failed)")


def write_json(path: Path, report: dict[str, Any]) -> None:
    """Atomically: a reader finds the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def evaluate_command(argv: list[str]) -> dict[str, Any]:
    """The whole command: flags -> checkpoint -> engines -> scores; returns the JSON report it wrote."""
    from lean_rl.cli import ArgumentParser
    from lean_rl.config import build_parser, parse_config
    from lean_rl.options import add_options

    parser = ArgumentParser(prog="lean_rl.evaluate", allow_abbrev=False, description=(
        "Score a checkpoint (--hf-checkpoint DIR or --load MEGATRON_CKPT) on --eval-config sets with pass@k "
        "(--eval-pass-k). Every other flag is a run's: python -m lean_rl.train --help; docs/evaluate.md."))
    own, rest = add_options(parser, EvaluateOptions).parse_known_args(argv)
    options = read_options(EvaluateOptions, own)
    if not options.eval_output:
        raise ConfigError("--eval-output PATH is required (the JSON file of the scores)")
    eval_output = Path(options.eval_output)
    if eval_output.is_dir():
        raise ConfigError(f"--eval-output {eval_output}: is a directory (give the JSON file's path)")
    args, _ = build_parser().parse_known_args(rest)
    source = checkpoint_source(args, eval_output)
    cfg_argv = run_argv(rest, args, source.hf_dir)
    try:
        if source.converted:
            convert_loaded(source, _flag_value(args, "hf_checkpoint"))
        cfg = parse_config(cfg_argv)
        out = evaluate(cfg)
    finally:
        if source.converted:
            shutil.rmtree(source.hf_dir, ignore_errors=True)
    results = set_results(cfg, out)
    for name, result in results.items():
        print(set_line(name, result), flush=True)
    report = {"checkpoint": {"hf_checkpoint": None if source.converted else str(source.hf_dir), "load": source.load},
              "eval_config": cfg.eval.config_path, "sets": results}
    write_json(eval_output, report)
    return report
