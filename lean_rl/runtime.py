"""Everything a training loop holds, built in one place and in the order that fails fastest.

Both loops (train.py, train_async.py) use the same Runtime; they differ only in the order in which
they call generate / train / sync. Start-up order: config errors and user extensions were already
checked by parse_config / load_extensions; then, before any process starts, what preflight.py checks
(model dir, checkpoints, ports, --save, --ray-address) and the buffer (every dataset row read and
rendered); then Ray, the trainer (weights, optimizer, resume), the engines (plus their health
monitor), and weight sync, whose first update puts the trainer's weights on the engines and proves it
with the probe before any rollout.

Engines placed apart from the trainer start on a thread beside it (a trainer that fails to start is
reported once the engines' start has ended, itself bounded by --engine-start-timeout). With --colocate
the trainer starts first, because the engines go into the trainer's placement group, on one node as on
a cluster (engine i into the bundle of the trainer node it shares devices with: _engine_placement).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import sys
import time
from pathlib import Path

from lean_rl.backends.megatron.train_options import TrainOptions
from lean_rl.buffer.data_buffer import DataBuffer, create_data_buffer
from lean_rl.ci_test import check_step
from lean_rl.config import Config
from lean_rl.debug_rollout import load_debug_rollout, record_train_groups
from lean_rl.plot import write_run_curves
from lean_rl.preflight import (check_before_start, dataset_errors_as_config_errors, save_filled_the_disk,
                               save_space_error)
from lean_rl.extensions import install
from lean_rl.rollout.base import RolloutOutput, rollout_function_path, rollout_output
from lean_rl.rollout.evaluation import load_eval_datasets
from lean_rl.rollout.metrics import rollout_metrics
from lean_rl.run_lock import lock_run_directories
from lean_rl.sample import Sample
from lean_rl.stop import RunStopped, StopSignals
from lean_rl.train_hooks import before_training
from lean_rl.utils.metrics import MetricsLogger, Timers, print_run_summary
from lean_rl.utils.threads import run_in_daemon_thread

logger = logging.getLogger(__name__)


class Runtime:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.extensions = install(cfg)  # loaded and checked once; the rollout finds them installed
        self.timers = Timers()
        self.output_dir = Path(cfg.run.output_dir)
        self.buffer: DataBuffer | None = None
        self.trainer = None
        self.critic = None  # PPO's value model: a second MegatronGroup of the same layout
        self.engines = None
        self.teacher_engines = None  # --use-opd --opd-teacher-hf-checkpoint: the teacher's own EngineGroup
        self.monitor = None
        self.weight_sync = None
        self.logger: MetricsLogger | None = None
        self.start_step = 0
        self.resume_state: dict | None = None  # extra state of the checkpoint resumed from
        self.stop = StopSignals(cfg.run.stop_timeout_s)  # SIGTERM / SIGINT: see run_until_stopped
        self._saved_step: int | None = None
        self._trainer_turn = False  # inside trainer_turn (colocated on GPU: the devices are the trainer's)
        self._ray_started = False
        self._locks: list = []  # of --output-dir and --save (run_lock.py), held until close

    @property
    def finished(self) -> bool:
        """Resumed from a checkpoint at or past --num-rollout."""
        return self.start_step >= self.cfg.run.num_rollout

    # ------------------------------------------------------------ start / stop
    def start(self) -> Runtime:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        from lean_rl.utils.ray_utils import init_ray

        cfg = self.cfg
        # first: no other run writes into this run's directories (lean_rl/run_lock.py)
        self._locks = lock_run_directories(cfg.run.output_dir, cfg.train.checkpoint.save)
        # before any process starts: the model dir, checkpoints, ports, --save (preflight.py), the datasets
        check_before_start(cfg)
        with dataset_errors_as_config_errors():
            self.buffer = create_data_buffer(cfg) if cfg.data.prompt_data or cfg.data.data_source_path else None
            if cfg.eval.datasets and cfg.starts_engines:
                load_eval_datasets(cfg)  # a bad eval set fails now, not at the first evaluation (cached for it)
        logger.info("start-up checks passed (flags, model, data, hooks, checkpoints, ports); starting Ray")
        self._ray_started = init_ray(cfg.run.ray_address)
        # Engines placed apart from the trainer start beside it (each spends tens of seconds importing and
        # loading on CPU); --colocate places them into the trainer's bundles, so they start after it.
        beside = cfg.starts_engines and not self._colocated
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lean_rl-engines") as pool:
            engines = pool.submit(self._start_engines) if beside else None
            try:
                self._start_trainers()
            finally:
                engines_error = engines.exception() if engines is not None else None  # waits for them
        if engines_error is not None:
            raise engines_error
        if self.finished:  # rerun of a completed run: nothing to generate for, say so and stop here
            logger.warning("the checkpoint in %s is at step %d, --num-rollout is %d: nothing left to train "
                           "(raise --num-rollout to go on)", cfg.train.checkpoint.load, self.start_step,
                           cfg.run.num_rollout)
            return
        if self.buffer is not None and self.resume_state:
            self.buffer.load_state_dict(self.resume_state["buffer"])
        self.logger = MetricsLogger(self.output_dir, resume_step=self.start_step, tensorboard=cfg.run.tensorboard,
                                    wandb_project=cfg.run.wandb_project if cfg.run.use_wandb else None,
                                    wandb_run_name=cfg.run.wandb_run_name)
        if cfg.starts_engines and not beside:
            self._start_engines()
        self._report_placement()
        if self.trainer is not None and self.engines is not None:
            from lean_rl.weight_sync.engine_weights import EngineWeights

            # restarted engines get the current weights before they rejoin the router (engine_weights.py);
            # colocated on GPU the trainer is offloaded while the engines generate: they wait for a sync
            self.weight_sync = EngineWeights.start(
                cfg.weight_sync, self.trainer, self.engines, self.monitor, version=self.start_step,
                tokenizer_path=cfg.engines.model_path, api_key=cfg.engines.api_key,
                defer_rejoin=cfg.engines.releases_memory,
                # colocated on GPU: the trainer leaves the devices before the engines' KV cache returns
                after_send=self.offload_trainers if cfg.engines.releases_memory else None)
            report = self.sync_weights(self.start_step)
            logger.info("engines serve the trainer's weights (version %d): probe max |Δ log p| %.2e",
                        self.start_step, report.probe.max_abs_diff)

    def _start_trainers(self) -> None:
        """The actor, then PPO's critic (none for --debug-rollout-only, nor on a rerun past --num-rollout)."""
        if self.cfg.run.debug_rollout_only:
            return
        self.trainer = self._start_megatron_group("actor")
        if not self.finished and self.cfg.algorithm.needs_critic:
            self.critic = self._start_megatron_group("critic")

    def _start_megatron_group(self, role: str):
        """The actor (role "actor": sets start_step and resume_state) or PPO's critic (resumed at the
        actor's step), each a Megatron group of the run's layout; shut down again if it cannot start."""
        from lean_rl.backends.megatron.group import MegatronGroup
        from lean_rl.backends.megatron.train_driver import initialize_for_training

        cfg = self.cfg
        # the actor's bundles also hold the colocated engines (see _engine_placement)
        colocated = role == "actor" and self._colocated
        placement = cfg.train.placement
        group = MegatronGroup(cfg.megatron, layout=cfg.layout, seed=cfg.train.seed, colocated=colocated,
                              call_timeout_s=placement.call_timeout_s,
                              dist_timeout_s=placement.distributed_timeout_minutes * 60,
                              # --colocate: PPO's critic takes turns on the actor's devices (review C4)
                              colocate_with=self.trainer if role == "critic" and self._colocated else None)
        try:
            step, state = initialize_for_training(group, cfg.train, cfg.algorithm, role=role,
                                                  actor_step=self.start_step, batch_plan=cfg.batch_plan)
        except BaseException:
            group.shutdown()
            raise
        if role == "actor":
            self.start_step, self.resume_state = step, state
        if role == "actor" and cfg.train.lora.enabled:
            trainable = group.trainable_parameters()
            logger.info("LoRA rank %d, alpha / rank %g: %d adapter tensors, %d trainable parameters (rank 0's "
                        "pipeline stage)", cfg.train.lora.lora_rank, cfg.train.lora.scaling, len(trainable),
                        sum(trainable.values()))
        if step:
            load_dir = cfg.train.checkpoint.load if role == "actor" else cfg.train.checkpoint.critic_load_dir
            logger.info("%sresumed from %s at step %d", "critic " if role == "critic" else "", load_dir, step)
        return group

    def _start_engines(self) -> None:
        from lean_rl.backends.sglang.engines import EngineGroup
        from lean_rl.backends.sglang.health import EngineMonitor

        opd = self.cfg.distillation
        if opd.teacher_engines is not None:  # never synced nor probed: the teacher's weights stay as loaded
            self.teacher_engines = EngineGroup(opd.teacher_engines, self.output_dir / "teacher_engines",
                                               name="teacher_engines")
        # the teacher's group starts beside the student's (each spends ~30 s importing SGLang)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lean_rl-teacher") as pool:
            teacher = pool.submit(self.teacher_engines.start) if self.teacher_engines is not None else None
            try:
                self.engines = EngineGroup(self.cfg.engines, self.output_dir / "engines",
                                           placement=self._engine_placement()).start()
            finally:
                teacher_error = teacher.exception() if teacher is not None else None  # waits for it
        if teacher_error is not None:
            raise teacher_error
        # On a cluster the engines' URLs are known only now: the groups published them in their configs'
        # LiveEndpoints (cfg.engines.live, cfg.distillation.teacher_engines.live), which the rollout reads.
        self.monitor = EngineMonitor(self.engines).start()

    def _report_placement(self) -> None:
        if self.engines is not None and self.cfg.engines.on_cluster:
            from urllib.parse import urlparse

            logger.info("placement: engines on nodes %s; trainer ranks on nodes %s%s",
                        [urlparse(url).hostname for url in self.engines.engine_urls],
                        self.trainer.rank_nodes() if self.trainer is not None else [],
                        " (colocated: engines in the trainer's bundles)" if self._colocated else "")

    @property
    def _opd_kl_coef(self) -> float | None:
        """--use-opd: the weight of the teacher's reverse KL in the advantage (None: no distillation)."""
        opd = self.cfg.distillation
        return opd.opd_kl_coef if opd.use_opd else None

    @property
    def _colocated(self) -> bool:
        return self.cfg.run.colocate and not self.cfg.run.debug_rollout_only

    def _engine_placement(self):
        """--colocate: the engines go into the trainer's bundles (engine_placement.colocated_placement);
        None otherwise (the engines get a placement group of their own)."""
        from lean_rl.backends.megatron.group import COLOCATED_RANK_SHARE
        from lean_rl.backends.sglang.engine_placement import colocated_placement

        if not self._colocated or self.trainer is None:
            return None
        engines, layout = self.cfg.engines, self.cfg.layout
        return colocated_placement(
            self.trainer.placement_group, layout.colocated_engine_nodes(engines.num_engines, engines.gpus_per_engine),
            device=layout.device, ranks_per_node=layout.ranks_per_node, rank_gpu_ids=self.trainer.rank_gpu_ids,
            rank_share=COLOCATED_RANK_SHARE, cpus_per_rank=self.trainer.cpus_per_rank,
            gpus_per_engine=engines.gpus_per_engine)

    def close(self) -> None:
        for closer in (
            lambda: self.weight_sync and self.weight_sync.close(),
            lambda: self.monitor and self.monitor.stop(),
            lambda: self.engines and self.engines.stop(),
            lambda: self.teacher_engines and self.teacher_engines.stop(),
            lambda: self.trainer and self.trainer.shutdown(),
            lambda: self.critic and self.critic.shutdown(),
            lambda: self.logger and self.logger.close(),
        ):
            try:
                closer()
            except Exception:  # noqa: BLE001 - close everything, report each failure
                logger.exception("error while shutting down")
        if self._ray_started:
            import ray

            ray.shutdown()
        for lock in self._locks:  # last: nothing of this run writes into its directories any more
            lock.release()

    # ------------------------------------------------------------ the steps of the algorithm
    async def rollout(self, step: int) -> RolloutOutput:
        """One rollout by the (possibly user-supplied) rollout function; finished groups land in the buffer.
        With --load-debug-rollout-data: the saved rollout's metrics (take_train_groups reads its groups)."""
        if self.cfg.run.load_debug_rollout_data:
            return RolloutOutput(metrics=rollout_metrics(load_debug_rollout(self.cfg.run.load_debug_rollout_data, step)))
        return await self._call_rollout_function(step, self.buffer, False)

    async def _call_rollout_function(self, step: int, buffer, evaluation: bool) -> RolloutOutput:
        """The (possibly user-supplied) rollout function, within --rollout-timeout. A synchronous one
        runs on a daemon thread: one that hangs past the deadline cannot keep the process from exiting."""
        # evaluation: --eval-function-path, default the rollout function
        fn = self.extensions.evaluation_rollout if evaluation else self.extensions.rollout
        timeout_s = self.cfg.rollout.timeout_s
        call = fn(self.cfg, step, buffer, evaluation) if inspect.iscoroutinefunction(fn) else \
            run_in_daemon_thread(fn, self.cfg, step, buffer, evaluation)
        try:
            out = await asyncio.wait_for(call, timeout_s)
        except asyncio.TimeoutError:
            what = "evaluation" if evaluation else "rollout"
            raise TimeoutError(f"{what} {step} ({rollout_function_path(self.cfg, evaluation)}) did not finish within "
                               f"--rollout-timeout {timeout_s:g} s; nothing of it was trained (raise "
                               "--rollout-timeout if rollouts are this long)") from None
        return rollout_output(self.cfg, fn, out, evaluation)  # a wrong return type names the flag and the function

    def take_train_groups(self, step: int) -> list[list[Sample]]:
        if self.cfg.run.load_debug_rollout_data:
            return load_debug_rollout(self.cfg.run.load_debug_rollout_data, step)
        return self.record_train_groups(
            step, self.buffer.get_train_groups(self.cfg.rollout.rollout_batch_size, policy_version=step))

    def record_train_groups(self, step: int, groups: list[list[Sample]]) -> list[list[Sample]]:
        """--save-debug-rollout-data and --dump-samples-interval, for the groups step `step` trains on."""
        return record_train_groups(self.cfg.run, step, groups)

    @property
    def train_options(self) -> TrainOptions:
        """What train_driver.train_rollout needs from this run: the critic, the algorithm's switches,
        the user's hooks (--rollout-sample-filter-path, --custom-reward-post-process-path:
        lean_rl/train_hooks.py), the step's context and --ci-test's check (lean_rl/ci_test.py)."""
        return TrainOptions(critic=self.critic, recompute_old=self.cfg.run.ci_test, opd_kl_coef=self._opd_kl_coef,
                            before_training=functools.partial(before_training, self.cfg, self.extensions),
                            changing=self._trainer_changing,
                            check=functools.partial(check_step, self.cfg) if self.cfg.run.ci_test else None)

    @contextlib.contextmanager
    def _trainer_changing(self, version: int):
        """No engine is given the trainer's weights halfway through a step; colocated, the engines have
        released their memory for training: /health fails by design then."""
        changing = self.weight_sync.trainer_changing(version) if self.weight_sync else contextlib.nullcontext()
        released = self.monitor.hold_health_checks() if self.monitor and self.cfg.run.colocate else contextlib.nullcontext()
        with changing, released:
            yield

    def sync_weights(self, version: int, probe: bool = True):
        """probe=False while the engines are paused (the probe generates): call probe_weights after resuming.
        An engine lost during the sync is waited for and synced again (engine_weights.py)."""
        report = self.weight_sync.sync(version, probe=probe)
        if probe:
            self.timers.add("sync_probe", report.probe_seconds)
        return report

    def probe_weights(self, version: int):
        started = time.perf_counter()
        result = self.weight_sync.probe(version)
        self.timers.add("sync_probe", time.perf_counter() - started)
        return result

    @contextlib.contextmanager
    def trainer_turn(self):
        """Colocated on GPU: train and sync inside this block, the devices the trainer's until the sync
        gives the engines back their KV cache (EngineWeights.trainer_turn: health checks held, engines
        released, trainer onloaded; the sync offloads it again). Elsewhere nothing changes hands."""
        if (not self.cfg.engines.releases_memory or self.weight_sync is None or self.trainer is None
                or self._trainer_turn):
            yield
            return
        self._trainer_turn = True
        try:
            with self.weight_sync.trainer_turn(self.onload_trainers):
                yield
        finally:
            self._trainer_turn = False

    def offload_trainers(self) -> None:
        """Colocated: free the trainers' device memory while the engines generate (no-op on CPU)."""
        for group in (self.trainer, self.critic):
            if group is not None:
                group.offload()

    def onload_trainers(self) -> None:
        for group in (self.trainer, self.critic):
            if group is not None:
                group.onload()

    @classmethod
    def run(cls, cfg: Config, loop) -> None:
        """What a training script's main does: start, run `loop(rt)` until done or a signal, close
        everything, print the summary; after a signal, exit with 128 + its number."""
        rt = cls(cfg).start()
        stopped = None
        try:
            if not rt.finished:
                stopped = asyncio.run(rt.run_until_stopped(loop))
        finally:
            try:
                rt.close()  # still under the signal watcher: a second signal exits at once
            finally:
                rt.stop.uninstall()
        print_run_summary(cfg.run.output_dir)
        write_run_curves(cfg.run.output_dir)  # OUTPUT_DIR/curves.png; a failure is only a warning
        if stopped is not None:
            sys.exit(128 + stopped.signum)

    async def run_until_stopped(self, loop) -> RunStopped | None:
        """`await loop(self)` with SIGTERM / SIGINT handled (lean_rl/stop.py): on a signal the loop
        stops at a step boundary and that step is saved (with --save). Returns the RunStopped, if any."""
        self.stop.install()  # until Runtime.run has closed everything (stop.uninstall)
        try:
            await loop(self)
        except RunStopped as stopped:
            logger.warning("%s", stopped)
            await self.save(stopped.step)
            return stopped
        finally:
            capture = sys.modules.get("lean_rl.rollout.openai_capture.server")
            if capture is not None:  # a capture endpoint served this loop's rollouts: close its port
                await capture.stop_capture_servers()
        return None

    async def maybe_save(self, step: int) -> None:
        """Every --save-interval rollouts and after the last."""
        ckpt = self.cfg.train.checkpoint
        if self.trainer is None or not ckpt.should_save(step, last=step == self.cfg.run.num_rollout):
            return
        await self.save(step)

    async def save(self, step: int) -> None:
        """A checkpoint at `step` (rollouts trained), once, when --save is set. The critic first: the
        actor's checkpoint (which holds the buffer state) is what a resume starts from, so its step must
        have a critic. In-flight groups are saved as pending: a resume generates them again.

        The buffer's state is taken here, on the event loop (the only writer of the buffer), and the
        checkpoint is written on a thread: meanwhile the loop keeps serving (fully async generation and
        the capture endpoint go on; a signal is noted and the run stops after this save)."""
        ckpt = self.cfg.train.checkpoint
        if self.trainer is None or not ckpt.save or self._saved_step == step or step <= self.start_step:
            return
        self._saved_step = step
        state = {"buffer": self.buffer.state_dict()} if self.buffer is not None else {}
        with self.timers("save"):
            await asyncio.to_thread(self._write_checkpoint, step, state)

    def _write_checkpoint(self, step: int, state: dict) -> None:
        ckpt = self.cfg.train.checkpoint
        # a save after a signal comes outside a trainer turn: colocated on GPU the trainer is offloaded
        # then, and takes the devices back for it (the run ends right after)
        try:
            with self.trainer_turn():
                if self.critic is not None:
                    self.critic.save_checkpoint(ckpt.critic_save_dir, step)
                self.trainer.save_checkpoint(ckpt.save, step, state)
        except Exception as err:
            save_dir = ckpt.save
            if save_dir is None or not save_filled_the_disk(err, save_dir):  # save() runs only with --save
                raise
            raise save_space_error(save_dir, step) from None  # one line; the last checkpoint stays

    async def maybe_evaluate(self, step: int) -> dict[str, float]:
        ev = self.cfg.eval
        if not ev.datasets or not ev.interval or step % ev.interval or self.engines is None:
            return {}
        with self.timers("eval"):
            out = await self._call_rollout_function(step, None, True)
        return out.metrics

    def log(self, step: int, metrics: dict[str, float]) -> None:
        metrics = dict(metrics)
        if self.buffer is not None:
            metrics.update({f"buffer/{k}": v for k, v in self.buffer.get_counters().items()})
        if self.monitor is not None:
            metrics["engines/restarts"] = self.monitor.total_restarts
            metrics["engines/router_restarts"] = self.monitor.router_restarts
        if self.weight_sync is not None:
            metrics["engines/rejoins"] = self.weight_sync.rejoins  # restarted, then given the current weights
            metrics["sync/recoveries"] = self.weight_sync.recoveries  # syncs done again after losing an engine
        self.logger.log(step, metrics)

