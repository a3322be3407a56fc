"""The colocated set the engine-side device check (gpu_smoke.py) shares between its steps: a bfloat16
tiny qwen2 checkpoint, one colocated SGLang engine and a one-rank bf16 trainer on a local Ray, placed and
ordered as a run does (the trainer offloaded before the engines size their KV cache, review 2026-12-06
N5; the sync's after_send offloads it again), with the free GPU memory recorded at each phase."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

from lean_rl.testing.gpu_smoke_parts import free_memory


def bf16_tiny_model(out: Path) -> Path:
    """The tiny qwen2 checkpoint, its weights and config in bfloat16."""
    import torch
    from safetensors.torch import load_file, save_file

    from lean_rl.testing.tiny_model import make_tiny_model

    path = make_tiny_model(out / "tiny_bf16", arch="qwen2", seed=0)
    for file in path.glob("*.safetensors"):
        weights = {k: v.to(torch.bfloat16) for k, v in load_file(str(file)).items()}
        save_file(weights, str(file), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


class Colocated:
    """One colocated engine and a one-rank bf16 trainer on a local Ray, placed and ordered as a run does."""

    def __init__(self, device: str, out: Path):
        from lean_rl.algorithms.config import AlgorithmConfig
        from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
        from lean_rl.backends.megatron.group import MegatronGroup
        from lean_rl.backends.megatron.rank_placement import COLOCATED_RANK_SHARE
        from lean_rl.backends.megatron.hf_config import arch_from_hf_config
        from lean_rl.backends.megatron.train_config import BatchConfig, CheckpointConfig, OptimizerConfig, TrainConfig
        from lean_rl.backends.megatron.trainer_layout import TrainerLayout
        from lean_rl.backends.megatron.trainer_init import initialize_for_training
        from lean_rl.backends.sglang.engine_placement import colocated_placement
        from lean_rl.backends.sglang.engines import EngineGroup
        from lean_rl.options import build, rebuild
        from lean_rl.testing.sglang_engines import engine_config_for_tests
        from lean_rl.utils.ray_utils import init_ray
        from lean_rl.weight_sync.config import WeightSyncConfig
        from lean_rl.weight_sync.engine_weights import EngineWeights

        import ray

        self.device = device
        self.phases: dict | None = None  # free GPU memory by phase, while a step records it
        self.model = bf16_tiny_model(out)
        self._closers: list[Callable[[], object]] = []  # what was started, undone in reverse order
        init_ray(num_cpus=4)
        self._closers.append(ray.shutdown)
        try:
            layout = TrainerLayout.derive(ParallelConfig(), 1, device)
            config = MegatronConfig(arch=arch_from_hf_config(self.model), parallel=ParallelConfig(),
                                    params_dtype="bfloat16", transformer_impl="local")
            self.trainer = MegatronGroup(config, layout=layout, colocated=True)
            self._closers.append(self.trainer.shutdown)
            self.trainer.load_hf_checkpoint(self.model)
            train = TrainConfig(optimizer=OptimizerConfig(lr=1e-5), batch=BatchConfig(micro_batch_size=2),
                                checkpoint=CheckpointConfig(hf_checkpoint=str(self.model)))
            initialize_for_training(self.trainer, train, build(AlgorithmConfig))
            flags = ("--rollout-num-engines", "1", "--sglang-dtype", "bfloat16", "--engine-start-timeout", "360")
            self.config = rebuild(engine_config_for_tests(self.model, *flags), colocated=True)
            placement = colocated_placement(self.trainer.placement_group, [0], device=device, ranks_per_node=1,
                                            rank_gpu_ids=self.trainer.rank_gpu_ids, rank_share=COLOCATED_RANK_SHARE,
                                            cpus_per_rank=self.trainer.cpus_per_rank,
                                            gpus_per_engine=self.config.gpus_per_engine)
            self.trainer.offload()  # before the engines size their KV cache (N5)
            self.free_with_trainer_offloaded = free_memory(device)
            self.engines = EngineGroup(self.config, out / "engines", placement=placement)
            self._closers.append(self.engines.stop)
            self.engines.start()
            self.cfg = build(WeightSyncConfig, colocate=True, device=device)
            self.weights = EngineWeights.start(self.cfg, self.trainer, self.engines, None, version=0,
                                               tokenizer_path=str(self.model), api_key=self.config.api_key,
                                               defer_rejoin=True, after_send=self._offload_trainer)
            self._closers.append(self.weights.close)
        except BaseException:
            self.close()
            raise

    def _record(self, phase: str) -> None:
        if self.phases is not None:
            self.phases[phase] = free_memory(self.device)

    def _offload_trainer(self) -> None:
        """The sync's after_send, as the run's (TrainerTurns.offload), with the memory around it."""
        self._record("sent")
        self.trainer.offload()
        self._record("offloaded")

    def turn_and_sync(self, version: int, on_released=None):
        """One colocated turn as TrainerTurns makes it (engines release, trainer onloads), then the sync
        inside it; `on_released()` runs while the engines hold nothing."""
        def onload():
            self._record("released")
            if on_released is not None:
                on_released()
            self.trainer.onload()
            self._record("onloaded")

        with self.weights.trainer_turn(onload):
            report = self.weights.sync(version)
        self._record("kv_back")
        return report

    def close(self) -> None:
        while self._closers:
            close = self._closers.pop()
            try:
                close()
            except Exception as error:  # noqa: BLE001 - best effort: the next part must still go
                print(f"gpu_smoke: {getattr(close, '__qualname__', close)}: {error}", file=sys.stderr)
