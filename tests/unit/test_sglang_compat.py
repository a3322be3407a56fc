"""The CPU patches: the sgl_kernel stand-in, compat.py, and the launcher's argv-driven patching.
Patches change process-wide state, so everything but the pure kernel runs in a fresh interpreter."""

import importlib.util
import pytest
import torch

from lean_rl.backends.sglang.compat import CPU_KERNELS_DIR
from lean_rl.testing.driver_result import run_driver
from lean_rl.utils.net import find_free_port


@pytest.fixture(scope="module")
def cpu_kernels():
    # Loaded under another name so this test process never gets a module called `sgl_kernel`.
    spec = importlib.util.spec_from_file_location("lean_rl_test_sgl_kernel", CPU_KERNELS_DIR / "sgl_kernel" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_assign_req_to_token_pool_writes_each_requests_slots(cpu_kernels):
    req_to_token = torch.full((4, 10), -1, dtype=torch.int32)
    rows = torch.tensor([2, 0, 3])
    start = torch.tensor([1, 0, 5])
    end = torch.tensor([4, 2, 5])  # the third request gets no new tokens
    out_cache_loc = torch.tensor([100, 101, 102, 200, 201], dtype=torch.int64)
    cpu_kernels.assign_req_to_token_pool_cpu(rows, req_to_token, start, end, out_cache_loc, 10)
    expected = torch.full((4, 10), -1, dtype=torch.int32)
    expected[2, 1:4] = torch.tensor([100, 101, 102])
    expected[0, 0:2] = torch.tensor([200, 201])
    assert torch.equal(req_to_token, expected)


def test_any_other_kernel_imports_but_raises_naming_the_op(cpu_kernels):
    from_import = cpu_kernels.fused_add_rmsnorm_cpu  # `from sgl_kernel import X` must succeed
    with pytest.raises(NotImplementedError, match=r"sgl_kernel\.fused_add_rmsnorm_cpu is not implemented"):
        from_import(torch.zeros(1))
    with pytest.raises(AttributeError):
        cpu_kernels.__wrapped__  # dunder lookups must not pretend to exist


def run_python(code: str, *args: str) -> dict:
    done, out = run_driver(code, *args, timeout_s=120)
    assert done.returncode == 0 and isinstance(out, dict), done.stderr[-3000:]
    return out


PATCH_AND_PROBE = """
import os, socket, sys
if sys.argv[2] == "patch":
    from lean_rl.backends.sglang.compat import apply_cpu_patches
    apply_cpu_patches()
import torch.distributed as dist
port = int(sys.argv[1])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
probe = socket.socket()
try:
    probe.bind(("0.0.0.0", port))  # fails while something listens on *:port
    listener_on_all_interfaces = False
except OSError:
    listener_on_all_interfaces = True
out = {"listener": listener_on_all_interfaces, "env": os.environ.get("SGLANG_USE_CPU_ENGINE"),
       "pythonpath": os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]}
if sys.argv[2] == "patch":
    import sgl_kernel
    out["sgl_kernel"] = sgl_kernel.__file__
from lean_rl.testing.driver_result import write_result
write_result(out)
"""


def test_cpu_patches_keep_the_store_local_and_put_the_stand_in_first():
    unpatched = run_python(PATCH_AND_PROBE, str(find_free_port()), "none")
    assert unpatched["listener"], "control: torch's TCPStore is expected to listen on all interfaces"
    patched = run_python(PATCH_AND_PROBE, str(find_free_port()), "patch")
    assert not patched["listener"]
    assert patched["env"] == "1"
    assert patched["pythonpath"] == str(CPU_KERNELS_DIR)
    assert patched["sgl_kernel"] == str(CPU_KERNELS_DIR / "sgl_kernel" / "__init__.py")


LAUNCHER_IMPORT = """
import os, sys
sys.argv = ["launch", *sys.argv[1:]]
import lean_rl.backends.sglang.launch
from lean_rl.testing.driver_result import write_result
write_result({"env": os.environ.get("SGLANG_USE_CPU_ENGINE"), "kernels_first": sys.path[0]})
"""


# the forms of --device: tests/unit/test_sglang_config.py::test_launcher_reads_the_device_from_argv
@pytest.mark.parametrize("argv, patched", [(["--device", "cpu"], True), ([], False)])
def test_launcher_patches_only_when_argv_says_cpu(argv, patched, monkeypatch):
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    out = run_python(LAUNCHER_IMPORT, *argv)
    assert (out["env"] == "1") is patched
    assert (out["kernels_first"] == str(CPU_KERNELS_DIR)) is patched


def test_weight_update_group_maps_global_src_and_can_be_destroyed():
    # What _world.pg_group_ranks (registered by join_weight_update_group) is needed for: the engines
    # broadcast with a global src=0, and destroy_process_group deletes the group's entry.
    import torch.distributed as dist

    from lean_rl.backends.sglang.compat import join_weight_update_group

    group = join_weight_update_group(dist.HashStore(), 1, 0, "unit-weight-update", "gloo", 30)
    tensor = torch.ones(3)
    dist.broadcast(tensor, src=0, group=group)
    assert dist.get_global_rank(group, 0) == 0 and tensor.tolist() == [1.0, 1.0, 1.0]
    dist.destroy_process_group(group)


START_METHOD = """
import multiprocessing, sys
if sys.argv[1] == "patch":
    from lean_rl.backends.sglang.compat import apply_cpu_patches
    apply_cpu_patches()
    apply_cpu_patches()  # applied twice (a re-import): still one wrapper
multiprocessing.set_start_method("spawn", force=True)  # what SGLang's engine.py does
from lean_rl.testing.driver_result import write_result
write_result({"method": multiprocessing.get_start_method()})
"""


def test_a_cpu_server_forks_its_children_and_any_other_server_spawns_them():
    assert run_python(START_METHOD, "patch") == {"method": "fork"}
    assert run_python(START_METHOD, "plain") == {"method": "spawn"}
