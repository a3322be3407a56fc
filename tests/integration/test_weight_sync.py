"""Weight sync with real components: Megatron ranks (Ray, gloo) holding the tiny Qwen2 with other
weights (seed 1) ship them to the shared SGLang engines (tiny Qwen2, seed 0) by each transport; the
engines then score like transformers on the seed-1 checkpoint, report the step as weight version, and
the probe passes (and failed before the sync). The probe's error names the engine and the tensor when
one engine's copy is corrupted afterwards. Every test puts the seed-0 weights back on the engines."""

from __future__ import annotations

import base64
import os
import pickle
import random
import signal
import time

import psutil
import pytest
import torch
from safetensors.torch import load_file

from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.backends.megatron.group import MegatronGroup
from lean_rl.backends.sglang.blocking_client import BlockingEngineClient
from lean_rl.backends.sglang.health import EngineMonitor
from lean_rl.weight_sync.config import WeightSyncConfig
from lean_rl.weight_sync.errors import WeightSyncError, WeightSyncProbeError
from lean_rl.weight_sync.sync import WeightSync
from lean_rl.weight_sync.engine_weights import EngineWeights
from lean_rl.options import build

pytestmark = pytest.mark.integration

LAYOUTS = {"tp2": ParallelConfig(tensor_model_parallel_size=2), "pp2": ParallelConfig(pipeline_model_parallel_size=2),
           "tp2pp2": ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)}
SMALL_BUCKETS = 100_000  # bytes: the tiny model (~750 kB) goes in several buckets


@pytest.fixture(scope="module")
def trainer_cache():
    """One Megatron group at a time (2 cores): asking for another layout shuts the previous one down."""
    cache: dict = {}
    yield cache
    for group in cache.values():
        group.shutdown()


@pytest.fixture
def trainer(request, trainer_cache, ray_cluster, tiny_model_factory):
    layout = request.param
    if layout not in trainer_cache:
        for group in trainer_cache.values():
            group.shutdown()
        trainer_cache.clear()
        trainer_cache[layout] = MegatronGroup.from_hf_checkpoint(tiny_model_factory("qwen2", seed=1),
                                                                      LAYOUTS[layout])
    return trainer_cache[layout]


@pytest.fixture
def engines(engine_group, tiny_qwen2):
    """Engine clients; the engines get the seed-0 weights and their weight version back afterwards."""
    clients = [BlockingEngineClient(url, timeout_s=120, api_key=engine_group.config.api_key)
               for url in engine_group.engine_urls]
    versions = [c.weight_version() for c in clients]
    yield clients
    for client, version in zip(clients, versions):
        client.update_weights_from_disk(str(tiny_qwen2), weight_version=version)
        client.close()


def restore(clients, checkpoint) -> None:
    for client in clients:
        client.update_weights_from_disk(str(checkpoint), weight_version="default")


@pytest.fixture(scope="module")
def check_sequence(tiny_model_factory):
    """Random tokens (not the probe's) and their log-probs under transformers on the seed-1 model."""
    from transformers import AutoModelForCausalLM

    rng = random.Random(7)
    ids = [rng.randrange(4, 512) for _ in range(40)]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_factory("qwen2", seed=1), dtype=torch.float32).eval()
    with torch.no_grad():
        log_probs = torch.log_softmax(model(torch.tensor([ids])).logits[0], dim=-1)
    return ids, log_probs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def max_diff_to_transformers(client, check_sequence) -> float:
    ids, expected = check_sequence
    return float((torch.tensor(client.score(ids).log_probs) - expected).abs().max())


def listeners(pid: int) -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN}


def send_inline(client, named: dict[str, torch.Tensor], version: str) -> None:
    """Overwrite tensors on one engine behind the trainer's back (the test's corruption)."""
    payload = base64.b64encode(pickle.dumps(list(named.items()))).decode()
    client.update_weights_from_tensor([payload], weight_version=version)


