"""slime's `args` without slime (lean_rl/slime_namespace.py, the generated lean_rl/slime_args_table.py):
attribute by attribute what slime's own parser builds for slime's launch scripts (tests/unit/
slime_expected_args/*.json, written by tools/slime_expected_args.py running slime 624b824's parse_args
offline), and the same namespace read back through every compat entry point of a run launched with
lean_rl.slime_launch. Pure logic: no engine."""

import asyncio
import enum
import json
from pathlib import Path

import pytest
import torch

from lean_rl.algorithms.hooks import AdvantageInputs
from lean_rl.algorithms.slime_contracts import algorithm_args, slime_advantages, slime_loss
from lean_rl.config import parse_config
from lean_rl.options import ConfigError
from lean_rl.sample import Sample
from lean_rl.slime_args_table import ROWS, SLIME_COMMIT
from lean_rl.slime_compat.args import build_args
from lean_rl.slime_compat.hooks import (SlimeAllSamplesProcess, SlimeDynamicFilter, SlimeGenerate, SlimeReward,
                                        SlimeRewardPostProcess, SlimeSampleFilter)
from lean_rl.slime_compat.rollout_function import SlimeRolloutFunction
from lean_rl.slime_compat.run_state import bind_run
from lean_rl.slime_compat.source_adapter import SlimeSourceFactory
from lean_rl.slime_launch import plan
from lean_rl.slime_namespace import defined_attributes, slime_namespace, slime_view

EXPECTED = sorted(Path(__file__).with_name("slime_expected_args").glob("*.json"))


