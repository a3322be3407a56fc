"""Which engines the tensor transport (CUDA IPC) can serve: pure functions of the layout.

A stage lead exports its bucket as CUDA IPC handles of memory on its own GPU; every TP rank of an
engine opens them. SGLang maps the handle's device UUID back to a device index among the GPUs its
process sees (sglang/srt/utils/patch_torch.py:89-98) and raises `Invalid device_uuid` when the GPU is
not one of them: the scheduler dies. A colocated engine sees only the GPUs of the trainer ranks it
shares devices with (CUDA_VISIBLE_DEVICES = their Ray GPU ids), so an engine is served by IPC only
when every stage lead is among those ranks (review C1). Megatron numbers ranks TP fastest, then DP,
then PP (parallel_state's default order tp-cp-ep-dp-pp): the lead (TP 0, DP 0) of stage p is rank
p * TP * DP. Trainer node k holds ranks k * ranks_per_node ... (rank_actors.py), and colocated
engine i takes the ranks slot * gpus_per_engine ... of its node (engine_placement.colocated_placement).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IpcLayout:
    tensor_parallel: int
    data_parallel: int
    pipeline_parallel: int
    ranks_per_node: int
    num_engines: int
    gpus_per_engine: int
    engine_nodes: tuple[int, ...]  # per engine, the trainer node it is colocated on (colocated_engine_nodes)


def stage_lead_ranks(tensor_parallel: int, data_parallel: int, pipeline_parallel: int) -> list[int]:
    """The global rank of each pipeline stage's lead (TP rank 0, DP rank 0), stage by stage."""
    return [stage * tensor_parallel * data_parallel for stage in range(pipeline_parallel)]


def engine_ranks(layout: IpcLayout) -> list[list[int]]:
    """Per colocated engine, the trainer ranks whose GPUs its server sees (in its TP rank order)."""
    out = []
    for engine, node in enumerate(layout.engine_nodes):
        slot = layout.engine_nodes[:engine].count(node)
        first = node * layout.ranks_per_node + slot * layout.gpus_per_engine
        out.append(list(range(first, first + layout.gpus_per_engine)))
    return out


def unserved_by_ipc(layout: IpcLayout) -> list[tuple[int, int]]:
    """(engine, stage) pairs whose stage lead's GPU the engine cannot see: IPC cannot reach them."""
    if len(layout.engine_nodes) != layout.num_engines:
        raise ValueError(f"{len(layout.engine_nodes)} engine nodes for {layout.num_engines} engines")
    leads = stage_lead_ranks(layout.tensor_parallel, layout.data_parallel, layout.pipeline_parallel)
    return [(engine, stage) for engine, ranks in enumerate(engine_ranks(layout))
            for stage, lead in enumerate(leads) if lead not in ranks]


def describe_unserved(unserved: list[tuple[int, int]], layout: IpcLayout) -> str:
    """One phrase for an error: which engine cannot open which stage lead's memory."""
    leads = stage_lead_ranks(layout.tensor_parallel, layout.data_parallel, layout.pipeline_parallel)
    ranks = engine_ranks(layout)
    engine, stage = unserved[0]
    more = f" ({len(unserved) - 1} more such pairs)" if len(unserved) > 1 else ""
    return (f"engine {engine} sees the GPUs of trainer ranks {ranks[engine]} but pipeline stage {stage} is sent "
            f"from rank {leads[stage]}{more}")


def ipc_refusal(layout: IpcLayout) -> str | None:
    """Why CUDA IPC cannot serve every engine of `layout`, or None. Besides the unserved pairs: an
    engine of TP > 1. The tensor transport sends one flat bucket on the lead's GPU and every TP rank of
    the engine gets the same handle, so each rank opens a CUDA context on the lead's GPU and copies
    across devices (sglang/srt/model_executor/model_runner_components/weight_updater.py never moves the
    flattened bucket to the rank's own device; review P3): `auto` takes disk there instead."""
    if layout.gpus_per_engine > 1:
        return (f"engines of TP {layout.gpus_per_engine} would all open the one bucket on the stage lead's GPU "
                "(one CUDA context per TP rank there, cross-device copies)")
    unserved = unserved_by_ipc(layout)
    return describe_unserved(unserved, layout) if unserved else None
