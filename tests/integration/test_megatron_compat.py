"""The gloo replacements for Megatron's uneven all_gather / reduce_scatter (compat.py), run on two
real gloo processes against values computed by hand."""

from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp

from lean_rl.backends.megatron.distributed import connect_rendezvous_store, open_rendezvous_store

pytestmark = pytest.mark.integration

SPLITS = [3, 5]  # rows held by rank 0 and rank 1


def _rows(rank: int, count: int, offset: int = 0) -> torch.Tensor:
    return torch.arange(count * 4, dtype=torch.float32).reshape(count, 4) + 100 * rank + offset


def _check_on_rank(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from megatron.core.tensor_parallel import mappings

    from lean_rl.backends.megatron.compat import apply_compat

    apply_compat(torch.device("cpu"))
    store = connect_rendezvous_store(port, 2, timeout_s=60)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    group = dist.group.WORLD
    gathered = mappings._gather_along_first_dim(_rows(rank, SPLITS[rank]), group, output_split_sizes=SPLITS)
    # every rank holds all 8 rows; rank r keeps the sum over ranks of its SPLITS[r] rows
    scattered = mappings._reduce_scatter_along_first_dim(_rows(rank, sum(SPLITS), offset=7), group,
                                                         input_split_sizes=SPLITS)
    torch.save({"gathered": gathered, "scattered": scattered}, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def test_uneven_gather_and_reduce_scatter_on_gloo(tmp_path):
    store, port = open_rendezvous_store(world_size=2, timeout_s=60)
    context = mp.start_processes(_check_on_rank, args=(port, str(tmp_path)), nprocs=2, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + 180
    try:
        while not context.join(timeout=1):
            assert time.monotonic() < deadline, "gloo worker processes did not finish within 180 s"
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    del store
    expected_gathered = torch.cat([_rows(0, 3), _rows(1, 5)])
    full_sum = _rows(0, 8, offset=7) + _rows(1, 8, offset=7)
    for rank, rows in ((0, slice(0, 3)), (1, slice(3, 8))):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.equal(result["gathered"], expected_gathered)
        assert torch.equal(result["scattered"], full_sum[rows])


def _check_thread_mode_and_idempotence(out_file: str) -> None:
    import threading

    from megatron.core.tensor_parallel import mappings
    from megatron.core.transformer import torch_norm

    from lean_rl.backends.megatron import compat
    from lean_rl.backends.megatron.compat_cpu import megatron_thread_mode

    cpu = torch.device("cpu")
    compat.apply_compat(cpu)
    patched = (torch.cuda.current_device, mappings._gather_along_first_dim, torch_norm.WrappedTorchNorm.__new__)
    compat.apply_compat(cpu)  # a second call changes nothing (no double wrapping)
    again = (torch.cuda.current_device, mappings._gather_along_first_dim, torch_norm.WrappedTorchNorm.__new__)
    report = {"idempotent": all(a is b for a, b in zip(patched, again))}

    def in_thread():
        try:
            torch.zeros(1, device="cuda")
            report["without_mode"] = "no error"
        except (RuntimeError, AssertionError) as error:  # this torch build has no CUDA
            report["without_mode"] = type(error).__name__
        with megatron_thread_mode(cpu), megatron_thread_mode(cpu):
            report["mode_depth"] = len(torch.overrides._get_current_function_mode_stack())
            report["with_mode"] = torch.zeros(1, device="cuda").device.type
            report["tensor_cuda"] = torch.ones(2).cuda().device.type
        report["after"] = len(torch.overrides._get_current_function_mode_stack())

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(timeout=60)
    torch.save(report, out_file)


def test_device_mode_works_on_any_thread_and_apply_is_idempotent(tmp_path):
    out = tmp_path / "report.pt"
    process = mp.get_context("spawn").Process(target=_check_thread_mode_and_idempotence, args=(str(out),))
    process.start()
    process.join(timeout=180)
    if process.is_alive():
        process.kill()
        process.join(timeout=10)
        pytest.fail("compat check process did not finish within 180 s")
    assert process.exitcode == 0
    report = torch.load(out)
    assert report == {"idempotent": True, "without_mode": report["without_mode"], "mode_depth": 1,
                      "with_mode": "cpu", "tensor_cuda": "cpu", "after": 0}
    assert report["without_mode"] != "no error"