def plain(value):
    """As tools/slime_expected_args.py stores a value (JSON; an enum by its name)."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def test_the_table_is_slimes_parser_at_our_commit():
    assert SLIME_COMMIT.startswith("624b824") and len(ROWS) > 1400
    assert {"context_parallel_size", "rollout_max_context_len", "eval_max_response_len", "sglang_mem_fraction_static",
            "router_policy", "sglang_router_request_timeout_secs", "debug_train_only"} <= defined_attributes()
    assert len(EXPECTED) >= 7


@pytest.mark.parametrize("path", EXPECTED, ids=[p.stem for p in EXPECTED])
def test_the_namespace_is_slimes_attribute_by_attribute(path):
    record = json.loads(path.read_text())
    expected, ours = record["args"], {k: plain(v) for k, v in vars(slime_namespace(record["argv"])).items()}
    assert sorted(set(expected) - set(ours)) == [], "attributes slime's parser sets and ours lacks"
    assert sorted(set(ours) - set(expected)) == [], "attributes ours sets and slime's parser does not"
    differ = {k: (expected[k], ours[k]) for k in expected if expected[k] != ours[k]}
    assert differ == {}, "(slime's, ours)"


def test_issue_38s_cases_read_back_as_slime_reads_them():
    args = slime_namespace(["--hf-checkpoint", "/m", "--rollout-max-context-len", "1024", "--eval-max-response-len",
                            "64", "--eval-temperature", "0.5", "--rollout-temperature", "0.9", "--rollout-max-response-len",
                            "32", "--moe-layer-freq", "([1]*2+[0])*2", "--sglang-context-length", "4k"])
    assert (args.rollout_max_context_len, args.rollout_max_prompt_len, args.eval_max_context_len) == (1024, 1023, 1024)
    assert (args.rollout_max_response_len, args.eval_max_response_len) == (32, 64)
    assert (args.rollout_temperature, args.eval_temperature) == (0.9, 0.5)
    assert args.context_parallel_size == 1 and args.moe_layer_freq == [1, 1, 0, 1, 1, 0]
    assert args.sglang_context_length == 4000 and args.tokenizer_model == "/m"
    with pytest.raises(ConfigError, match=r"^slime's parser: argument --rollout-temperature: invalid float"):
        slime_namespace(["--rollout-temperature", "hot"])


def test_lean_rl_flags_go_over_slimes_defaults_and_slimes_command_line_over_lean_rls():
    import argparse

    lean = argparse.Namespace(rollout_temperature=0.3, only_lean_rl=1)
    assert slime_view(None, lean).rollout_temperature == 0.3 and slime_view(None, lean).context_parallel_size == 1
    launched = slime_view(json.dumps(["--rollout-temperature", "0.8"]), lean)
    assert launched.rollout_temperature == 0.8 and launched.only_lean_rl == 1
    launched.rollout_temperature = 2.0  # a function's change stays in its own namespace
    assert slime_view(json.dumps(["--rollout-temperature", "0.8"]), lean).rollout_temperature == 0.8


class Seen(Exception):
    """Raised by each slime-style function below once it has kept the `args` it was called with."""


SLIME_FLAGS_GIVEN = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "3",
                     "--rollout-max-context-len", "1024", "--rollout-max-response-len", "48", "--eval-max-response-len",
                     "64", "--rollout-temperature", "0.9", "--eval-temperature", "0.5", "--input-key", "prompt",
                     "--label-key", "label", "--apply-chat-template", "--context-parallel-size", "1",
                     "--sglang-server-concurrency", "16", "--init-method-std", "0.02", "--eps-clip", "0.25"]


@pytest.fixture
def launched_cfg(tiny_qwen2, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": [{"role": "user", "content": "2+2?"}], "label": "4"}) + "\n")
    argv = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), *SLIME_FLAGS_GIVEN]
    launch = plan("train.py", argv)
    cfg = parse_config([*launch.argv, "--output-dir", str(tmp_path / "out")])
    cfg.engines.live.publish(["http://127.0.0.1:31001"], "http://127.0.0.1:31000")
    bind_run(cfg)
    return cfg, slime_namespace(launch.slime_argv)


def _entry_points(cfg):
    """(name, call) for each compat entry point; `call(fn)` runs it with a slime function `fn`."""
    sample = Sample(index=0, group_index=0, prompt=[{"role": "user", "content": "2+2?"}], tokens=[5, 6], label="4")
    group = [sample]
    lengths = torch.tensor([2])
    inputs = AdvantageInputs(rewards=torch.tensor([1.0]), group_ids=torch.tensor([0]), mask=torch.ones(1, 2),
                             valid=torch.tensor([True]), rollout_log_probs=torch.zeros(1, 2), response_lengths=lengths,
                             total_lengths=lengths + 2)

    def run(coro):
        return asyncio.run(coro)

    def loss(fn):
        slime_loss(fn, "p.loss")(cfg.algorithm, log_probs=torch.zeros(1, 2), advantages=torch.ones(1, 2),
                                 mask=torch.ones(1, 2), weights=torch.ones(1, 2), metric_weights=torch.ones(1, 2))

    return [
        ("rollout function", lambda fn: SlimeRolloutFunction(fn, "--rollout-function-path p.f")(cfg, 0, None, True)),
        ("generate", lambda fn: run(SlimeGenerate(fn, "--custom-generate-function-path p.g")(cfg, sample, {}))),
        ("reward", lambda fn: run(SlimeReward(fn, "--custom-rm-path p.r")(cfg, sample))),
        ("dynamic filter", lambda fn: SlimeDynamicFilter(fn, "--dynamic-sampling-filter-path p.d")(cfg, group)),
        ("sample filter", lambda fn: SlimeSampleFilter(fn, "--rollout-sample-filter-path p.s").over_groups(cfg, [group])),
        ("reward post-process", lambda fn: SlimeRewardPostProcess(fn, "--custom-reward-post-process-path p.p")
         .over_groups(cfg, [group])),
        ("all-samples process", lambda fn: SlimeAllSamplesProcess(fn, "--rollout-all-samples-process-path p.a")(
            cfg, [group], 0)),
        ("data source", lambda fn: SlimeSourceFactory(fn, "--data-source-path p.D")(cfg)),
        ("advantage", lambda fn: slime_advantages(fn, cfg.algorithm, inputs, "--custom-advantage-function-path p.A")),
        ("loss", loss),
    ]


def test_every_entry_point_hands_slime_functions_slimes_namespace(launched_cfg):
    cfg, expected = launched_cfg
    for name, call in _entry_points(cfg):
        seen = []

        def fn(args, *rest, **kw):
            seen.append(args)
            raise Seen

        with pytest.raises(Seen):
            call(fn)
        args = seen[0]
        for attribute, value in vars(expected).items():
            if attribute in ("sglang_router_ip", "sglang_router_port"):  # the run's router, set at run time
                continue
            assert plain(getattr(args, attribute)) == plain(value), f"{name}: args.{attribute}"
        assert (args.rollout_max_context_len, args.rollout_max_response_len, args.rollout_temperature) == (
            1024, 48, 0.9), name
        assert args.init_method_std == 0.02 and args.eps_clip_high == 0.25, name
        assert args.sglang_server_concurrency == 16, name
    assert build_args(cfg).sglang_router_port == 31000 and build_args(cfg).rollout_num_engines == 1
    assert algorithm_args(cfg.algorithm).eps_clip == 0.25
