"""Trainer and algorithm flags: defaults a slime user expects, errors that name the flag."""

import argparse

import pytest

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.backends.megatron.train_config import BatchConfig, OptimizerConfig, PlacementConfig, TrainConfig
from lean_rl.backends.megatron.batch_plan import BatchPlan
from lean_rl.options import ConfigError, add_options, build, read_options


def _parse(*argv, rollout_max_response_len=None):
    parser = argparse.ArgumentParser()
    add_options(add_options(parser, AlgorithmConfig), TrainConfig, "optimizer")
    args = parser.parse_args(list(argv))
    if rollout_max_response_len is not None:
        args.rollout_max_response_len = rollout_max_response_len
    algo = read_options(AlgorithmConfig, args, max_response_len=rollout_max_response_len)
    return read_options(TrainConfig, args), algo


def test_flags_build_the_configs():
    train, algo = _parse("--lr", "2e-6", "--lr-decay-style", "cosine", "--lr-decay-iters", "100", "--clip-grad", "0.5",
                         "--micro-batch-size", "2", "--global-batch-size", "8", "--balance-data", "--save", "/x",
                         "--save-interval", "5", "--use-distributed-optimizer", "--advantage-estimator", "rloo",
                         "--eps-clip", "0.2", "--eps-clip-high", "0.28", "--kl-loss-coef", "0.01",
                         "--kl-loss-type", "low_var_kl", "--use-tis", "--actor-num-procs-per-node", "2")
    assert train.optimizer.lr == 2e-6 and train.optimizer.scheduler_decay_iters == 100
    assert train.optimizer.use_distributed_optimizer and train.batch.balance_data
    assert train.placement.layout(ParallelConfig(), "cpu").world_size == 2
    assert train.placement.layout(ParallelConfig(), "cuda").world_size == 1
    assert algo.eps_clip_high == 0.28 and algo.aggregation == "token-mean" and algo.policy_loss == "ppo"
    assert algo.needs_reference and algo.needs_rollout_log_probs and not algo.needs_critic


def test_derived_defaults_per_estimator():
    _, algo = _parse("--advantage-estimator", "dr_grpo", rollout_max_response_len=256)
    assert algo.aggregation == "seq-mean-token-sum-norm" and algo.loss_norm_length == 256
    _, algo = _parse("--advantage-estimator", "gspo")
    assert algo.aggregation == "seq-mean-token-mean" and algo.policy_loss == "gspo"
    _, algo = _parse()
    assert algo.eps_clip_high == algo.eps_clip == 0.2


@pytest.mark.parametrize("kwargs, flag", [
    (dict(eps_clip=1.5), "--eps-clip"),
    (dict(eps_clip_c=0.9), "--eps-clip-c"),
    (dict(kl_coef=0.1), "--kl-coef"),  # grpo takes KL as a loss term
    (dict(use_tis=True, decoupled_ppo=True), "--use-tis and --decoupled-ppo"),
    (dict(decoupled_ppo=True, use_rollout_logprobs=True), "--decoupled-ppo"),
    (dict(behav_imp_weight_cap=2.0), "--behav-imp-weight-cap needs --decoupled-ppo"),
    (dict(advantage_estimator="dr_grpo"), "--loss-norm-length"),
    (dict(tis_clip_low=3.0), "--tis-clip-low"),
    (dict(advantage_estimator="a2c"), "--advantage-estimator"),
])
def test_algorithm_errors_name_the_flag(kwargs, flag):
    with pytest.raises(ConfigError, match=flag):
        build(AlgorithmConfig, **kwargs)


@pytest.mark.parametrize("build, flag", [
    (lambda: OptimizerConfig(lr=0), "--lr"),
    (lambda: OptimizerConfig(lr_decay_style="cosine"), "--lr-decay-iters"),
    (lambda: OptimizerConfig(min_lr=1.0), "--min-lr"),
    (lambda: BatchConfig(use_dynamic_batch_size=True), "--max-tokens-per-gpu"),
    (lambda: BatchConfig(max_tokens_per_gpu=100), "--use-dynamic-batch-size"),
    (lambda: PlacementConfig(actor_num_nodes=0), "--actor-num-nodes"),
    (lambda: PlacementConfig(actor_num_nodes=2).layout(ParallelConfig(), "cpu"),
     r"--actor-num-nodes 2 needs a Ray cluster \(--ray-address"),
    (lambda: TrainConfig(max_consecutive_skipped_steps=0), "--max-consecutive-skipped-steps"),
])
def test_trainer_errors_name_the_flag(build, flag):
    with pytest.raises(ConfigError, match=flag):
        build()


def test_several_trainer_nodes_on_a_cluster():
    layout = PlacementConfig(actor_num_nodes=2, actor_num_procs_per_node=2).layout(
        ParallelConfig(tensor_model_parallel_size=2), "cpu", on_cluster=True)
    assert (layout.world_size, layout.num_nodes, layout.ranks_per_node, layout.data_parallel_size) == (4, 2, 2, 2)
    assert layout.on_cluster
    one = PlacementConfig().layout(ParallelConfig(), "cpu")
    assert (one.num_nodes, one.on_cluster) == (1, False)


