"""Rollout routing replay (--use-rollout-routing-replay) on the tiny Qwen3-MoE: a real SGLang server on
CPU returns every token's experts, and the real Megatron trainer replays them.

The engine serves in bfloat16 while the trainer computes in float32, as on GPUs where the engine's
kernels differ from the trainer's: some near-tie routes flip between the two, and each flip moves the
log-probs of the tokens after it. Replay removes that part of the train-inference mismatch."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from lean_rl import routed_experts
from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
from lean_rl.backends.megatron.group import MegatronGroup
from lean_rl.backends.megatron.hf_config import arch_from_hf_config
from lean_rl.backends.megatron.rollout_batch import rollout_batch
from lean_rl.backends.megatron.train_config import BatchConfig
from lean_rl.backends.megatron.batch_plan import BatchPlan
from lean_rl.backends.megatron.train_driver import forward_rollout, train_on_rollout
from lean_rl.backends.sglang.blocking_client import BlockingEngineClient
from lean_rl.backends.sglang.engines import EngineGroup
from lean_rl.backends.sglang.server_command import server_flags
from lean_rl.rollout.generate import token_versions
from lean_rl.sample import Sample, Status
from lean_rl.testing.driver_result import run_driver
from lean_rl.testing.sglang_engines import engine_config_for_tests
from lean_rl.options import build

from training_helpers import train_config

LAYERS, TOPK, EXPERTS = 2, 2, 4  # the tiny preset
PROMPTS, RESPONSE_TOKENS = 16, 48


HOST_BUFFER = """
from lean_rl.backends.sglang import compat
compat.enable_sglang_cpu_engine(); compat.put_cpu_kernels_first(); compat.load_torchvision_fix()
from sglang.srt.state_capturer.base import BaseHostCache
out = {}
try:
    BaseHostCache(16, 2, 2, name="routed_experts", device="cpu")
except Exception as err:
    out["unpatched"] = f"{type(err).__name__}: {err}"
compat.allocate_host_buffers_unpinned()
out["patched"] = list(BaseHostCache(16, 2, 2, name="routed_experts", device="cpu").buffer.shape)
from lean_rl.testing.driver_result import write_result
write_result(out)
"""


def test_cpu_engine_needs_the_unpinned_route_buffer():
    """Why backends/sglang/compat.py allocate_host_buffers_unpinned exists: SGLang's routed-experts host
    buffer (state_capturer/base.py:67) is pinned with cudaHostRegister, which a CPU-only torch refuses,
    and the server dies at start-up with this error; with the patch the buffer is plain CPU memory."""
    done, out = run_driver(HOST_BUFFER, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert out == {"unpatched": "AssertionError: Torch not compiled with CUDA enabled", "patched": [16, 2, 2]}


@pytest.fixture(scope="module")
def bf16_moe_engine(tiny_model_factory, tmp_path_factory, ray_cluster):
    """One SGLang server on the tiny qwen3_moe, bfloat16, recording routes (as --use-rollout-routing-replay
    starts the engines)."""
    model = tiny_model_factory("qwen3_moe")
    config = dataclasses.replace(
        engine_config_for_tests(model, "--rollout-num-engines", "1", "--sglang-dtype", "bfloat16"),
        return_routed_experts=True)
    assert "--enable-return-routed-experts" in server_flags(config, 0, 30000)
    with EngineGroup(config, tmp_path_factory.mktemp("moe_engine")) as group:
        with BlockingEngineClient(group.engine_urls[0], timeout_s=120, api_key=config.api_key) as client:
            yield model, client


def _generate(client, input_ids, max_new_tokens, seed: int = 0):
    params = {"max_new_tokens": max_new_tokens, "temperature": 1.0, "ignore_eos": True, "sampling_seed": seed}
    return client.generate(input_ids, params, return_logprob=True, return_routed_experts=True)


def _hf_routes(model_dir, tokens: list[int]) -> np.ndarray:
    """[len(tokens), layers, topk] experts of a float32 transformers forward (sorted per row)."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = hf(torch.tensor([tokens]), output_router_logits=True).router_logits
    return np.stack([layer.topk(TOPK, dim=-1).indices.sort(dim=-1).values.numpy() for layer in logits], axis=1)


