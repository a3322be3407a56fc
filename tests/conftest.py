"""Shared fixtures. Expensive things (tiny checkpoints, SGLang servers, Ray) are built once per test
session; integration fixtures live in tests/integration/conftest.py."""

import signal
from pathlib import Path

import pytest

from lean_rl.testing.tiny_model import make_tiny_model

TYPE_CHECK_TEST = "tests/unit/test_type_check.py::test_lean_rl_has_no_type_finding_outside_the_baseline"


def pytest_configure(config):
    """SIGINT handled as in an interactive pytest, however this one was started: a pytest started as a
    background job of a non-interactive shell (a CI runner, nohup ... &) inherits SIGINT *ignored*, which
    every process a test starts would inherit too (an ignored signal survives exec; a handler does not), so
    tests that stop a child with SIGINT would wait for their deadlines instead (docs/slow_suite.md)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_finish(session):
    """The type check starts now when this session runs it (tests/background_type_check.py)."""
    for item in session.items:
        if item.nodeid == TYPE_CHECK_TEST and not any(m.args and m.args[0] for m in item.iter_markers("skipif")):
            import background_type_check

            background_type_check.start()


def pytest_sessionfinish(session):
    import background_type_check

    background_type_check.stop()


@pytest.fixture(scope="session")
def tiny_models_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny_models")


@pytest.fixture(scope="session")
def tiny_qwen2(tiny_models_root) -> Path:
    """The tiny Qwen2 checkpoint (seed 0) that every integration test starts from."""
    return make_tiny_model(tiny_models_root / "qwen2", arch="qwen2", seed=0)


@pytest.fixture(scope="session")
def tiny_model_factory(tiny_models_root):
    """tiny_model_factory(arch, seed=0) -> path; each (arch, seed) is built once per session."""
    cache: dict[tuple[str, int], Path] = {}

    def make(arch: str, seed: int = 0) -> Path:
        if (arch, seed) not in cache:
            cache[(arch, seed)] = make_tiny_model(tiny_models_root / f"{arch}-s{seed}", arch=arch, seed=seed)
        return cache[(arch, seed)]

    return make


@pytest.fixture(scope="session")
def ray_cluster():
    """Ray on this machine (this process's own local Ray), started once per session (reused if already up)."""
    import ray

    from lean_rl.utils.ray_utils import init_ray

    started = init_ray(num_cpus=2)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def simulated_cluster():
    """A Ray cluster of three nodes on loopback addresses 127.0.0.2-4 (lean_rl/testing/ray_cluster.py),
    for multi-node tests. This process never joins it (it may hold the local `ray_cluster`): a test
    runs its driver in a subprocess with `init_ray(cluster.address)` / `--ray-address`."""
    from lean_rl.testing.ray_cluster import SimulatedCluster

    # each node also declares 4 GPUs (there are none): CPU runs ask Ray for none, and the placement
    # tests of GPU runs read the ids Ray hands out (test_gpu_placement.py)
    with SimulatedCluster(num_nodes=3, cpus_per_node=2, gpus_per_node=4) as cluster:
        yield cluster