def test_colocated_engines_go_to_trainer_nodes():
    def nodes(num_nodes, device="cpu", per_node=1):
        return PlacementConfig(actor_num_nodes=num_nodes, actor_num_gpus_per_node=per_node).layout(
            ParallelConfig(), device, on_cluster=True)

    assert nodes(2).colocated_engine_nodes(2) == [0, 1]
    assert nodes(2).colocated_engine_nodes(4) == [0, 0, 1, 1]  # engines numbered node by node
    assert nodes(4).colocated_engine_nodes(2) == [0, 2]
    assert nodes(1).colocated_engine_nodes(3) == [0, 0, 0]
    with pytest.raises(ConfigError, match=r"--rollout-num-engines \(3\) must be a multiple of --actor-num-nodes \(2\)"):
        nodes(2).colocated_engine_nodes(3)
    assert nodes(2, "cuda", per_node=4).colocated_engine_nodes(4, gpus_per_engine=2) == [0, 0, 1, 1]
    with pytest.raises(ConfigError, match="--rollout-num-gpus-per-engine 4 per trainer node need more GPUs"):
        nodes(2, "cuda", per_node=4).colocated_engine_nodes(4, gpus_per_engine=4)


def test_steps_per_rollout_from_either_flag():
    assert BatchPlan(BatchConfig(global_batch_size=8, micro_batch_size=2), 2).steps_for(16) == 2
    assert BatchPlan(BatchConfig(num_steps_per_rollout=4), 2).steps_for(16) == 4
    assert BatchPlan(BatchConfig(), 2).steps_for(6) == 1
    with pytest.raises(ConfigError, match="not a multiple of --global-batch-size 8"):
        BatchPlan(BatchConfig(global_batch_size=8), 1).steps_for(12)
    with pytest.raises(ConfigError, match="--num-steps-per-rollout 3 disagrees"):
        BatchPlan(BatchConfig(global_batch_size=8, num_steps_per_rollout=3), 1).steps_for(16)
    with pytest.raises(ConfigError, match="--micro-batch-size 2 x data-parallel size 2"):
        BatchPlan(BatchConfig(micro_batch_size=2, num_steps_per_rollout=2), 2).steps_for(12)
    with pytest.raises(ConfigError, match="--global-batch-size 6 must be a multiple"):
        BatchPlan(BatchConfig(global_batch_size=6, micro_batch_size=2), 2)


def test_save_schedule():
    from lean_rl.backends.megatron.train_config import CheckpointConfig

    ckpt = CheckpointConfig(save="/x", save_interval=3)
    assert [ckpt.should_save(step) for step in range(1, 7)] == [False, False, True, False, False, True]
    assert ckpt.should_save(4, last=True) and not CheckpointConfig().should_save(3, last=True)
    with pytest.raises(ConfigError, match="--save-interval needs --save"):
        CheckpointConfig(save_interval=2)


def test_keep_last_checkpoints():
    from lean_rl.backends.megatron.train_config import CheckpointConfig

    assert _parse()[0].checkpoint.keep_last_checkpoints is None  # default: keep all
    assert CheckpointConfig().keep_last_for("actor") is None and CheckpointConfig().keep_last_for("critic") is None
    ckpt = _parse("--save", "/x", "--keep-last-checkpoints", "2")[0].checkpoint
    # the critic saves first: one more, so the actor's previous step keeps its critic across a crash
    assert (ckpt.keep_last_checkpoints, ckpt.keep_last_for("actor"), ckpt.keep_last_for("critic")) == (2, 2, 3)
    with pytest.raises(ConfigError, match="--keep-last-checkpoints must be > 0, got 0"):
        _parse("--keep-last-checkpoints", "0")
    with pytest.raises(ConfigError, match="--keep-last-checkpoints must be >= 1, got 0"):
        CheckpointConfig(keep_last_checkpoints=0)


def test_critic_checkpoints_default_to_a_folder_beside_the_actors():
    from lean_rl.backends.megatron.train_config import CheckpointConfig

    derived = CheckpointConfig(save="/run/ckpt", load="/run/ckpt")
    assert (derived.critic_save_dir, derived.critic_load_dir) == ("/run/ckpt/critic", "/run/ckpt/critic")
    given = CheckpointConfig(save="/a", load="/b", critic_save="/c", critic_load="/d")
    assert (given.critic_save_dir, given.critic_load_dir) == ("/c", "/d")
    assert (CheckpointConfig().critic_save_dir, CheckpointConfig().critic_load_dir) == (None, None)


def test_trainer_flags_live_beside_every_other_group_and_read_the_rollout_ones(tiny_qwen2, tmp_path):
    from lean_rl.config import parse_config  # its parser raises on any clash of option strings

    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi", "label": "x"}\n')
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data)]
    cfg = parse_config(base + ["--rollout-temperature", "0.7", "--seed", "7", "--rollout-max-response-len", "64",
                               "--advantage-estimator", "dr_grpo"])
    assert cfg.train.temperature == 0.7 and cfg.train.seed == 7 and cfg.algorithm.loss_norm_length == 64
    assert cfg.train.checkpoint.hf_checkpoint == str(tiny_qwen2)  # one --hf-checkpoint for engines and trainer
    # greedy rollouts are scored at T = 1
    assert parse_config(base + ["--rollout-temperature", "0"]).train.temperature == 1.0