def test_engine_returns_routes_that_survive_a_partial_rollout(bf16_moe_engine):
    """The CPU server returns [prompt + output - 1, layers, topk] routes (the fix in
    backends/sglang/compat.py allocate_host_buffers_unpinned makes it start); they are the experts a
    float32 forward picks (bar near-ties in bfloat16); a call that continues a partial sample returns
    routes for all its tokens, the first call's prefix among them, and they replace the old ones."""
    model, client = bf16_moe_engine
    prompt = [5, 17, 33, 101, 7, 250]
    sample = Sample(index=0, group_index=0, prompt="p", tokens=list(prompt))
    first = _generate(client, sample.tokens, 8)
    assert routed_experts.num_values(first.routed_experts) == (len(prompt) + 8 - 1) * LAYERS * TOPK
    sample.append_response(first.output_ids, log_probs=first.output_log_probs, weight_versions=token_versions(first),
                           routed_experts=first.routed_experts)
    sample.status = Status.ABORTED  # as an interrupted request would leave it; it continues from its tokens
    second = _generate(client, sample.tokens, 6)
    before = routed_experts.decode(sample.routed_experts, len(sample.tokens) - 1)
    sample.append_response(second.output_ids, log_probs=second.output_log_probs,
                           weight_versions=token_versions(second), routed_experts=second.routed_experts)
    sample.check()
    after = routed_experts.decode(sample.routed_experts, len(sample.tokens) - 1).reshape(-1, LAYERS, TOPK)
    assert after.shape == (len(prompt) + 14 - 1, LAYERS, TOPK)
    assert ((after >= 0) & (after < EXPERTS)).all() and (after[..., 0] != after[..., 1]).all()
    assert np.array_equal(after[:before.shape[0]].reshape(before.shape), before)  # same prefix, same routes
    agree = (np.sort(after, axis=-1) == _hf_routes(model, sample.tokens)[:-1]).all(axis=-1).mean()
    assert agree >= 0.8, agree


@pytest.fixture(scope="module")
def engine_groups(bf16_moe_engine):
    return _groups(bf16_moe_engine[1], seed=0)


