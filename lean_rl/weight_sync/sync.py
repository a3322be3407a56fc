"""Ship the trainer's weights to the SGLang engines, and prove they arrived.

    sync = WeightSync.create(cfg, actor_group, engine_urls, api_key=key)   # connect: engine facts, groups, probe
    report = sync.update(step)       # every engine serves the trainer's weights as version str(step)
    sync.close()

One interface, one class per transport (transports/: base.py says what a transport is; config.py
how `auto` chooses one): distributed.py (a process group per pipeline stage with the engines),
tensor.py (/update_weights_from_tensor: CUDA IPC on GPU, an inline payload on CPU), disk.py
(safetensors + /update_weights_from_disk), adapter.py (--lora-sync adapter: only the LoRA
adapters). WeightSync does what every transport needs (engine facts,
the ranks' setup, the engines' memory, the probe) and hands the rest to its transport's driver half:
check, connect, deliver, close. After a delivery the probe (probe.py) checks every engine; a failure
raises. Generation is not paused here: callers pause the engines (or sync between rollouts).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Callable

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.key_placement import node_ids_at, place_key_file
from lean_rl.weight_sync.config import WeightSyncConfig, probe_statistic
from lean_rl.weight_sync.engine_calls import call_all
from lean_rl.weight_sync.errors import WeightSyncError
from lean_rl.weight_sync.image_probe import ImageProbe, build_image_probe
from lean_rl.weight_sync.memory import ALL, KV_CACHE_AND_GRAPHS, WEIGHTS, EngineMemory
from lean_rl.weight_sync.probe import ProbeResult, probe_token_ids, raise_on_failure, run_probe, submit_probe
from lean_rl.weight_sync.rank import RankWeightSync
from lean_rl.weight_sync.stages import EngineInfo, RankSyncPlan, StageSent
from lean_rl.weight_sync.transports import transport_for


@dataclass(frozen=True)
class SyncReport:
    version: str
    transport: str
    seconds: float  # start of the sync until every engine holds the new weights (probe excluded)
    bytes: int  # HF tensor bytes sent to each engine
    buckets: int
    tensors: int
    export_seconds: float  # of `seconds`: gathering HF tensors on the stage leads (summed over stages)
    probe: ProbeResult | None  # None: update(probe=False); the caller probes after resuming generation
    probe_seconds: float


class WeightSync:
    def __init__(self, cfg: WeightSyncConfig, actor_group, engine_urls, *, tokenizer_path: str | None = None,
                 api_key: str | None = None, released: dict[str, set[str]] | None = None,
                 after_send: Callable[[], object] | None = None, client_factory: Callable | None = None):
        """`api_key`: the run's (EngineConfig.api_key), which the engines require. `released`: what
        each engine has released (memory.EngineMemory; kept by the caller across WeightSyncs).
        `after_send`: called once the engines hold the new weights and the trainer has scored the
        probe, before the engines take back their KV cache (colocated on GPU: the trainer offloads).
        `client_factory(url, timeout_s=..., api_key=...)`: the engine client (default
        BlockingEngineClient; tests give stand-ins that record the order of calls)."""
        if not engine_urls:
            raise WeightSyncError("weight sync needs at least one engine URL")
        self.cfg = cfg
        self.transport = transport_for(cfg.transport)  # its driver half
        self.actor_group = actor_group
        self.engine_urls = tuple(str(u).rstrip("/") for u in engine_urls)
        self.tokenizer_path = tokenizer_path
        self.api_key = api_key
        self.clients: list = []
        self.engines: tuple[EngineInfo, ...] = ()
        self.plan: RankSyncPlan | None = None
        self.trainer_dtype: str | None = None  # the trainer computes in it
        self.engine_dtype: str | None = None  # the engines compute in it; the weights travel in it
        self.tolerance: float | None = None
        self.memory: EngineMemory | None = None
        self._released = released
        self._after_send = after_send
        self._client_factory = client_factory
        self._probe_ids: list[int] = []  # set by connect
        self._image_probe: ImageProbe | None = None  # a VLM's probe prompt with an image (image_probe.py)

    @classmethod
    def create(cls, cfg: WeightSyncConfig, actor_group, engine_urls, **kwargs) -> "WeightSync":
        """A connected WeightSync (closed again if connecting fails)."""
        sync = cls(cfg, actor_group, engine_urls, **kwargs)
        try:
            sync.connect()
        except BaseException:
            sync.close()
            raise
        return sync

    @property
    def num_stages(self) -> int:
        return self.actor_group.config.parallel.pipeline_model_parallel_size

    # ------------------------------------------------------------------ connect
    def connect(self) -> None:
        from lean_rl.backends.sglang.blocking_client import BlockingEngineClient

        client_factory = self._client_factory or BlockingEngineClient
        if self.plan is not None:
            raise WeightSyncError("WeightSync.connect() called twice")
        if self.actor_group.family is None:
            raise WeightSyncError("weight sync needs the trainer's HF family: load an HF checkpoint into the "
                                  "actor group first (MegatronGroup.from_hf_checkpoint / load_hf_checkpoint)")
        timeout = self.cfg.timeout_s
        # the probe's requests name the adapter when the engines serve the policy as base + adapter
        named = {"adapter": self.cfg.adapter.name} if self.cfg.adapter is not None else {}
        self.clients = [client_factory(url, timeout_s=timeout, api_key=self.api_key, **named) for url in self.engine_urls]
        servers = call_all(self.clients, timeout, EngineClient.server_info)
        models = call_all(self.clients, timeout, EngineClient.model_info)
        self.engines = tuple(self._engine_info(*info) for info in zip(self.engine_urls, servers, models))
        devices = {e.device for e in self.engines}
        if len(devices) != 1:
            raise WeightSyncError(f"engines on different devices: {[(e.url, e.device) for e in self.engines]}")
        engine_device = devices.pop()
        engine_dtypes = {e.dtype for e in self.engines}
        if len(engine_dtypes) != 1:
            raise WeightSyncError(f"engines serve different dtypes: {[(e.url, e.dtype) for e in self.engines]}")
        self.engine_dtype = engine_dtypes.pop()
        self.transport.check(self.actor_group.device, engine_device)
        self.plan = RankSyncPlan(
            transport=type(self.transport), engine_urls=self.engine_urls,
            engine_tp_sizes=tuple(e.tp_size for e in self.engines), buffer_size_bytes=self.cfg.buffer_size_bytes,
            timeout_s=timeout, family=self.actor_group.family, group_prefix=f"lean_rl_ws_{uuid.uuid4().hex[:8]}",
            backend="nccl" if self.actor_group.device == "cuda" else "gloo", api_key=self.api_key,
            dtype=self.engine_dtype)
        # each rank hosts one RankWeightSync (shared by every WeightSync of the group), built from the
        # class given here: the Megatron backend does not import the weight sync
        self.actor_group.attach(RankWeightSync)
        # the plan carries the key as its file's path: the driver's file to the ranks' nodes first
        place_key_file(self.api_key, node_ids_at(self.actor_group.rank_nodes()), timeout_s=timeout)
        ranks = self.on_ranks(RankWeightSync.setup, self.plan)
        # tensors travel in the engines' dtype (plan.dtype); the probe compares the trainer's forward in
        # its own dtype with the engines' in theirs, so its default tolerance follows both
        dtypes = {d for r in ranks for d in r["dtypes"]}
        if len(dtypes) != 1:
            raise WeightSyncError(f"the trainer's weights are in several dtypes {sorted(dtypes)}; expected one")
        self.trainer_dtype = dtypes.pop()
        self.tolerance = self.cfg.probe_tolerance(self.trainer_dtype, self.engine_dtype)
        self.transport.connect(self)
        self.memory = EngineMemory(self.clients, engine_device, timeout, self._released)
        self._probe_ids = probe_token_ids(self.tokenizer_path or self.engines[0].tokenizer_path
                                          or self.engines[0].model_path)
        if self.actor_group.config.vlm_hf_config is not None:  # the probe reaches the vision tower too
            self._image_probe = build_image_probe(self.engines[0].model_path)

    @staticmethod
    def _engine_info(url: str, server: dict, model: dict) -> EngineInfo:
        from lean_rl.backends.megatron.hf_config import checkpoint_dtype
        from lean_rl.backends.sglang.command_line import serving_dtype

        for key in ("pp_size", "dp_size"):
            if int(server.get(key) or 1) != 1:
                raise WeightSyncError(f"{url}: weight sync supports engines with {key} 1, this one has "
                                      f"{server.get(key)}")
        requested = str(server.get("dtype") or "auto")
        model_path = str(model["model_path"])
        dtype = serving_dtype(requested, checkpoint_dtype(model_path) if requested == "auto" else None)
        return EngineInfo(url=url, device=str(server.get("device", "cuda")), tp_size=int(server.get("tp_size") or 1),
                          model_path=model_path, tokenizer_path=model.get("tokenizer_path"), dtype=dtype)

    # ------------------------------------------------------------------ sync
    def update(self, version: int | str, *, probe: bool = True) -> SyncReport:
        """Send the trainer's current weights to every engine as weight version str(version), then probe.
        Raises WeightSyncError (WeightSyncProbeError when an engine does not serve them).
        The probe generates, so it cannot run while the engines are paused (/pause_generation): a
        caller that syncs between pause and continue passes probe=False and calls probe(version)
        after continue_generation."""
        if self.plan is None:
            raise WeightSyncError("WeightSync.update() before connect()")
        assert self.memory is not None  # set by connect, as the plan
        version = str(version)
        started = time.perf_counter()
        self.memory.resume(WEIGHTS)
        sent = self.transport.deliver(self, version)
        seconds = time.perf_counter() - started
        probe_started = time.perf_counter()
        # the engines score the probe while the trainer does, unless the devices change hands between
        engine_calls = None
        if probe and self._after_send is None and not self.memory.holds_released(KV_CACHE_AND_GRAPHS):
            engine_calls = submit_probe(self.clients, self._probe_ids, self.cfg.timeout_s, self._image_probe)
        # the trainer scores the probe while its weights are still on its devices (see after_send)
        trainer_log_probs = self._trainer_probe_log_probs() if probe else None
        probe_seconds = time.perf_counter() - probe_started
        if self._after_send is not None:
            self._after_send()
        self.memory.resume(KV_CACHE_AND_GRAPHS)
        probe_started = time.perf_counter()
        result = self._probe(version, trainer_log_probs, self._after_send is not None, engine_calls) if probe else None
        probe_seconds += time.perf_counter() - probe_started
        return SyncReport(version=version, transport=self.transport.name, seconds=seconds,
                          bytes=sum(s.bytes for s in sent), buckets=sum(s.buckets for s in sent),
                          tensors=sum(s.tensors for s in sent), export_seconds=sum(s.export_seconds for s in sent),
                          probe=result, probe_seconds=probe_seconds)

    def probe(self, version: int | str) -> ProbeResult:
        """Every engine serves the trainer's weights as `version`, or WeightSyncProbeError. The engines
        must be generating (not paused): the probe is one /generate call per engine."""
        # the engines score while the trainer does
        engine_calls = submit_probe(self.clients, self._probe_ids, self.cfg.timeout_s, self._image_probe)
        return self._probe(version, self._trainer_probe_log_probs(), engine_calls=engine_calls)

    def _trainer_probe_log_probs(self):
        image = self._image_probe
        if image is not None:
            return self.actor_group.compute_log_probs([image.token_ids], [image.score_from],
                                                      images=[image.train_inputs]).log_probs[0]
        return self.actor_group.compute_log_probs([self._probe_ids]).log_probs[0]

    def _probe(self, version: int | str, trainer_log_probs, trainer_offloaded: bool = False,
               engine_calls: list | None = None) -> ProbeResult:
        """`trainer_offloaded`: after_send has run (colocated on GPU), so the trainer's tensors cannot be
        hashed to name a differing one: the error says so instead of failing in the export (N4)."""
        result = run_probe(trainer_log_probs, self.clients, self._probe_ids, str(version), self.tolerance,
                           self.cfg.timeout_s, probe_statistic(self.trainer_dtype, self.engine_dtype, self.cfg.device),
                           image_probe=self._image_probe, calls=engine_calls)
        unnamed = None
        if self.transport.sends_adapter:
            unnamed = "the engine serves its base with the LoRA adapter loaded apart, so no tensor can be named"
        elif trainer_offloaded:
            unnamed = ("the trainer's weights were offloaded for generation (colocated on GPU), so the differing "
                       "tensor is not named; rerun without --colocate, or on CPU, to name it")
        raise_on_failure(result, self.clients, self.plan.engine_tp_sizes,
                         None if unnamed else self._trainer_checksums, self.cfg.timeout_s,
                         dtypes=(self.trainer_dtype, self.engine_dtype), unnamed_why=unnamed)
        return result

    def release_engine_memory(self) -> bool:
        """Colocated on GPU: free the engines' memory before training (update() takes it back).
        False (skipped) when not colocated or the engines are on CPU. With the adapter transport the
        weights stay: SGLang keeps no copy of released weights (no --enable-weights-cpu-backup), and an
        adapter-only sync never sends the base again (review 2026-12-06 N2)."""
        tags = KV_CACHE_AND_GRAPHS if self.transport.sends_adapter else ALL
        return self.cfg.colocate and self.memory.release(tags)

    # ------------------------------------------------------------------ for the transports
    def send_stages(self, args_for_stage: Callable[[int], tuple]) -> list[StageSent]:
        """RankWeightSync.send_stage on every rank, one pipeline stage after another, with the
        transport's arguments `args_for_stage(stage)`; the stage leads' reports, in stage order.
        An engine's failure on a lead raises WeightSyncError here (the trainer ranks are fine)."""
        sent = []
        for stage in range(self.num_stages):
            per_rank = self.on_ranks(RankWeightSync.send_stage, self.plan.group_prefix, stage, *args_for_stage(stage))
            results = [r for r in per_rank if r is not None]
            if len(results) != 1:
                raise WeightSyncError(f"send_stage: stage {stage} reported from {len(results)} lead ranks, expected 1")
            if results[0].error is not None:  # an engine failed; the trainer ranks are fine
                raise WeightSyncError(f"send_stage: stage {stage}: {results[0].error}")
            sent.append(results[0])
        return sent

    def connect_stage(self, stage: int) -> None:
        """RankWeightSync.connect_stage on every rank (the stage's lead connects its transport)."""
        assert self.plan is not None, "connect_stage: called before connect"
        self.on_ranks(RankWeightSync.connect_stage, self.plan.group_prefix, stage)

    def on_ranks(self, fn: Callable, *args) -> list:
        """RankWeightSync.<fn>(*args) on every trainer rank, in lockstep; results in rank order."""
        return self.actor_group.call_all(fn, *args)

    def _trainer_checksums(self) -> tuple[dict[str, str], dict[str, list[str]]]:
        checksums: dict[str, str] = {}
        sources: dict[str, list[str]] = {}
        for stage in range(self.num_stages):
            for result in self.on_ranks(RankWeightSync.stage_checksums, self.plan.group_prefix, stage):
                if result is not None:
                    checksums.update(result[0])
                    sources.update(result[1])
        return checksums, sources

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Close the transport (process groups, a temporary disk directory), the ranks' side and the
        clients. Best effort for every part (the trainer or an engine may already be gone); idempotent."""
        problems = self.transport.close(self)
        if self.plan is not None:
            try:
                self.on_ranks(RankWeightSync.close, self.plan.group_prefix)
            except Exception as exc:  # the group may be shut down already
                problems.append(f"trainer: {exc}")
        self.plan = None
        for client in self.clients:
            client.close()
        self.clients = []
        if problems:
            import logging

            logging.getLogger(__name__).warning("weight sync close: %s", "; ".join(problems))

    def __enter__(self) -> "WeightSync":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

