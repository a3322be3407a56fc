"""Starting Ray: a run without --ray-address starts a Ray of its own and never joins another cluster."""

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import tempfile
import time
from pathlib import Path

import pytest

from lean_rl.testing.driver_result import run_driver

pytestmark = pytest.mark.integration

START_LOCAL = textwrap.dedent("""
    import ray
    from lean_rl.testing.driver_result import write_result
    from lean_rl.utils.ray_utils import init_ray
    started = init_ray(num_cpus=1)
    write_result({"started": started, "gcs": ray.get_runtime_context().gcs_address})
    ray.shutdown()
""")


@pytest.fixture
def short_tmp():
    # Ray's socket paths under it must stay below 107 bytes: pytest's tmp_path is too deep
    path = Path(tempfile.mkdtemp(prefix="lr_ray_", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_stale_cluster_address_is_never_joined(short_tmp):
    # What an earlier cluster that died without `ray stop` leaves behind: its address in
    # <ray temp dir>/ray_current_cluster and perhaps in $RAY_ADDRESS, with nothing listening there.
    tmp_path = short_tmp
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    (ray_tmp / "ray_current_cluster").write_text(dead)
    env = {**os.environ, "RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": dead}
    start = time.monotonic()
    out, facts = run_driver(START_LOCAL, env=env, timeout_s=180)
    assert out.returncode == 0 and facts, out.stderr[-3000:]
    assert facts["started"] is True and facts["gcs"] != dead, facts
    print(f"local Ray started beside a stale address in {time.monotonic() - start:.1f} s")


def test_a_dead_ray_address_fails_fast_and_names_the_flag():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    code = f"from lean_rl.utils.ray_utils import init_ray; init_ray({dead!r})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert f"--ray-address {dead}: nothing answers" in out.stderr
