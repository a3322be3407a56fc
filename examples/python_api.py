"""The main job (scripts/run-tiny-cpu.sh: GRPO on the toy task, tiny random-init Qwen2, CPU) driven from
Python: the configuration built from keyword arguments, the reward and the loss given as Python
functions (no dotted paths), the loop run in this process, the metrics returned. Read it top to bottom
as a notebook; docs/python_api.md explains each part.

    .venv/bin/python examples/python_api.py                     # 40 steps, ~3 min on 2 cores
    .venv/bin/python examples/python_api.py --num-rollout 4 --out /tmp/pyapi --async-mode one-step
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lean_rl import api
from lean_rl.algorithms.losses import policy_loss
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.testing.tiny_model import make_tiny_model
from lean_rl.testing.toy_task import KINDS, write_dataset


# --- 1. the reward: a Python function (the --custom-rm-path contract: async, (cfg, sample) -> float).
# The prompt asks for digits or letters (sample.label); the reward is the fraction of response tokens
# of that kind. It runs in this process, in the rollout.
async def kind_reward(cfg, sample) -> float:
    tokenizer = load_tokenizer(cfg.engines.model_path)
    tokens = [t for t in sample.response_tokens if t not in tokenizer.all_special_ids]
    if not tokens:
        return 0.0
    return sum(bool(KINDS[sample.label].fullmatch(tokenizer.decode([t]))) for t in tokens) / len(tokens)


# --- 2. a loss given as a lambda (the --custom-loss-function-path contract): the built-in GRPO / PPO
# loss plus one metric. It runs on the trainer's ranks, which are Ray actors: the lambda travels there by
# value, and `train/python_loss_calls` in the metrics (1.0: weighted like every loss metric) shows it ran.
def grpo_loss_with_marker(algo, **inputs):
    loss, metrics = policy_loss(algo, **inputs)
    return loss, {**metrics, "python_loss_calls": inputs["metric_weights"].sum()}


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="outputs/python-api", help="model, data and the run's outputs")
    parser.add_argument("--num-rollout", type=int, default=40)
    parser.add_argument("--async-mode", default="off", choices=("off", "one-step"))
    args = parser.parse_args(argv)
    out = Path(args.out)

    # --- 3. the tiny model and the toy task's prompts (as scripts/run-tiny-cpu.sh makes them)
    if not (out / "model" / "config.json").is_file():
        make_tiny_model(out / "model", arch="qwen2", seed=0, preset="tiny")
    if not (out / "data" / "eval.jsonl").is_file():
        write_dataset(out / "data" / "train.jsonl", 512, seed=0)
        write_dataset(out / "data" / "eval.jsonl", 32, seed=1)

    # --- 4. the configuration: one keyword per flag of scripts/run-tiny-cpu.sh (--rollout-batch-size 8 is
    # rollout_batch_size=8); a misspelt keyword is refused naming it. `cfg` is the same Config the
    # flags build (api.command_line(...) shows the command line it stands for).
    cfg = api.build_config(
        hf_checkpoint=out / "model", output_dir=out / "run", no_tensorboard=True, async_mode=args.async_mode,
        prompt_data=out / "data" / "train.jsonl", input_key="prompt", label_key="label", rollout_shuffle=True,
        custom_rm_path=kind_reward,
        custom_loss_function_path=lambda algo, **inputs: grpo_loss_with_marker(algo, **inputs),
        num_rollout=args.num_rollout, rollout_batch_size=8, n_samples_per_prompt=8,
        rollout_max_response_len=12, rollout_temperature=1.0,
        eval_prompt_data=("toy", out / "data" / "eval.jsonl"), eval_interval=10, n_samples_per_eval_prompt=4,
        advantage_estimator="grpo", eps_clip=0.2, kl_loss_coef=0.0, entropy_coef=0.0,
        lr=1e-3, lr_warmup_iters=2, weight_decay=0.0, clip_grad=1.0,
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1, micro_batch_size=16,
        rollout_num_engines=1, sglang_max_total_tokens=8192,
    )

    # --- 5. train: Ray, the SGLang engine and router, the Megatron trainer start here and are closed
    # before train() returns; the result is one dict of metrics per step
    steps = api.train(cfg)

    # --- 6. the reward curve
    print("\nstep  reward")
    for row in steps:
        reward = row["rollout/reward_mean"]
        print(f"{int(row['step']):4d}  {reward:.3f}  {'#' * round(40 * reward)}")
    evals = [(int(r["step"]), r["eval/toy/reward_mean"]) for r in steps if "eval/toy/reward_mean" in r]
    print("eval reward:", ", ".join(f"step {s}: {v:.3f}" for s, v in evals) or "none (fewer than 10 steps)")
    return steps


if __name__ == "__main__":  # the guard matters: checkpointing spawns processes that re-import __main__
    main()
