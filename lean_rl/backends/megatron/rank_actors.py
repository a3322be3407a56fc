"""The trainer's ranks as Ray actors: RankActors owns them, what is known of where they run, and their
placement group, and calls them in lockstep; group.MegatronGroup uses it for what the ranks do.

Placement: one placement-group bundle per trainer node (TrainerLayout.num_nodes; STRICT_SPREAD over
distinct Ray nodes when there are several, PACK for one), each holding that node's ranks; ranks are
numbered node by node (node k runs ranks k * ranks_per_node, ...). Each rank records its node's
address, pid and GPU ids (`nodes`, `pids`, `gpu_ids`).

Lifetime: actors are ordinary (non-detached) Ray actors owned by this driver, so Ray kills them when
the driver exits; any failed or timed-out call kills all of them before the error propagates (the
other ranks would otherwise sit in a collective until the gloo/NCCL timeout), and shutdown() waits
for the actor processes to be gone: with psutil for ranks on the driver's node, through Ray's actor
table (state DEAD) for ranks on other nodes. Every wait has a deadline.

Node loss: when a rank dies, or a collective loses its peer, the error names the group's nodes that
Ray reports dead and their ranks, waiting for Ray's verdict at most node_loss_wait_s (Ray declares a
node dead only after some missed health checks); ranks on a dead node are not waited for at shutdown."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import psutil

from lean_rl.backends.megatron.rank_errors import MegatronGroupError
from lean_rl.backends.megatron.rank_failures import failure_message, lost_node_note, lost_nodes
from lean_rl.backends.megatron.rank_reservation import node_bundle, reserve_nodes, wait_actors_dead
from lean_rl.backends.megatron.trainer_layout import TrainerLayout
from lean_rl.utils.coverage_data import measured

logger = logging.getLogger(__name__)

# how often a waiting call checks that the ranks on this node are still alive
_LIVENESS_S = 5.0


class RankActors:
    """One Ray actor per trainer rank, started by start() and gone after shutdown() (module docstring)."""

    def __init__(self, node_loss_wait_s: float = 45.0, keep_placement_on_failure: bool = False):
        """`keep_placement_on_failure` (--colocate: the engines live in these bundles): a failed call kills
        the ranks but leaves the placement group, for a trainer heal to start new ranks into
        (`adopt_placement`); shutdown() removes it."""
        self.node_loss_wait_s = node_loss_wait_s
        self.keep_placement_on_failure = keep_placement_on_failure
        self.actors: list[Any] = []
        self.actor_ids: list[str] = []  # per rank: its Ray actor id (hex), as in Ray's actor table
        self.pids: list[int] = []
        self.nodes: list[str] = []  # per rank: its node's address, as Ray knows it
        self.gpu_ids: list[list] = []  # per rank: the GPU ids Ray gave it (on its node)
        self.placement_group = None  # bundle k holds the ranks of trainer node k
        self._owns_placement = True  # False: another group's placement group (colocate_with)
        self.actor_class: type | None = None

    def start(self, actor_class: type, rank_args: Callable[[int], tuple], layout: TrainerLayout, *,
              num_cpus: float, num_gpus: float, env: dict[str, str], cpus_per_rank: float,
              timeout_s: float, placement_group=None, rank_env: Callable[[int], dict] | None = None,
              adopt_placement: bool = False) -> None:
        """Reserve the nodes (`cpus_per_rank` each in their bundle), start actor_class(*rank_args(rank))
        in its node's bundle for each rank, and record where each landed. `placement_group`: another
        group's, to start in (not reserved, not removed at shutdown); `rank_env`: per rank, more
        environment; `adopt_placement`: `placement_group` is this group's own from now on (a heal's, kept from
        the failed group: shutdown() removes it). On an error the caller shuts down what was started."""
        import ray

        self._owns_placement = placement_group is None or adopt_placement
        self.actor_class = actor_class
        self.placement_group = reserve_nodes(layout, cpus_per_rank, timeout_s) if placement_group is None \
            else placement_group
        for rank in range(layout.world_size):
            actor_cls = ray.remote(actor_class).options(
                num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, max_concurrency=1,
                runtime_env={"env_vars": {**env, **(rank_env(rank) if rank_env else {})}},
                scheduling_strategy=node_bundle(self.placement_group, rank // layout.ranks_per_node))
            self.actors.append(actor_cls.remote(*rank_args(rank)))
            self.actor_ids.append(self.actors[-1]._actor_id.hex())
        locations = self.call_all(actor_class.location, timeout_s=timeout_s)
        self.nodes = [where["node_ip"] for where in locations]
        self.pids = [where["pid"] for where in locations]
        self.gpu_ids = [list(where.get("gpu_ids", ())) for where in locations]

    # -- lockstep calls -------------------------------------------------------------------------

    def call_all(self, fn: Callable, *args, timeout_s: float) -> list:
        return self.call_each(fn, [args] * len(self.actors), timeout_s)

    @staticmethod
    def share(value):
        import ray

        return ray.put(value)

    def call_each(self, fn: Callable, per_rank_args: Sequence[tuple], timeout_s: float) -> list:
        """`fn` (a method of the rank class or of an object it hosts, by reference) on every rank."""
        if not self.actors:
            raise MegatronGroupError(f"{fn.__qualname__}: the group is shut down")
        refs = [actor.call.remote(fn, *args) for actor, args in zip(self.actors, per_rank_args)]
        return self._wait(refs, timeout_s, fn.__qualname__)

    def call_first(self, fn: Callable, *args, timeout_s: float) -> Any:
        """`fn` on rank 0 only; a failure shuts down every rank, as in call_each."""
        return self._wait([self.actors[0].call.remote(fn, *args)], timeout_s, fn.__qualname__)[0]

    def _wait(self, refs: list, timeout_s: float, what: str) -> list:
        """Results in rank order; the first failure (not the last) ends the wait and the group. When
        a rank's node is gone (Ray reports it dead), the error says so: node, ranks lost."""
        import ray

        deadline = time.monotonic() + timeout_s
        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        while pending:
            left = deadline - time.monotonic()
            ready = ray.wait(list(pending), num_returns=1, timeout=min(max(left, 0), _LIVENESS_S))[0] \
                if left > 0 else []
            if not ready and left > _LIVENESS_S:
                gone = self._gone_local_ranks()
                if gone:  # Ray may not notice: a child the rank forked (a checkpoint writer) keeps its socket open
                    self._shutdown_after_failure()
                    raise MegatronGroupError(f"{what}: " + "; ".join(
                        f"rank {rank} (MegatronRank) on node {self.nodes[rank]} died (pid {self.pids[rank]} is gone)"
                        for rank in gone) + "; group shut down")
                continue
            if not ready:
                ranks = sorted(pending.values())
                lost = lost_node_note(lost_nodes(self.nodes, self.actor_ids, 0.0))
                self._shutdown_after_failure()
                raise MegatronGroupError(f"{what}: {lost}ranks {ranks} did not finish within {timeout_s:.0f}s; "
                                         "group shut down")
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref, timeout=max(deadline - time.monotonic(), 1.0))
                except Exception as error:
                    cause = getattr(error, "cause", None) or error  # RayTaskError wraps the rank's exception
                    message = failure_message(what, rank, error, cause, self.nodes, self.actor_ids,
                                              self.node_loss_wait_s)
                    self._shutdown_after_failure()
                    raise MegatronGroupError(message) from error
        return results

    # -- the ranks on this node (failures and node loss: rank_failures.py) ---------------------------

    def _local_ranks(self) -> list[tuple[int, int]]:
        """(rank, pid) of the ranks on the driver's node: those psutil can see and signal."""
        import ray

        here = ray.util.get_node_ip_address()
        return [(rank, pid) for rank, (pid, node) in enumerate(zip(self.pids, self.nodes)) if node == here]

    def _gone_local_ranks(self) -> list[int]:
        """Ranks on the driver's node whose process has exited (a zombie counts as exited)."""
        gone = []
        for rank, pid in self._local_ranks():
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    gone.append(rank)
            except psutil.NoSuchProcess:
                gone.append(rank)
        return gone

    # -- shutdown -------------------------------------------------------------------------------

    def shutdown(self, wait_s: float = 30.0, keep_placement: bool = False) -> None:
        """Kill every actor and wait (bounded) until their processes are gone: psutil for the ranks
        on the driver's node, Ray's actor table (DEAD) for the others. Then release the placement
        group, unless `keep_placement` (it stays `placement_group`, for a heal). Idempotent."""
        import ray

        actors, self.actors = self.actors, []
        placement = self.placement_group
        if keep_placement:
            placement = None  # not removed below
        else:
            self.placement_group = None
        save_coverage = getattr(self.actor_class, "save_coverage", None)
        if actors and measured() and save_coverage is not None:
            try:  # ray.kill is a SIGKILL: the ranks' coverage data would be lost (scripts/cpu_coverage.py)
                ray.get([actor.call.remote(save_coverage) for actor in actors], timeout=30)
            except Exception:  # noqa: BLE001 - a dead rank has nothing to save
                pass
        for actor in actors:
            ray.kill(actor, no_restart=True)
        # the process groups only after Ray's kill ended the ranks: a rank SIGKILLed first is a crash to Ray,
        # which then prints "A worker died or was killed ... SYSTEM_ERROR" on the driver after a good run
        self._wait_local_ranks_exited(wait_s, len(actors))
        self._kill_local_process_groups(len(actors))
        try:
            self._wait_ranks_gone(len(actors), wait_s)
        finally:
            if placement is not None and self._owns_placement:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(placement)

    def _wait_local_ranks_exited(self, wait_s: float, num_actors: int) -> None:
        """Until each rank on this node has exited (a zombie counts) or is stopped (SIGSTOP: it cannot act on
        Ray's kill, its group's SIGKILL ends it), at most `wait_s`."""
        deadline = time.monotonic() + wait_s
        while num_actors and time.monotonic() < deadline:
            running = []
            for _, pid in self._local_ranks():
                try:
                    if psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_STOPPED):
                        running.append(pid)
                except psutil.NoSuchProcess:
                    pass
            if not running:
                return
            time.sleep(0.05)

    def _kill_local_process_groups(self, num_actors: int) -> None:
        """What a rank on this node forked (Megatron's checkpoint writers) goes with it: a Ray worker leads
        its own process group, whose members outlive a killed leader (orphans holding Ray's socket)."""
        import os
        import signal

        if not num_actors:
            return
        for _, pid in self._local_ranks():
            try:
                if psutil.pid_exists(pid) and os.getpgid(pid) != pid:
                    continue  # not a group leader: nothing of ours to find by its group
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _wait_ranks_gone(self, num_actors: int, wait_s: float) -> None:
        import ray

        if not num_actors:
            return
        here = ray.util.get_node_ip_address()
        # a rank whose location is unknown (it failed to start) is waited for through Ray; one on a
        # node Ray reports dead is gone with its node (no raylet left to confirm it)
        lost = lost_nodes(self.nodes, self.actor_ids, 0.0)
        remote = [(rank, actor_id) for rank, actor_id in enumerate(self.actor_ids[:num_actors])
                  if (rank >= len(self.nodes) or self.nodes[rank] != here)
                  and not (rank < len(self.nodes) and self.nodes[rank] in lost)]
        deadline = time.monotonic() + wait_s
        processes = []
        for _, pid in self._local_ranks():
            try:
                processes.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(processes, timeout=wait_s)
        if alive:
            raise MegatronGroupError(f"actor processes {[p.pid for p in alive]} still alive {wait_s}s after ray.kill")
        left = wait_actors_dead([actor_id for _, actor_id in remote], max(deadline - time.monotonic(), 1.0))
        if left:
            where = [f"rank {rank} on {self.nodes[rank] if rank < len(self.nodes) else '?'}"
                     + (f" (pid {self.pids[rank]})" if rank < len(self.pids) else "")
                     for rank, actor_id in remote if actor_id in left]
            raise MegatronGroupError(f"actors {', '.join(where)} not reported dead by Ray {wait_s}s after ray.kill")

    def _shutdown_after_failure(self) -> None:
        """Shut down, bounded; a shutdown that cannot confirm every actor gone is logged, so that the
        error that ended the group (not this one) is what the caller sees."""
        try:
            self.shutdown(keep_placement=self.keep_placement_on_failure)
        except Exception as error:  # noqa: BLE001
            logger.warning("trainer group shutdown after a failure: %s", error)


