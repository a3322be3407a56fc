"""A run that heals a lost trainer: a rank killed, its node gone, or a collective hung past its deadline
(each ends a trainer call with MegatronGroupError, the group shut down) sends the run back to its last
checkpoint, the engines staying up:

    1. the trainer groups (actor, and PPO's critic) are shut down, and placed anew: on the nodes alive,
       waiting up to --trainer-restart-wait for capacity to return;
    2. they load the last complete checkpoint of --save up to the lost step (none yet: what the run
       started from);
    3. the buffer goes back to that checkpoint's state, exactly as a resume's: every sample generated
       since is dropped (its weight version no longer exists, or its prompt's place in the order is
       replayed), and its prompt is handed out again, so each prompt is trained exactly once;
    4. the weight sync is rebuilt on the new ranks and the engines get the restored weights, probed,
       before any new sample is generated from them.

Healing needs --save: a checkpoint on disk already exists for resumes, costs the run nothing it does not
pay already, and survives the node; an in-memory snapshot would have to live outside the ranks (the
driver or Ray's object store) and copy the weights and optimizer state every step (12+ bytes a
parameter). Without --save healing is off and start-up says so. Under --colocate the engines live in
the trainer's placement group: a failed colocated group keeps it, and the new ranks start into it.
Healing that cannot succeed (restarts exhausted, no capacity within the wait, the checkpoint unreadable)
ends the run with one line naming the cause; the rerun resumes as after any other exit.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from lean_rl.backends.megatron.rank_errors import MegatronGroupError, PlacementError

if TYPE_CHECKING:
    from lean_rl.buffer.data_buffer import DataBuffer
    from lean_rl.config import Config
    from lean_rl.trainer_groups import TrainerGroups
    from lean_rl.utils.metrics import MetricsLogger
    from lean_rl.weight_sync.engine_weights import EngineWeights

logger = logging.getLogger(__name__)


class TrainerHealFailed(RuntimeError):
    """Healing was off, exhausted or could not restart the trainer: the run ends (a rerun resumes)."""


class HealedRun(Protocol):
    """What a heal acts on (the Runtime is one): the trainer groups, the buffer, the metrics log and the
    weight sync, whose sync puts the restored weights on the engines and probes them."""
    trainers: TrainerGroups
    buffer: DataBuffer | None
    logger: MetricsLogger | None
    weight_sync: EngineWeights | None

    def sync_weights(self, version: int) -> Any: ...


@dataclass
class TrainerHealer:
    max_restarts: int  # 0: off (the first loss ends the run, as before healing existed)
    wait_s: float  # how long one heal waits for the trainer's nodes to be placeable
    off_because: str | None = None
    save_dir: str | None = None  # --save: the checkpoints a heal goes back to
    first_step: int = 0  # the step the run started (or resumed) at: a heal goes back no further
    start_buffer_state: dict | None = None  # where a heal with no checkpoint yet rewinds the buffer to
    restarts: int = 0
    samples_dropped: int = 0
    _report: dict[str, float] = field(default_factory=dict)  # logged with the next step's metrics

    @classmethod
    def of(cls, cfg: Config, first_step: int = 0, buffer: DataBuffer | None = None) -> TrainerHealer:
        """The run's healer, on or off (and why), from the step and buffer the run starts with."""
        placement = cfg.train.placement
        off = None
        if placement.max_trainer_restarts == 0:
            off = "--max-trainer-restarts 0"
        elif cfg.run.debug_rollout_only or cfg.run.load_debug_rollout_data:
            off = "a debug mode"
        elif cfg.train.checkpoint.save is None:
            off = "no --save: there is no checkpoint to go back to (an in-memory snapshot per step would copy " \
                  "weights and optimizer state every step; set --save, --save-interval N to heal redoing <= N steps)"
        healer = cls(0 if off else placement.max_trainer_restarts, placement.trainer_restart_wait_s, off,
                     cfg.train.checkpoint.save, first_step)
        if buffer is not None and healer.max_restarts:
            healer.start_buffer_state = buffer.state_dict()
        if off and placement.max_trainer_restarts:
            logger.warning("trainer healing off (%s): a lost trainer rank ends the run; a rerun resumes", off)
        elif not off:
            interval = cfg.train.checkpoint.save_interval
            logger.info("trainer healing on: up to %d restart(s) of the trainer from the last checkpoint of --save (%s)",
                        healer.max_restarts, f"every {interval} step(s): a heal redoes at most that many" if interval
                        else "no --save-interval: only the last step is saved, so a heal starts the run over")
        return healer

    def metrics(self) -> dict[str, float]:
        """fault/* for the step after a heal (then only the running totals)."""
        report, self._report = self._report, {}
        if not self.restarts:
            return {}
        return {"fault/trainer_restarts": float(self.restarts), "fault/samples_dropped": float(self.samples_dropped),
                **report}

    def heal(self, rt: HealedRun, lost: MegatronGroupError, step: int) -> int:
        """Back to the last checkpoint, trainer restarted; returns the step to continue from. Call with
        nothing generating (the loops settle their rollouts first): the buffer is rewound here."""
        try:
            return self._heal(rt, lost, step)
        except TrainerHealFailed as failed:
            logger.error("%s; the run stops: the same command resumes from the last checkpoint", failed)
            raise

    def _heal(self, rt: HealedRun, lost: MegatronGroupError, step: int) -> int:
        if self.restarts >= self.max_restarts:
            why = f"healing off ({self.off_because})" if self.off_because else \
                f"{self.restarts} trainer restart(s) used (--max-trainer-restarts {self.max_restarts})"
            raise TrainerHealFailed(f"trainer lost at step {step} and {why}: {lost}") from lost
        self.restarts += 1
        started = time.monotonic()
        logger.warning("trainer lost at step %d (%s); healing: restart %d of %d, from the last checkpoint",
                       step, lost, self.restarts, self.max_restarts)
        rt.trainers.shutdown_lost()
        resumed, state = self._restart(rt, step)
        dropped = self._rewind(rt, state, resumed)
        self.samples_dropped += dropped
        report = rt.sync_weights(resumed)  # the engines serve the restored weights, proven by the probe
        heal_s = time.monotonic() - started
        self._report = {"fault/heal_seconds": heal_s, "fault/steps_redone": float(step - resumed)}
        logger.warning("trainer healed in %.1f s: back at step %d (%d step(s) to redo), %d sample(s) generated "
                       "since dropped and their prompts handed out again; engines serve version %d "
                       "(probe max |Δ log p| %.2e)", heal_s, resumed, step - resumed, dropped, resumed,
                       report.probe.max_abs_diff)
        return resumed

    def _restart(self, rt: HealedRun, step: int) -> tuple[int, dict | None]:
        """Start the groups from the checkpoint, retrying placement until the wait is over: the last
        complete checkpoint of --save at or before `step` (one saved by that step itself, whose sync or log
        the loss cut short, is redone: its metrics row and sample dump are written once), else what the run
        started from; the weight sync rebuilt on the new ranks. Returns (step, extra state)."""
        from lean_rl.backends.megatron.checkpoint_paths import has_step, list_steps

        if self.save_dir is None:
            raise RuntimeError("TrainerHealer: healing needs --save (TrainerHealer.of turns it off without)")
        saved = [s for s in list_steps(self.save_dir) if self.first_step <= s <= step and has_step(self.save_dir, s)]
        replace = rt.weight_sync.replace_trainer if rt.weight_sync is not None else None
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                return rt.trainers.restart(self.save_dir if saved else None, max(saved) if saved else 0,
                                           start_timeout_s=max(deadline - time.monotonic(), 30.0), started=replace)
            except MegatronGroupError as error:  # no room yet, or a node still going away under the new ranks
                if not _capacity(error) or time.monotonic() >= deadline:
                    what = "no capacity for the trainer within --trainer-restart-wait " \
                        f"{self.wait_s:.0f}s" if _capacity(error) else "the restarted trainer failed"
                    raise TrainerHealFailed(f"trainer heal: {what} ({error})") from error
                logger.warning("trainer heal: cannot place the trainer yet (%s); retrying for %.0f s more", error,
                               deadline - time.monotonic())
                time.sleep(min(5.0, max(deadline - time.monotonic(), 0.1)))
            except Exception as error:  # noqa: BLE001 - the checkpoint unreadable, a bad state
                raise TrainerHealFailed(f"trainer heal: the restarted trainer failed ({type(error).__name__}: "
                                        f"{error})") from error

    def _rewind(self, rt: HealedRun, state: dict | None, resumed: int) -> int:
        """The buffer as at the checkpoint the trainer restarted from (as a resume loads it), the metrics
        of later steps forgotten; returns the samples finished since (dropped: their prompts come again)."""
        if rt.logger is not None:
            rt.logger.rewind(resumed)
        if rt.buffer is None:
            return 0
        saved = state["buffer"] if state and "buffer" in state else self.start_buffer_state
        if saved is None:
            raise RuntimeError("TrainerHealer: no buffer state to go back to (healing kept none at start-up)")
        finished = rt.buffer.get_counters().get("samples_finished", 0)
        rt.buffer.load_state_dict(saved)
        return finished - saved["counters"].get("samples_finished", 0)


def _capacity(error: MegatronGroupError) -> bool:
    """A failure that waiting may cure: the nodes cannot be reserved, or a rank (its node) went away
    while starting; not one a rank raised itself (an unreadable checkpoint)."""
    text = str(error)
    return isinstance(error, PlacementError) or " died (" in text or " is lost (" in text