@pytest.mark.parametrize("trainer", ["tp2"], indirect=True)
def test_probe_names_the_engine_and_the_tensor(trainer, engines, engine_group, tiny_model_factory):
    seed1 = load_file(str(tiny_model_factory("qwen2", seed=1) / "model.safetensors"))
    urls = engine_group.engine_urls
    with WeightSync.create(build(WeightSyncConfig, transport="tensor"), trainer, urls,
                           api_key=engine_group.config.api_key) as sync:
        sync.update(7)
        down = "model.layers.1.mlp.down_proj.weight"
        send_inline(engines[1], {down: seed1[down] + 0.5}, version="7")
        with pytest.raises(WeightSyncProbeError) as error:
            sync.probe(7)
        assert error.value.engine_url == urls[1] and error.value.tensors == [down]
        assert urls[1] in str(error.value) and down in str(error.value) and urls[0] not in str(error.value)

        sync.update(8)
        q = "model.layers.0.self_attn.q_proj.weight"
        send_inline(engines[0], {q: seed1[q] * 0.5}, version="8")
        with pytest.raises(WeightSyncProbeError) as error:
            sync.probe(8)
        assert error.value.engine_url == urls[0]
        assert error.value.tensors == ["model.layers.0.self_attn.qkv_proj.weight"]
        assert f"model.layers.0.self_attn.qkv_proj.weight (from {q}" in str(error.value)

        sync.update(9)
        send_inline(engines[1], {down: seed1[down]}, version="stale")  # right weights, wrong version
        with pytest.raises(WeightSyncProbeError, match=f"{urls[1]} reports weight_version 'stale'"):
            sync.probe(9)

    # Weights bit-exact but a tolerance no float32 forward meets: the error says where the gap is.
    strict = build(WeightSyncConfig, transport="distributed", probe_tol=1e-12)
    with WeightSync.create(strict, trainer, urls, api_key=engine_group.config.api_key) as sync:
        with pytest.raises(WeightSyncProbeError, match="parameters match the trainer's bytes") as error:
            sync.update(10)
        assert error.value.tensors == []


@pytest.mark.parametrize("trainer", ["tp2"], indirect=True)
def test_a_refused_update_names_the_engine_and_closes_the_other_sessions(trainer, engines, engine_group):
    urls = engine_group.engine_urls
    with WeightSync.create(build(WeightSyncConfig, transport="distributed"), trainer, urls,
                           api_key=engine_group.config.api_key) as sync:
        engines[0].begin_weight_update()  # someone else holds engine 0's session
        try:
            with pytest.raises(WeightSyncError, match=f"begin_weight_update: {urls[0]}.*already open"):
                sync.update(11)
        finally:
            engines[0].end_weight_update()
        engines[1].begin_weight_update()  # would fail if the sync had left engine 1's session open
        engines[1].end_weight_update()
        assert sync.update(12).probe.max_abs_diff <= 1e-3  # and the group still works


@pytest.mark.parametrize("trainer", ["tp2"], indirect=True)
def test_sync_while_paused_then_probe_after_resuming(trainer, engines, engine_group):
    """The fully async loop's order: pause, sync without the probe (it generates), continue, probe."""
    with WeightSync.create(build(WeightSyncConfig, transport="distributed"), trainer, engine_group.engine_urls,
                           api_key=engine_group.config.api_key) as sync:
        for client in engines:
            client.pause_generation("in_place")
        try:
            report = sync.update(21, probe=False)
        finally:
            for client in engines:
                client.continue_generation()
        assert report.probe is None and [c.weight_version() for c in engines] == ["21", "21"]
        assert sync.probe(21).max_abs_diff <= 1e-3


def wait_for(condition, what: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


# slow (suite time): tests/e2e/test_engine_faults.py kills an engine in the real loop by default and finds
# no token of stale weights trained
@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["tp2"], indirect=True)
def test_a_restarted_engine_gets_the_trainers_weights_before_it_rejoins(trainer, engines, engine_group,
                                                                        check_sequence):
    """kill -9 of an engine between syncs: the monitor restarts it (it serves --hf-checkpoint, seed 0),
    keeps it out of the router until EngineWeights has given it the trainer's weights and version; a
    kill just before a sync: the sync waits for the restart and is done again, on both engines."""
    monitor = EngineMonitor(engine_group, interval_s=0.5)
    weights = EngineWeights.start(build(WeightSyncConfig, transport="distributed"), trainer, engine_group, monitor,
                                  version=7, api_key=engine_group.config.api_key)
    monitor.start()
    try:
        weights.sync(7)
        victim = engine_group.pids()["engine-1"][0]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: any("back in the router with the current weights" in e for e in monitor.health[1].events),
                 "engine 1 back in the router")
        assert engines[1].weight_version() == "7" and weights.rejoins == 1
        assert max_diff_to_transformers(engines[1], check_sequence) < 1e-4  # the trainer's (seed-1) weights
        assert engine_group.router.worker_urls() == set(engine_group.engine_urls)
        assert any("out of the router until it holds the current weights" in e for e in monitor.health[1].events)

        os.kill(engine_group.pids()["engine-1"][0], signal.SIGKILL)
        report = weights.sync(8)  # begins on a dead engine: waits for its restart, reconnects, syncs again
        assert weights.recoveries == 1 and monitor.total_restarts == 2
        assert report.probe.max_abs_diff <= 1e-3 and [c.weight_version() for c in engines] == ["8", "8"]
        wait_for(lambda: engine_group.router.worker_urls() == set(engine_group.engine_urls), "both engines routed")
        print("engine 1 events:", monitor.health[1].events)
    finally:
        weights.close()
        monitor.stop()


