"""Lifecycle of a MegatronGroup with real Ray actors and real Megatron: loopback-only
rendezvous, failures and timeouts that take the whole group down, actors that die with their driver."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from safetensors.torch import load_file, save_file

from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
from lean_rl.backends.megatron.group import MegatronGroup, MegatronGroupError
from lean_rl.backends.megatron.hf_config import arch_from_hf_config
from lean_rl.backends.megatron.trainer_layout import TrainerLayout

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone(pids, timeout_s=30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_rendezvous_and_gloo_use_loopback_only(ray_cluster, tiny_qwen2):
    config = MegatronConfig(arch_from_hf_config(tiny_qwen2), ParallelConfig(tensor_model_parallel_size=2))
    with MegatronGroup(config) as group:
        pids = group.rank_pids()
        store_listeners = [c for c in psutil.Process(pids[0]).net_connections("tcp")
                           if c.status == psutil.CONN_LISTEN and c.laddr.port == group.rendezvous_port]
        # connections between the two ranks (gloo pairs, store clients) and their addresses
        peer_ports = {c.laddr.port for c in psutil.Process(pids[1]).net_connections("tcp") if c.raddr}
        between = [c for c in psutil.Process(pids[0]).net_connections("tcp")
                   if c.raddr and c.raddr.port in peer_ports]
    assert [c.laddr.ip for c in store_listeners] == ["127.0.0.1"]
    assert between, "expected TCP connections between rank 0 and rank 1"
    assert {c.laddr.ip for c in between} | {c.raddr.ip for c in between} == {"127.0.0.1"}


def test_more_trainer_nodes_than_the_cluster_has_is_refused_before_any_actor(ray_cluster, tiny_qwen2):
    config = MegatronConfig(arch_from_hf_config(tiny_qwen2), ParallelConfig(tensor_model_parallel_size=2))
    layout = TrainerLayout.derive(config.parallel, 2, "cpu", num_nodes=2, on_cluster=True)
    with pytest.raises(MegatronGroupError, match=r"cannot place 2 trainer node\(s\) x 1 rank\(s\) .*STRICT_SPREAD.*"
                                                 r"the Ray cluster has 1 node\(s\) alive"):
        MegatronGroup(config, layout=layout)


def test_failure_on_one_rank_shuts_the_group_down(ray_cluster, tiny_qwen2, tmp_path):
    # A checkpoint that lacks a tensor only the second pipeline stage reads: rank 0 loads fine,
    # rank 1 fails, and the whole group must go.
    broken = tmp_path / "broken"
    shutil.copytree(tiny_qwen2, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    config = MegatronConfig(arch_from_hf_config(broken), ParallelConfig(pipeline_model_parallel_size=2))
    group = MegatronGroup(config)
    pids = group.rank_pids()
    with pytest.raises(MegatronGroupError,
                       match=r"load_hf_checkpoint failed on rank 1 \(KeyError: .*model\.layers\.1\.mlp\.down_proj"):
        group.load_hf_checkpoint(broken)
    assert _gone(pids)
    with pytest.raises(MegatronGroupError, match="shut down"):
        group.compute_log_probs([[1, 2, 3]])


def test_call_over_its_deadline_shuts_the_group_down(ray_cluster, tiny_qwen2):
    config = MegatronConfig(arch_from_hf_config(tiny_qwen2), ParallelConfig())
    group = MegatronGroup(config, call_timeout_s=1.0)
    pids = group.rank_pids()
    # 8 micro-batches of 2048 tokens take several seconds on this CPU
    with pytest.raises(MegatronGroupError, match=r"compute_log_probs: ranks \[0\] did not finish within 1s"):
        group.compute_log_probs([[5] * 2048] * 8, micro_batch_size=1)
    assert _gone(pids)


DRIVER = textwrap.dedent("""
    import json, sys, time, ray
    from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.megatron.hf_config import arch_from_hf_config
    ray.init(address=sys.argv[1], log_to_driver=False)
    group = MegatronGroup(MegatronConfig(arch_from_hf_config(sys.argv[2]), ParallelConfig()), world_size=2)
    print(json.dumps(group.rank_pids()), flush=True)
    time.sleep(600)
""")


def test_actors_die_with_their_driver(ray_cluster, tiny_qwen2):
    address = ray_cluster.get_runtime_context().gcs_address
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, address, str(tiny_qwen2)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"}, text=True)
    try:
        ready, _, _ = select.select([driver.stdout], [], [], 240)
        assert ready, "the driver did not report its actors within 240 s"
        pids = json.loads(driver.stdout.readline())
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        assert _gone(pids, timeout_s=60), f"actor processes {pids} outlived their driver"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
