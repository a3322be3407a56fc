"""--lora-sync adapter with a real SGLang server (--enable-lora, its torch_native LoRA backend on CPU)
and real Megatron: after LoRA training the sync sends only A and B (as many bytes as counted by
hand), at TP 1 and 2 (the adapters' shards gathered), the probe passes, and the engine's log-probs through the router equal the trainer's when the
request names the adapter, and the base model's when it does not (so the adapter is applied, and
named by every request of ours). A second sync replaces the adapter (the same name, a new version)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from training_helpers import fixed_old_policy, make_groups, set_rollout_log_probs, train_config

from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.backends.megatron.group import MegatronGroup
from lean_rl.backends.megatron.lora_config import LoraConfig
from lean_rl.backends.megatron.train_driver import train_on_rollout
from lean_rl.backends.megatron.trainer_init import initialize_for_training
from lean_rl.backends.sglang.blocking_client import BlockingEngineClient
from lean_rl.backends.sglang.engines import EngineGroup
from lean_rl.backends.sglang.lora import ServedAdapter
from lean_rl.options import build, rebuild
from lean_rl.testing.sglang_engines import engine_config_for_tests
from lean_rl.weight_sync.config import WeightSyncConfig
from lean_rl.weight_sync.sync import WeightSync

pytestmark = [pytest.mark.integration, pytest.mark.slow]
RANK, ALPHA = 4, 8.0
# the tiny Qwen2: per layer B has q 64 + k 32 + v 32 + o 64 + gate 256 + up 256 + down 64 rows, and the
# seven A's have 64 columns each but down_proj's 256; rank 4, 2 layers, float32
ADAPTER_BYTES = 4 * 2 * RANK * ((64 + 32 + 32 + 64 + 256 + 256 + 64) + (6 * 64 + 256))


@pytest.mark.parametrize("tp", [1, 2])
def test_a_sync_moves_only_the_adapter_and_requests_that_name_it_get_the_trainers_policy(
        ray_cluster, tiny_qwen2, tmp_path, tp):
    lora = build(LoraConfig, lora_rank=RANK, lora_alpha=ALPHA)
    adapter = ServedAdapter(RANK, ALPHA, lora.hf_modules)
    config = rebuild(engine_config_for_tests(tiny_qwen2, "--rollout-num-engines", "1"), adapter=adapter)
    groups = make_groups(seed=4)
    ids = groups[0][0].tokens
    with EngineGroup(config, tmp_path / "engines") as engines, \
            MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(tensor_model_parallel_size=tp),
                                             world_size=tp) as trainer:
        base = trainer.compute_log_probs([ids]).log_probs[0]
        initialize_for_training(trainer, replace(train_config(tiny_qwen2, lr=1e-2), lora=lora), fixed_old_policy())
        set_rollout_log_probs(trainer, groups)
        cfg = build(WeightSyncConfig, adapter=adapter)
        router = BlockingEngineClient(engines.router_url, timeout_s=120, api_key=config.api_key, adapter=adapter.name)
        plain = BlockingEngineClient(engines.router_url, timeout_s=120, api_key=config.api_key)
        engine = BlockingEngineClient(engines.engine_urls[0], timeout_s=120, api_key=config.api_key)
        try:
            with WeightSync.create(cfg, trainer, engines.engine_urls, api_key=config.api_key) as sync:
                for version in (1, 2):
                    for _ in range(2):
                        train_on_rollout(trainer, groups, policy_version=version - 1)
                    report = sync.update(version)
                    trained = trainer.compute_log_probs([ids]).log_probs[0]
                    assert report.transport == "adapter" and report.bytes == ADAPTER_BYTES == 45056
                    assert report.tensors == 2 * 2 * 7 and report.probe.max_abs_diff < 1e-4
                    assert engine.weight_version() == str(version)
                    assert (trained - base).abs().max() > 0.05  # the adapter moved the policy
                    named = torch.tensor(router.score(ids).log_probs, dtype=trained.dtype)
                    unnamed = torch.tensor(plain.score(ids).log_probs, dtype=trained.dtype)
                    assert (named - trained).abs().max() < 1e-4  # the router kept lora_path
                    assert (unnamed - base).abs().max() < 1e-4  # the base weights were never touched
        finally:
            for client in (router, plain, engine):
                client.close()
