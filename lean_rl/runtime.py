"""Everything a training loop holds, built in one place and in the order that fails fastest.

Both loops (train.py, train_async.py) use the same Runtime (run by run_loop.py); they differ only in
the order in which they call generate / train / sync. Start-up: flags and user hooks were checked by
parse_config / extensions.install; then preflight.py (model dir, checkpoints, ports, --save,
--ray-address) and the buffer (every dataset row read and rendered), before any process starts; then
Ray, the trainer (trainer_groups.py) with the engines on a thread beside it (engine_start.py; with
--colocate after it, into its bundles), and the weight sync, whose first update puts the trainer's
weights on the engines and proves it with the probe before any rollout. A trainer that fails to start
is reported once the engines' start, bounded by --engine-start-timeout, has ended.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lean_rl.backends.megatron.train_options import Distillation, TrainOptions
from lean_rl.buffer.data_buffer import DataBuffer, create_data_buffer
from lean_rl.ci_test import check_step
from lean_rl.config import Config
from lean_rl.debug_rollout import load_debug_rollout, record_train_groups, replayed_rollout
from lean_rl.checkpoint_save import Checkpoints
from lean_rl.engine_start import StartedEngines, end_ray, report_placement, start_engines
from lean_rl.preflight import check_before_start, dataset_errors_as_config_errors
from lean_rl.extensions import install
from lean_rl.rollout.base import RolloutOutput, call_rollout_function, install_on_close
from lean_rl.rollout.evaluation import load_eval_datasets
from lean_rl.run_lock import lock_run_directories
from lean_rl.sample import Sample
from lean_rl.step_metrics import run_counters
from lean_rl.stop import StopSignals
from lean_rl.train_hooks import before_training
from lean_rl.trainer_groups import TrainerGroups
from lean_rl.trainer_heal import TrainerHealer
from lean_rl.trainer_start import warn_nothing_left
from lean_rl.trainer_turns import TrainerTurns
from lean_rl.utils.metrics import MetricsLogger, Timers
from lean_rl.utils.ray_utils import init_ray

if TYPE_CHECKING:
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.megatron.rank_errors import MegatronGroupError
    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.backends.sglang.health import EngineMonitor
    from lean_rl.weight_sync.engine_weights import EngineWeights

logger = logging.getLogger(__name__)


class Runtime:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.extensions = install(cfg)  # loaded and checked once; the rollout finds them installed
        self.closers: list[Callable[[], Awaitable[None]]] = []  # awaited when the loop ends (run_loop.py)
        install_on_close(cfg, self.closers.append)  # rollout code registers what it started (capture servers)
        self.timers = Timers()
        self.output_dir = Path(cfg.run.output_dir)
        self.buffer: DataBuffer | None = None
        self.turns = TrainerTurns(cfg.engines.releases_memory, cfg.run.colocate)  # who holds the devices
        self.colocated = cfg.run.colocate and not cfg.run.debug_rollout_only  # engines in the trainer's bundles
        self.trainers = TrainerGroups(cfg, self.colocated, self.turns)  # the actor and PPO's critic
        self.engines: EngineGroup | None = None
        self.teacher_engines: EngineGroup | None = None  # --use-opd --opd-teacher-hf-checkpoint: the teacher's
        self.rewarders: StartedEngines | None = None  # their engines (--rm-hf-checkpoint / --judge-*) and monitors
        self.monitor: EngineMonitor | None = None
        self.weight_sync: EngineWeights | None = None
        self.logger: MetricsLogger | None = None
        self.start_step = 0
        self.resume_state: dict | None = None  # extra state of the checkpoint resumed from
        self.stop = StopSignals(cfg.run.stop_timeout_s)  # SIGTERM / SIGINT: see run_loop.py
        self.checkpoints = Checkpoints(cfg, self.trainers, self.turns, self.timers)  # --save's (checkpoint_save.py)
        self._ray_started = False
        self.healer: TrainerHealer | None = None  # a lost trainer rank: back to the last checkpoint (trainer_heal.py)
        self._locks: list = []  # of --output-dir and --save (run_lock.py), held until close

    @property
    def trainer(self) -> MegatronGroup | None:
        return self.trainers.actor

    @property
    def critic(self) -> MegatronGroup | None:
        return self.trainers.critic

    @property
    def finished(self) -> bool:  # resumed from a checkpoint at or past --num-rollout
        return self.start_step >= self.cfg.run.num_rollout

    def start(self) -> Runtime:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        cfg = self.cfg
        # first: no other run writes into this run's directories (lean_rl/run_lock.py)
        self._locks = lock_run_directories(cfg.run.output_dir, cfg.train.checkpoint.save)
        # before any process starts: the model dir, checkpoints, ports, --save (preflight.py), the datasets
        check_before_start(cfg)
        with dataset_errors_as_config_errors():
            self.buffer = create_data_buffer(cfg, self.extensions.data_source) if cfg.data.has_prompts else None
            if cfg.eval.datasets and cfg.starts_engines:
                load_eval_datasets(cfg)  # a bad eval set fails now, not at the first evaluation (cached for it)
        logger.info("start-up checks passed (flags, model, data, hooks, checkpoints, ports); starting Ray")
        self._ray_started = init_ray(cfg.run.ray_address)
        # Engines placed apart from the trainer start beside it (each spends tens of seconds importing and
        # loading on CPU); --colocate places them into the trainer's bundles, so they start after it.
        beside = cfg.starts_engines and not self.colocated
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lean_rl-engines") as pool:
            engines = pool.submit(self._start_engines) if beside else None
            try:
                if not cfg.run.debug_rollout_only:  # no trainer for --debug-rollout-only
                    self.start_step, self.resume_state = self.trainers.start()
            finally:
                engines_error = engines.exception() if engines is not None else None  # waits for them
        if engines_error is not None:
            raise engines_error
        if self.finished:  # rerun of a completed run: nothing to generate for, say so and stop here
            return warn_nothing_left(cfg, self.start_step)
        if self.buffer is not None and self.resume_state:
            self.buffer.load_state_dict(self.resume_state["buffer"])
        if self.trainer is not None:
            self.healer = TrainerHealer.of(cfg, self.start_step, self.buffer)
        self.logger = MetricsLogger(self.output_dir, resume_step=self.start_step, tensorboard=cfg.run.tensorboard,
                                    wandb_project=cfg.run.wandb_project if cfg.run.use_wandb else None,
                                    wandb_run_name=cfg.run.wandb_run_name)
        if cfg.starts_engines and not beside:
            self.turns.before_engines_start()
            self._start_engines()
        report_placement(cfg, self.engines, self.trainer, self.colocated)
        if self.trainer is not None and self.engines is not None:
            from lean_rl.weight_sync.engine_weights import EngineWeights

            # restarted engines get the current weights before they rejoin the router (engine_weights.py);
            # colocated on GPU the trainer is offloaded while the engines generate: they wait for a sync
            self.weight_sync = EngineWeights.start(
                cfg.weight_sync, self.trainer, self.engines, self.monitor, version=self.start_step,
                tokenizer_path=cfg.engines.model_path, api_key=cfg.engines.api_key,
                defer_rejoin=cfg.engines.releases_memory,
                # colocated on GPU: the trainer leaves the devices before the engines' KV cache returns
                after_send=self.turns.offload if cfg.engines.releases_memory else None)
            self.turns.weight_sync = self.weight_sync
            with self.turns.turn():  # colocated on GPU: the engines release, the trainer onloads, then the sync
                report = self.sync_weights(self.start_step)
            logger.info("engines serve the trainer's weights (version %d): probe max |Δ log p| %.2e",
                        self.start_step, report.probe.max_abs_diff)

    def _start_engines(self) -> None:
        started = start_engines(self.cfg, self.output_dir, self.trainer, self.colocated)
        self.engines, self.teacher_engines, self.monitor = started.engines, started.teacher, started.monitor
        self.turns.monitor, self.rewarders = self.monitor, started

    def close(self) -> None:
        for closer in [
            self.rewarders and self.rewarders.stop_rewarders,  # the reward model's and the judge's engines
            self.weight_sync and self.weight_sync.close,
            self.monitor and self.monitor.stop,
            self.engines and self.engines.stop, self.teacher_engines and self.teacher_engines.stop,
            self.trainer and self.trainer.shutdown,
            self.critic and self.critic.shutdown, self.checkpoints.hf_exports and self.checkpoints.close,  # --save-hf
            self.logger and self.logger.close,
        ]:
            try:
                if closer:
                    closer()
            except Exception:  # noqa: BLE001 - close everything, report each failure
                logger.exception("error while shutting down")
        if self._ray_started:
            end_ray()
        for lock in self._locks:  # last: nothing of this run writes into its directories any more
            lock.release()

    # ------------------------------------------------------------ the steps of the algorithm
    async def rollout(self, step: int) -> RolloutOutput:
        """One rollout (finished groups land in the buffer), or the metrics of --load-debug-rollout-data's."""
        if self.cfg.run.load_debug_rollout_data:
            return replayed_rollout(self.cfg.run.load_debug_rollout_data, step)
        return await call_rollout_function(self.cfg, self.extensions.rollout, step, self.buffer, False)

    def take_train_groups(self, step: int) -> list[list[Sample]]:
        if self.cfg.run.load_debug_rollout_data:
            return load_debug_rollout(self.cfg.run.load_debug_rollout_data, step)
        # --save-debug-rollout-data and --dump-samples-interval, for the groups this step trains on
        return record_train_groups(self.cfg.run, step, self.buffer.get_train_groups(
            self.cfg.rollout.rollout_batch_size, policy_version=step))

    @property
    def train_options(self) -> TrainOptions:
        """What train_driver.train_rollout needs from this run: the critic, the algorithm's switches, the
        user's hooks (lean_rl/train_hooks.py), the step's context and --ci-test's check (ci_test.py)."""
        return TrainOptions(critic=self.critic, recompute_old=self.cfg.run.ci_test,
                            distillation=Distillation.of(self.cfg.distillation),
                            before_training=functools.partial(before_training, self.cfg, self.extensions),
                            changing=self.turns.changing,
                            check=functools.partial(check_step, self.cfg) if self.cfg.run.ci_test else None)

    def _engine_weights(self) -> EngineWeights:
        if self.weight_sync is None:
            raise RuntimeError("no weight sync: this run started no trainer or no engines")
        return self.weight_sync

    def sync_weights(self, version: int, probe: bool = True):
        """probe=False while the engines are paused (the probe generates): call probe_weights after
        resuming. An engine lost during the sync is waited for and synced again (engine_weights.py)."""
        report = self._engine_weights().sync(version, probe=probe)
        if probe:
            self.timers.add("sync_probe", report.probe_seconds)
        return report

    def probe_weights(self, version: int):
        started = time.perf_counter()
        result = self._engine_weights().probe(version)
        self.timers.add("sync_probe", time.perf_counter() - started)
        return result

    async def maybe_save(self, step: int) -> None:
        """Every --save-interval rollouts and after the last (checkpoint_save.Checkpoints)."""
        await self.checkpoints.maybe_save(step, self.buffer, self.start_step)

    async def save(self, step: int) -> None:
        await self.checkpoints.save(step, self.buffer, self.start_step)

    async def maybe_evaluate(self, step: int) -> dict[str, float]:
        ev = self.cfg.eval
        if not ev.datasets or not ev.interval or step % ev.interval or self.engines is None:
            return {}
        with self.timers("eval"):
            out = await call_rollout_function(self.cfg, self.extensions.evaluation_rollout, step, None, True)
        return out.metrics

    def log(self, step: int, metrics: dict[str, float]) -> None:
        heal = self.healer.metrics() if self.healer is not None else {}
        self.logger.log(step, {**metrics, **heal, **run_counters(self.buffer, self.monitor, self.weight_sync)})

    def heal_trainer(self, lost: MegatronGroupError, step: int) -> int:
        """A trainer rank, node or collective lost at `step`: back to the last checkpoint (trainer_heal.py);
        returns the step to go on from. Raises when healing is off or cannot succeed."""
        if self.healer is None:
            raise lost
        self.timers.pop()  # the lost step's partial timings
        self.start_step, self.checkpoints.saved_step = self.healer.heal(self, lost, step), None
        return self.start_step