def _groups(client, seed: int) -> list[list[Sample]]:
    """PROMPTS / 2 groups of 2 engine samples each, with their routes."""
    rng = random.Random(seed)
    samples = []
    for i in range(PROMPTS):
        prompt = [rng.randrange(4, 500) for _ in range(rng.randrange(4, 10))]
        result = _generate(client, prompt, RESPONSE_TOKENS, seed=seed * 1000 + i)
        sample = Sample(index=i, group_index=i // 2, prompt="p", tokens=prompt)
        sample.append_response(result.output_ids, log_probs=result.output_log_probs,
                               weight_versions=token_versions(result), routed_experts=result.routed_experts)
        sample.status, sample.reward = Status.TRUNCATED, float(i % 2)
        samples.append(sample)
    return [samples[k:k + 2] for k in range(0, PROMPTS, 2)]


def _abs_diff(trainer: torch.Tensor, batch) -> tuple[float, float]:
    diff = (trainer - batch.rollout_log_probs).abs() * batch.masks
    return float(diff.sum() / batch.masks.sum()), float(diff.max())


def _with_routes(groups, make_routes) -> list[list[Sample]]:
    return [[dataclasses.replace(s, routed_experts=make_routes(s)) for s in group] for group in groups]


def _random_routes(sample: Sample, seed: int = 0) -> str:
    """Valid routes the model would mostly not choose (every 5th token NO_ROUTE): replaying them moves
    every log-prob, so any misplaced route shows."""
    rng = np.random.default_rng(seed + sample.index)
    rows = np.stack([[rng.choice(EXPERTS, TOPK, replace=False) for _ in range(LAYERS)]
                     for _ in range(len(sample.tokens) - 1)]).astype(np.int32)
    rows[::5] = routed_experts.NO_ROUTE
    return routed_experts.encode(rows)


def _replayed_log_probs(actor: MegatronGroup, groups, micro_batch_size: int) -> torch.Tensor:
    actor.batch_plan = BatchPlan(BatchConfig(micro_batch_size=micro_batch_size), actor.data_parallel_size)
    return forward_rollout(actor, rollout_batch(groups))


def test_replay_brings_trainer_log_probs_closer_to_the_engine(bf16_moe_engine, engine_groups):
    """THE measurement: the float32 trainer's log-probs of the bfloat16 engine's samples, with the
    engine's routes replayed and without (the same trainer, the routes dropped). Then the layout: routes
    replayed through micro-batches of 1 and of 4 rows (other padding, [s, b] order) give the same
    log-probs."""
    model, _ = bf16_moe_engine
    groups = engine_groups
    without = [[dataclasses.replace(s, routed_experts=None) for s in group] for group in groups]
    config = MegatronConfig(arch_from_hf_config(model), ParallelConfig(), use_rollout_routing_replay=True)
    with MegatronGroup(config) as actor:
        actor.load_hf_checkpoint(model)
        actor.setup_training(train_config(micro_batch_size=4), build(AlgorithmConfig))  # old = trainer's, detached
        replayed_batch, plain_batch = rollout_batch(groups), rollout_batch(without)
        replayed = _abs_diff(forward_rollout(actor, replayed_batch), replayed_batch)
        plain = _abs_diff(forward_rollout(actor, plain_batch), plain_batch)
        print(f"\n|trainer - engine| log-prob over {int(replayed_batch.masks.sum())} tokens: "
              f"with replay mean {replayed[0]:.5f} max {replayed[1]:.4f}; "
              f"without mean {plain[0]:.5f} max {plain[1]:.4f}")
        assert replayed[0] < plain[0] and replayed[1] <= plain[1]
        metrics = train_on_rollout(actor, groups, policy_version=0)
        print(f"train/routing_mismatch_frac {metrics['train/routing_mismatch_frac']:.4f}, "
              f"train/rollout_logprob_abs_diff {metrics['train/rollout_logprob_abs_diff']:.5f}")
        # bfloat16 flips some routes, not most; the loss saw the replayed forward's log-probs
        assert 0 < metrics["train/routing_mismatch_frac"] < 0.2
        assert metrics["train/rollout_logprob_abs_diff"] == pytest.approx(replayed[0], rel=1e-3, abs=1e-6)

        scrambled = _with_routes(groups, _random_routes)
        by_four, by_one = _replayed_log_probs(actor, scrambled, 4), _replayed_log_probs(actor, scrambled, 1)
        own = _replayed_log_probs(actor, _with_routes(groups, lambda s: None), 4)
        masks = rollout_batch(groups).masks
        assert float(((by_four - by_one).abs() * masks).max()) < 1e-5
        assert float(((by_four - own).abs() * masks).sum() / masks.sum()) > 0.1  # the routes did change things


def test_multi_turn_routes_cover_every_token_the_engine_took_as_input(bf16_moe_engine):
    """Turn 2's request is the whole trajectory so far (multi_turn.py): its routes cover the observation
    tokens that had none, and keep turn 1's for the prefix (the engine's prefix cache holds them); an
    observation after the last call stays NO_ROUTE."""
    _, client = bf16_moe_engine
    sample = Sample(index=0, group_index=0, prompt="p", tokens=[5, 17, 33, 101])
    for turn in range(2):
        result = _generate(client, sample.tokens, 5)
        before = None if sample.routed_experts is None else routed_experts.decode(sample.routed_experts,
                                                                                  len(sample.tokens) - 1)
        sample.append_response(result.output_ids, log_probs=result.output_log_probs,
                               weight_versions=token_versions(result), routed_experts=result.routed_experts)
        rows = routed_experts.decode(sample.routed_experts, len(sample.tokens) - 1)
        assert (rows >= 0).all()  # every token the engine was given has its experts
        if before is not None:
            known = (before >= 0).all(axis=1)
            assert known.sum() == 4 + 5 - 1 and (before[~known] == routed_experts.NO_ROUTE).all()
            assert np.array_equal(rows[:len(before)][known], before[known])
        sample.append_response([40, 41, 42], trainable=False)  # the environment's observation
    sample.check()
    rows = routed_experts.decode(sample.routed_experts, len(sample.tokens) - 1)
    assert (rows[-3:] == routed_experts.NO_ROUTE).all() and (rows[:-3] >= 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [
    pytest.param(ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True), id="tp2-sp"),
    pytest.param(ParallelConfig(pipeline_model_parallel_size=2), id="pp2"),
    pytest.param(ParallelConfig(expert_model_parallel_size=2, moe_token_dispatcher_type="alltoall"), id="ep2"),
])
def test_replay_is_the_same_in_every_layout(bf16_moe_engine, engine_groups, parallel):
    """Replayed routes reach the right router in every layout: sequence-parallel chunks (TP2), the
    layers of each pipeline stage (PP2), data-parallel shares (EP2): the log-probs equal one process's,
    and so do a training step's loss-side mismatch and routing_mismatch_frac (counted over the world)."""
    model, _ = bf16_moe_engine
    scrambled = _with_routes(engine_groups, _random_routes)
    log_probs, metrics = [], []
    for layout in (ParallelConfig(), parallel):
        config = MegatronConfig(arch_from_hf_config(model), layout, use_rollout_routing_replay=True)
        with MegatronGroup(config) as actor:
            actor.load_hf_checkpoint(model)
            actor.setup_training(train_config(micro_batch_size=2), build(AlgorithmConfig))
            log_probs.append(_replayed_log_probs(actor, scrambled, 2))
            metrics.append(train_on_rollout(actor, scrambled, policy_version=0))
    masks = rollout_batch(engine_groups).masks
    assert float(((log_probs[0] - log_probs[1]).abs() * masks).max()) < 1e-4
    for name in ("train/routing_mismatch_frac", "train/rollout_logprob_abs_diff"):
        assert metrics[1][name] == pytest.approx(metrics[0][name], rel=1e-4), name
    assert metrics[0]["train/routing_mismatch_frac"] > 0.3  # random routes: mostly not the model's own