# after the tp2-only tests, so that the tp2 group is started once
@pytest.mark.parametrize("trainer", ["tp2", "pp2", pytest.param("tp2pp2", marks=pytest.mark.slow)],
                         indirect=True)
def test_every_transport_delivers_the_trainers_weights(trainer, engines, engine_group, tiny_qwen2,
                                                       tiny_model_factory, check_sequence):
    seed1 = load_file(str(tiny_model_factory("qwen2", seed=1) / "model.safetensors"))
    for step, transport in enumerate(["distributed", "tensor", "disk"], start=1):
        restore(engines, tiny_qwen2)
        assert all(max_diff_to_transformers(c, check_sequence) > 1.0 for c in engines)  # seed 0 serves now
        cfg = build(WeightSyncConfig, transport=transport, buffer_size_bytes=SMALL_BUCKETS)
        listening_before = listeners(trainer.rank_pids()[0])
        with WeightSync.create(cfg, trainer, engine_group.engine_urls,
                               api_key=engine_group.config.api_key) as sync:
            with pytest.raises(WeightSyncProbeError, match="disagrees with the trainer"):
                sync.probe(step)  # the probe has teeth: before the sync it fails
            opened = listeners(trainer.rank_pids()[0]) - listening_before
            if transport == "distributed":  # the group's store (and gloo pairs) on loopback only
                assert opened and {ip for ip, _ in opened} == {"127.0.0.1"}, opened
            report = sync.update(step * 10)
            # the second sync of a WeightSync is another path (distributed: pipelined from the layout
            # the first one recorded): seed 0 back on the engines, then the trainer's weights again
            restore(engines, tiny_qwen2)
            again = sync.update(step * 10 + 1)
        assert again.probe.max_abs_diff <= 1e-3
        assert (again.tensors, again.bytes, again.buckets) == (report.tensors, report.bytes, report.buckets)
        for client in engines:
            assert max_diff_to_transformers(client, check_sequence) < 1e-4, (transport, client.base_url)
        assert report.transport == transport
        assert report.tensors == len(seed1) and report.bytes == sum(t.numel() * 4 for t in seed1.values())
        assert report.buckets > 1 and report.seconds > 0
        assert report.probe.max_abs_diff <= 1e-3 and report.probe.version == str(step * 10)
        assert [c.weight_version() for c in engines] == [str(step * 10 + 1)] * len(engines)


@pytest.mark.slow
def test_expert_parallel_moe_to_its_own_engine(ray_cluster, trainer_cache, tiny_model_factory, tmp_path):
    """EP=2 (tiny qwen3_moe, 4 experts): expert shards gathered over EP reach SGLang's fused
    experts.w13_weight / w2_weight, by every transport. Needs its own engine (another model)."""
    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.testing.sglang_engines import engine_config_for_tests

    for group in trainer_cache.values():  # Ray's CPUs go to this test's own group
        group.shutdown()
    trainer_cache.clear()

    served, trained = tiny_model_factory("qwen3_moe", seed=0), tiny_model_factory("qwen3_moe", seed=1)
    config = engine_config_for_tests(served, "--rollout-num-engines", "1")
    with EngineGroup(config, tmp_path / "moe_engine") as moe_engines, \
            MegatronGroup.from_hf_checkpoint(trained, ParallelConfig(expert_model_parallel_size=2)) as trainer:
        client = BlockingEngineClient(moe_engines.engine_urls[0], timeout_s=120, api_key=config.api_key)
        try:
            for step, transport in enumerate(["distributed", "tensor", "disk"], start=1):
                restore([client], served)
                cfg = build(WeightSyncConfig, transport=transport, buffer_size_bytes=SMALL_BUCKETS)
                with WeightSync.create(cfg, trainer, moe_engines.engine_urls, api_key=config.api_key) as sync:
                    with pytest.raises(WeightSyncProbeError, match="experts.w13_weight"):
                        sync.probe(step)
                    report = sync.update(step)
                assert report.probe.max_abs_diff <= 1e-3 and client.weight_version() == str(step)
                assert report.tensors == len(load_file(str(trained / "model.safetensors")))
        finally:
            client.close()
