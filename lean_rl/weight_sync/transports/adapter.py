"""--lora-sync adapter: the engines serve their frozen base with the trainer's LoRA adapter loaded
apart (SGLang's own LoRA support, backends/sglang/lora.py), and a sync moves only the adapter.

Each stage lead exports its stage's lora_A / lora_B under PEFT's names (RankSync._stage_tensors
reads named_hf_adapter_tensors for a transport that sends_adapter) and hands them back in its
StageSent; the driver joins the stages' parts (SGLang loads an adapter whole) and replaces the
adapter on every engine with one inline payload (EngineClient.replace_lora_adapter: unload, load
from tensors, set the weight version). The payload is the same on every device: an adapter is a few
MB, so it travels inline rather than by CUDA IPC or a process group."""

from __future__ import annotations

import base64
import pickle
from typing import TYPE_CHECKING

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.weight_sync.buckets import standalone
from lean_rl.weight_sync.engine_calls import wait_all
from lean_rl.weight_sync.errors import WeightSyncError
from lean_rl.weight_sync.transports.base import Transport

if TYPE_CHECKING:
    from lean_rl.weight_sync.stages import StageSent, TimedExport
    from lean_rl.weight_sync.transports.base import RankSide, SyncDriver


def adapter_payload(tensors: dict) -> str:
    """base64(pickle({PEFT name: CPU tensor})): what SGLang's MultiprocessingSerializer.deserialize
    reads for one TP rank of /load_lora_adapter_from_tensors (its SafeUnpickler loads the tensors)."""
    return base64.b64encode(pickle.dumps(tensors, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")


class AdapterTransport(Transport):
    name = "adapter"
    sends_adapter = True

    # ------------------------------------------------------------------ driver half
    def deliver(self, sync: SyncDriver, version: str) -> list[StageSent]:
        adapter, plan = sync.cfg.adapter, sync.plan
        if adapter is None or plan is None:
            raise WeightSyncError("--lora-sync adapter: the weight sync has no adapter to serve (WeightSyncConfig.adapter) "
                                  "or is not connected")
        sent = sync.send_stages(lambda stage: ())
        tensors: dict = {}
        for part in sent:
            tensors.update(part.adapter or {})
        if not tensors:
            raise WeightSyncError("--lora-sync adapter: the trainer exported no LoRA tensors (is --lora-rank set?)")
        payload, timeout = adapter_payload(tensors), sync.cfg.timeout_s
        calls = [(client.base_url, client.submit(EngineClient.replace_lora_adapter, adapter.name, adapter.peft_config(),
                                                 [payload] * tp_size, weight_version=version, timeout_s=timeout))
                 for client, tp_size in zip(sync.clients, plan.engine_tp_sizes)]
        wait_all(calls, timeout, f"replace_lora_adapter ({len(tensors)} tensors)")
        return sent

    # ------------------------------------------------------------------ rank half
    def send_stage(self, rank: RankSide, export: TimedExport, *args) -> StageSent:
        tensors = {name: standalone(tensor.cpu()) for name, tensor in export}
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        return export.sent(nbytes, 1, len(tensors), adapter=tensors)
