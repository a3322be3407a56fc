"""What the two streaming transports (distributed, tensor) share: the stage leads send bucket after
bucket straight to every engine, inside one /begin_weight_update ... /end_weight_update session per
engine (SGLang 0.5.23 rejects tensor/distributed updates outside one) that the leads open and close
themselves (engine_session.py), so a sync is one Ray call per stage from the driver. The
final stage's last bucket carries weight_version and flushes the prefix cache, so an engine never
reports the new version with half the new weights."""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from typing import TYPE_CHECKING

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.weight_sync.buckets import Bucket, iter_buckets
from lean_rl.weight_sync.engine_calls import call_all
from lean_rl.weight_sync.engine_session import EngineSession
from lean_rl.weight_sync.errors import WeightSyncError
from lean_rl.weight_sync.transports.base import Transport

if TYPE_CHECKING:
    from lean_rl.weight_sync.stages import StageSent, TimedExport
    from lean_rl.weight_sync.transports.base import RankSide, SyncDriver


class StreamedTransport(Transport):
    def __init__(self):
        self.clients: list = []  # rank half, on a stage lead: one client per engine
        self.session: EngineSession | None = None  # rank half, on a stage lead

    # ------------------------------------------------------------------ driver half
    def deliver(self, sync: SyncDriver, version: str) -> list[StageSent]:
        try:
            return sync.send_stages(lambda stage: (version, stage == sync.num_stages - 1))
        except WeightSyncError:
            raise  # reported by a stage lead, which ended the sessions it held (engine_session.py)
        except BaseException:
            # the Ray call itself failed (a rank died mid-stage): end what its lead may have left open,
            # or the next sync cannot begin; an engine without a session refuses, which is fine here
            try:
                call_all(sync.clients, sync.cfg.timeout_s, EngineClient.end_weight_update)
            except WeightSyncError:
                pass
            raise

    # ------------------------------------------------------------------ rank half
    def setup_rank(self, rank: RankSide) -> None:
        from lean_rl.backends.sglang.blocking_client import BlockingEngineClient

        plan = rank.plan
        if rank.leads_own_stage:
            self.clients = [BlockingEngineClient(url, timeout_s=plan.timeout_s, api_key=plan.api_key)
                            for url in plan.engine_urls]
            self.session = EngineSession(self.clients, plan.timeout_s)

    def send_stage(self, rank: RankSide, export: TimedExport, version: str, final_stage: bool) -> StageSent:
        """The stage inside the engines' session: the first stage's lead opens it (begin in flight
        while the export starts), the final stage's lead, or any lead whose stage failed, ends it."""
        assert self.session is not None, "send_stage on a rank that does not lead its stage"
        if export.stage == 0:
            self.session.begin()
        else:
            self.session.adopt()
        try:
            sent = self.stream_stage(rank, export, version, final_stage)
        except BaseException:
            self.session.end()
            raise
        if final_stage or sent.error is not None:
            problem = self.session.end()
            if problem is not None and sent.error is None:
                sent = dataclasses.replace(sent, error=problem)
        return sent

    def session_error(self) -> str | None:
        """Before a stage's first engine call: None once every engine's session is open, else why not."""
        assert self.session is not None
        try:
            self.session.wait_open()
        except WeightSyncError as exc:
            return str(exc)
        return None

    def stream_stage(self, rank: RankSide, export: TimedExport, version: str, final_stage: bool) -> StageSent:
        """Stream the stage bucket by bucket; the last bucket of the final stage sets the version."""
        total = buckets = count = 0
        error = None
        for bucket, is_last in iter_buckets(export, rank.plan.buffer_size_bytes):
            final = final_stage and is_last
            if buckets == 0:  # the first bucket is exported: the session's begin had that long
                error = self.session_error()
            if error is None:  # after a failure: keep exporting (the peers' all-gathers), send nothing
                try:
                    self.send_bucket(rank, bucket, export.stage, version if final else None, final)
                except Exception as exc:  # noqa: BLE001 - an engine's fault must not end the trainer group
                    error = f"{type(exc).__name__}: {exc}"
                    self.after_failed_send()
            total, buckets, count = total + bucket.nbytes, buckets + 1, count + len(bucket.names)
        return export.sent(total, buckets, count, error=error)

    @abstractmethod
    def send_bucket(self, rank: RankSide, bucket: Bucket, stage: int, version: str | None, final: bool) -> None:
        """One bucket to every engine; returns once every engine has loaded it. `version`: set on
        the last bucket of the sync (None before), `final`: flush the prefix cache."""

    def after_failed_send(self) -> None:
        """An engine call failed mid-stage: what this transport must give up so that closing it
        waits on nothing pending."""

    def close_rank(self, rank: RankSide) -> None:
        self.session = None
        for client in self.clients:
            client.close()
        self.clients = []
