"""The run's SGLang engine groups: the policy's (into the trainer's bundles with --colocate) and, with
--use-opd --opd-teacher-hf-checkpoint, the teacher's (rollout/distillation.teacher_engine_group) beside
it, with --rm-hf-checkpoint / --judge-hf-checkpoint the reward model's and the judge's
(rollout/reward_model.py, judge.py), plus the health monitor of the policy's; and where they landed
on a cluster."""

from __future__ import annotations

import concurrent.futures
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.backends.sglang.health import EngineMonitor
    from lean_rl.config import Config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartedEngines:
    engines: EngineGroup
    teacher: EngineGroup | None
    monitor: EngineMonitor
    # --rm-hf-checkpoint / --judge-hf-checkpoint: the reward model's and the judge's groups (no weight updates)
    rewarders: tuple[EngineGroup, ...] = ()
    # one per rewarder group: a dead or hung server leaves its router and is restarted (it serves its
    # HF checkpoint, so it rejoins at once); the reward model picks among the router's healthy ones
    rewarder_monitors: tuple[EngineMonitor, ...] = ()

    def stop_rewarders(self) -> None:
        """The monitors first (they would restart what is stopped), then the groups; each failure logged."""
        for stop in [*(m.stop for m in self.rewarder_monitors), *(g.stop for g in self.rewarders)]:
            try:
                stop()
            except Exception:  # noqa: BLE001 - stop everything, report each failure
                logger.exception("error while stopping a rewarder's engines")


def start_engines(cfg: Config, output_dir: Path, trainer: MegatronGroup | None, colocated: bool) -> StartedEngines:
    """Both groups started (the teacher's beside the policy's: each spends ~30 s importing SGLang), or
    neither left running. On a cluster the engines' URLs are known only now: the groups publish them in
    their configs' LiveEndpoints (cfg.engines.live, cfg.distillation.teacher_engines.live), which the
    rollout reads."""
    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.backends.sglang.health import EngineMonitor
    from lean_rl.rollout.distillation import teacher_engine_group
    from lean_rl.rollout.judge import judge_engine_group
    from lean_rl.rollout.reward_model import reward_model_engine_group

    teacher = teacher_engine_group(cfg, output_dir)
    rewarders = tuple(g for g in (reward_model_engine_group(cfg, output_dir), judge_engine_group(cfg, output_dir))
                      if g is not None)
    others = tuple(g for g in (teacher, *rewarders) if g is not None)
    engines = None
    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, len(others)), thread_name_prefix="lean_rl-groups") as pool:
            starts = [pool.submit(group.start) for group in others]
            try:
                placement = engine_placement(cfg, trainer) if colocated and trainer is not None else None
                engines = EngineGroup(cfg.engines, output_dir / "engines", placement=placement).start()
            finally:
                errors = [start.exception() for start in starts]  # waits for each
        for error in errors:
            if error is not None:
                raise error
        return StartedEngines(engines, teacher, EngineMonitor(engines).start(), rewarders,
                              tuple(EngineMonitor(group).start() for group in rewarders))
    except BaseException:
        for group in (engines, *others):
            if group is not None:
                group.stop()
        raise


def engine_placement(cfg: Config, trainer: MegatronGroup):
    """--colocate: engine i goes into the bundle of the trainer node it shares devices with
    (engine_placement.colocated_placement)."""
    from lean_rl.backends.megatron.rank_placement import COLOCATED_RANK_SHARE
    from lean_rl.backends.sglang.engine_placement import colocated_placement

    engines, layout = cfg.engines, cfg.layout
    assert engines.num_engines is not None  # derived at parse time (EngineConfig.derive_fields)
    return colocated_placement(
        trainer.placement_group, layout.colocated_engine_nodes(engines.num_engines, engines.gpus_per_engine),
        device=layout.device, ranks_per_node=layout.ranks_per_node, rank_gpu_ids=trainer.rank_gpu_ids,
        rank_share=COLOCATED_RANK_SHARE, cpus_per_rank=trainer.cpus_per_rank, gpus_per_engine=engines.gpus_per_engine)


def report_placement(cfg: Config, engines: EngineGroup | None, trainer: MegatronGroup | None, colocated: bool) -> None:
    """On a cluster: the nodes of the engines and of the trainer's ranks, in one line."""
    if engines is None or not cfg.engines.on_cluster:
        return
    from urllib.parse import urlparse

    logger.info("placement: engines on nodes %s; trainer ranks on nodes %s%s",
                [urlparse(url).hostname for url in engines.engine_urls],
                trainer.rank_nodes() if trainer is not None else [],
                " (colocated: engines in the trainer's bundles)" if colocated else "")


def end_ray() -> None:
    """The end of the Ray this run started: first the API key's copies the engines' start placed on the
    other nodes (key_placement.py), removed by Ray tasks while Ray still runs them."""
    from lean_rl.backends.sglang.key_placement import remove_placed_key_files
    from lean_rl.utils.ray_utils import shutdown_ray

    remove_placed_key_files()
    shutdown_ray()
