"""Colocated on GPU, who holds the devices when (review M3-M5), as the order of the calls the driver
makes: EngineWeights and WeightSync are real; the trainer group, the engine clients and the monitor
are stand-ins that record each call into one log (no GPU, no server: the logic under test is the
driver's ordering, not the engines')."""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from lean_rl.backends.sglang.responses import ScoreResult
from lean_rl.weight_sync.config import WeightSyncConfig
from lean_rl.weight_sync.engine_weights import EngineWeights
from lean_rl.weight_sync.rank import RankWeightSync, StageSent
from lean_rl.options import build


class Log(list):
    def __call__(self, event: str) -> None:
        self.append(event)


@dataclass
class Trainer:
    """A MegatronGroup's face to the weight sync: one pipeline stage, bfloat16 weights, on GPU."""

    log: Log
    family: str = "qwen2"
    device: str = "cuda"
    config: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(
        parallel=SimpleNamespace(pipeline_model_parallel_size=1), vlm_hf_config=None))  # a text model

    def attach(self, cls):
        pass

    def rank_nodes(self) -> list[str]:  # one node, the driver's: no key file to place elsewhere
        return []

    def call_all(self, fn, *args, timeout_s=None):
        if fn is RankWeightSync.setup:
            return [{"rank": 0, "stage": 0, "lead": True, "dtypes": ["bfloat16"]}]
        if fn is RankWeightSync.send_stage:
            self.log(f"send v{args[2]}")
            return [StageSent(stage=0, bytes=8, buckets=1, tensors=1, export_seconds=0.0, send_seconds=0.0)]
        return [None]

    def compute_log_probs(self, token_ids):
        self.log("trainer scores the probe")
        return SimpleNamespace(log_probs=[torch.zeros(len(token_ids[0]) - 1)])


def client_factory(log: Log, model_path: str, versions: dict, score_offset: float = 0.0):
    class Client:
        def __init__(self, url, timeout_s, api_key, adapter=None):
            self.base_url = url

        def submit(self, fn, *args, **kwargs):
            method = fn.__name__
            answers = {"server_info": {"device": "cuda", "tp_size": 1, "dtype": "bfloat16"},
                       "model_info": {"model_path": model_path}}
            if method in ("release_memory_occupation", "resume_memory_occupation"):
                log(f"{self.base_url} {method.split('_')[0]} {'+'.join(args[0])}")
            elif method == "score":
                log(f"{self.base_url} score")
                answers["score"] = ScoreResult(log_probs=[score_offset] * (len(args[0]) - 1),
                                               weight_version=versions.get(self.base_url))
            future = Future()
            future.set_result(answers.get(method))
            return future

        def close(self):
            pass

    return Client


class Monitor:
    def __init__(self, log: Log, engines: int):
        self.log = log
        self.health = [SimpleNamespace(restarts=0) for _ in range(engines)]

    @contextlib.contextmanager
    def hold_health_checks(self):
        self.log("hold health checks")
        yield
        self.log("health checks resume")

    @property
    def total_restarts(self):
        return sum(h.restarts for h in self.health)

    def weights_delivered(self):
        pass


@pytest.fixture
def run(tiny_qwen2):
    log, versions = Log(), {}
    urls = ["http://e0", "http://e1"]
    trainer = Trainer(log)
    trainer.call_all = _tracking_versions(trainer.call_all, versions, urls)
    monitor = Monitor(log, len(urls))
    engines = SimpleNamespace(engine_urls=urls, engine_url=urls.__getitem__,
                              config=SimpleNamespace(start_timeout_s=1))
    weights = EngineWeights.start(
        build(WeightSyncConfig, colocate=True, device="cuda"), trainer, engines, monitor, version=0,
        tokenizer_path=str(tiny_qwen2), defer_rejoin=True, after_send=lambda: log("trainer offloads"),
        client_factory=client_factory(log, str(tiny_qwen2), versions))
    return SimpleNamespace(log=log, weights=weights, monitor=monitor, urls=urls)


def _tracking_versions(call_all, versions, urls):
    def call(fn, *args, **kwargs):
        result = call_all(fn, *args, **kwargs)
        if fn is RankWeightSync.send_stage:  # the stage lead sent and ended the engines' sessions
            versions.update(dict.fromkeys(urls, args[2]))
        return result
    return call


def test_a_colocated_step_hands_the_devices_over_in_order(run):
    assert run.weights.weight_sync.cfg.transport == "tensor"
    run.weights.sync(0)  # start-up: nothing released yet, the trainer leaves before the KV cache returns
    run.log.clear()
    with run.weights.trainer_turn(lambda: run.log("trainer onloads")):
        run.log("train")
        run.weights.sync(1)
    e0, e1 = run.urls
    assert run.log == [
        "hold health checks",  # before any memory goes (M3)
        f"{e0} release weights+kv_cache+cuda_graph", f"{e1} release weights+kv_cache+cuda_graph",
        "trainer onloads", "train",
        "hold health checks",  # the sync's own hold, nested
        f"{e0} resume weights", f"{e1} resume weights", "send v1",
        "trainer scores the probe", "trainer offloads",  # before the engines' KV cache returns (M4)
        f"{e0} resume kv_cache+cuda_graph", f"{e1} resume kv_cache+cuda_graph",
        f"{e0} score", f"{e1} score",
        "health checks resume",
        "health checks resume",  # only after the engines hold their KV cache again
    ]


