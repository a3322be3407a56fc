"""Integration fixtures: ONE EngineGroup (2 SGLang servers + sglang-router on the tiny Qwen2) for the
whole session. SGLang needs 20-50 s to start here, so never start one per test; tests that change
server state (weights, pause) must restore it before they return."""

import pytest

from lean_rl.backends.sglang.engines import EngineGroup
from lean_rl.testing.sglang_engines import engine_config_for_tests


@pytest.fixture(scope="session")
def engine_group(tiny_qwen2, tmp_path_factory, ray_cluster):  # engines are Ray actors: the session's Ray
    with EngineGroup(engine_config_for_tests(tiny_qwen2), tmp_path_factory.mktemp("sglang_engines")) as group:
        print(f"\nengine group ready: {group.timings}")
        yield group
