"""--weight-sync-transport disk: the stage leads write their tensors as safetensors shards into one
directory, the driver publishes it as a complete HF checkpoint (weight_sync/disk.py DiskStaging) and
every engine loads it with /update_weights_from_disk. The directory must be reachable by the stage
leads and every engine (on a cluster: --weight-sync-disk-dir, which the config requires)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.weight_sync.buckets import iter_buckets
from lean_rl.weight_sync.disk import DiskStaging
from lean_rl.weight_sync.engine_calls import call_all
from lean_rl.weight_sync.transports.base import Transport

if TYPE_CHECKING:
    from lean_rl.weight_sync.stages import StageSent, TimedExport
    from lean_rl.weight_sync.transports.base import RankSide, SyncDriver


class DiskTransport(Transport):
    name = "disk"

    def __init__(self):
        self.staging: DiskStaging | None = None  # driver half: the directories of this WeightSync

    # ------------------------------------------------------------------ driver half
    def connect(self, sync: SyncDriver) -> None:
        self.staging = DiskStaging(sync.cfg.disk_dir, sync.engines[0].model_path)

    def deliver(self, sync: SyncDriver, version: str) -> list[StageSent]:
        directory = self.staging.start(version)
        sent = sync.send_stages(lambda stage: (str(directory),))
        weight_map: dict[str, str] = {}
        for part in sent:
            weight_map.update(part.weight_map)
        published = self.staging.publish(directory, version, weight_map, sum(s.bytes for s in sent))
        call_all(sync.clients, sync.cfg.timeout_s, EngineClient.update_weights_from_disk, str(published),
                 weight_version=version, flush_cache=True, timeout_s=sync.cfg.timeout_s)
        self.staging.loaded(published)
        return sent

    def close(self, sync: SyncDriver) -> list[str]:
        if self.staging is not None:
            self.staging.close()
            self.staging = None
        return []

    # ------------------------------------------------------------------ rank half
    def send_stage(self, rank: RankSide, export: TimedExport, directory: str) -> StageSent:
        """This stage's tensors as safetensors files in `directory` (one file per bucket)."""
        from safetensors.torch import save_file

        weight_map, total, count = {}, 0, 0
        for count, (bucket, _) in enumerate(iter_buckets(export, rank.plan.buffer_size_bytes), start=1):
            file_name = f"model-pp{export.stage:03d}-{count:05d}.safetensors"
            # safetensors writes each tensor's own bytes (views of a larger storage too, so long as they
            # do not overlap): no copy here beyond the GPU's to host
            save_file({n: t.cpu().contiguous() for n, t in zip(bucket.names, bucket.tensors)},
                      str(Path(directory) / file_name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(bucket.names, file_name))
            total += bucket.nbytes
        return export.sent(total, count, len(weight_map), weight_map=weight_map)