def test_an_engine_that_restarted_is_not_resumed_the_others_are(run):
    """M5: the run's WeightSync is rebuilt after a restart; the engines that did not restart are still
    released then and must be resumed; the new server released nothing and must not be."""
    run.weights.sync(0)
    with run.weights.trainer_turn(lambda: None):
        run.monitor.health[1].restarts += 1  # engine 1 died during training and came back holding everything
        run.log.clear()
        run.weights.sync(1)
    e0, e1 = run.urls
    resumed = [event for event in run.log if " resume " in event]
    assert resumed == [f"{e0} resume weights", f"{e0} resume kv_cache+cuda_graph"]


def test_an_engine_restarted_while_generating_is_released_and_resumed_with_the_others(run):
    """Review 2026-12-06 N6: engine 1 restarts while the engines generate (before the turn). The turn
    reconnects first, so the new server's release is remembered and the sync resumes it."""
    run.weights.sync(0)
    run.monitor.health[1].restarts += 1  # the monitor restarted engine 1 during generation
    run.log.clear()
    with run.weights.trainer_turn(lambda: run.log("trainer onloads")):
        run.weights.sync(1)
    e0, e1 = run.urls
    assert f"{e1} release weights+kv_cache+cuda_graph" in run.log
    resumed = sorted(event for event in run.log if " resume " in event)
    assert resumed == sorted(f"{url} resume {tags}" for url in run.urls for tags in ("weights", "kv_cache+cuda_graph"))


def test_with_the_adapter_transport_the_engines_keep_their_base_weights(tiny_qwen2):
    """Review 2026-12-06 N2: SGLang keeps no copy of released weights, and an adapter-only sync never
    sends the base again: a LoRA run releases and resumes only the KV cache and CUDA graphs."""
    from lean_rl.backends.sglang.lora import ServedAdapter

    log, versions = Log(), {}
    urls = ["http://e0"]
    trainer = Trainer(log)
    trainer.call_all = _tracking_versions(trainer.call_all, versions, urls)
    engines = SimpleNamespace(engine_urls=urls, engine_url=urls.__getitem__, config=SimpleNamespace(start_timeout_s=1))
    cfg = build(WeightSyncConfig, colocate=True, device="cuda", adapter=ServedAdapter(4, 8.0, ("q_proj",)))
    assert cfg.transport == "adapter"
    weights = EngineWeights(cfg, trainer, engines, None, version=0, tokenizer_path=str(tiny_qwen2),
                            defer_rejoin=True, after_send=lambda: log("trainer offloads"),
                            client_factory=client_factory(log, str(tiny_qwen2), versions))
    weights._connect()
    with weights.trainer_turn(lambda: log("trainer onloads")):
        pass  # the sync itself (adapter transport) is covered by its own tests; the memory turn is what N2 is about
    assert [e for e in log if " release " in e] == ["http://e0 release kv_cache+cuda_graph"]
    assert weights.weight_sync.memory.resume(("weights",)) is False  # nothing of the weights to resume
    assert weights.weight_sync.memory.resume(("kv_cache", "cuda_graph")) is True


def test_a_failed_probe_after_the_trainer_offloaded_names_no_tensor_and_reads_no_weight(tiny_qwen2):
    """Review 2026-12-06 N4: colocated on GPU the probe fails after after_send offloaded the trainer;
    the error says why no tensor is named instead of exporting offloaded weights (the checksum pass)."""
    from lean_rl.weight_sync.errors import WeightSyncProbeError

    log, versions = Log(), {}
    trainer = Trainer(log)
    checksums_asked = []

    def call_all(fn, *args, **kwargs):
        if fn is RankWeightSync.stage_checksums:
            checksums_asked.append(args)
        return Trainer.call_all(trainer, fn, *args, **kwargs)

    trainer.call_all = _tracking_versions(call_all, versions, ["http://e0"])
    engines = SimpleNamespace(engine_urls=["http://e0"], engine_url=["http://e0"].__getitem__,
                              config=SimpleNamespace(start_timeout_s=1))
    weights = EngineWeights.start(build(WeightSyncConfig, colocate=True, device="cuda"), trainer, engines, None,
                                  version=0, tokenizer_path=str(tiny_qwen2), defer_rejoin=True,
                                  after_send=lambda: log("trainer offloads"),
                                  client_factory=client_factory(log, str(tiny_qwen2), versions, score_offset=-1.0))
    with pytest.raises(WeightSyncProbeError, match="trainer's weights were offloaded for generation") as err:
        weights.sync(1)
    assert err.value.tensors is None and not checksums_asked
    assert log.index("trainer offloads") < log.index("http://e0 score")  # the order that makes naming impossible
