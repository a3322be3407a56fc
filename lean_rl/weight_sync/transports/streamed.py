"""What the two streaming transports (distributed, tensor) share: the stage leads send bucket after
bucket straight to every engine, inside one /begin_weight_update ... /end_weight_update session per
engine that the driver opens (SGLang 0.5.23 rejects tensor/distributed updates outside one). The
final stage's last bucket carries weight_version and flushes the prefix cache, so an engine never
reports the new version with half the new weights."""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.weight_sync.buckets import Bucket, iter_buckets
from lean_rl.weight_sync.engine_calls import call_all, submit_all
from lean_rl.weight_sync.errors import WeightSyncError
from lean_rl.weight_sync.transports.base import Transport

if TYPE_CHECKING:
    from lean_rl.weight_sync.stages import StageSent, TimedExport
    from lean_rl.weight_sync.transports.base import RankSide, SyncDriver


class StreamedTransport(Transport):
    def __init__(self):
        self.clients: list = []  # rank half, on a stage lead: one client per engine

    # ------------------------------------------------------------------ driver half
    def deliver(self, sync: SyncDriver, version: str) -> list[StageSent]:
        timeout = sync.cfg.timeout_s
        opened, errors = [], []
        for client, (_, future) in zip(sync.clients, submit_all(sync.clients, EngineClient.begin_weight_update)):
            try:
                future.result(timeout=timeout)
                opened.append(client)
            except Exception as exc:
                errors.append(WeightSyncError(f"begin_weight_update: {exc}"))
        try:
            if errors:
                raise errors[0]
            sent = sync.send_stages(lambda stage: (version, stage == sync.num_stages - 1))
        except BaseException:
            # close the sessions that opened, or the next sync cannot begin; the first error wins
            try:
                call_all(opened, timeout, EngineClient.end_weight_update)
            except WeightSyncError:
                pass
            raise
        call_all(opened, timeout, EngineClient.end_weight_update)
        return sent

    # ------------------------------------------------------------------ rank half
    def setup_rank(self, rank: RankSide) -> None:
        from lean_rl.backends.sglang.blocking_client import BlockingEngineClient

        plan = rank.plan
        if rank.leads_own_stage:
            self.clients = [BlockingEngineClient(url, timeout_s=plan.timeout_s, api_key=plan.api_key)
                            for url in plan.engine_urls]

    def send_stage(self, rank: RankSide, export: TimedExport, version: str, final_stage: bool) -> StageSent:
        """Stream the stage bucket by bucket; the last bucket of the final stage sets the version."""
        total = buckets = count = 0
        error = None
        for bucket, is_last in iter_buckets(export, rank.plan.buffer_size_bytes):
            final = final_stage and is_last
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
        for client in self.clients:
            client.close()
        self.clients = []
