"""The storage offloader that frees a trainer's GPU memory in colocated mode. Its mechanism
(resize storages to 0 and refill them) is device-independent, so it is checked here on CPU tensors;
the trainer applies it only on a GPU."""

import pytest
import torch

from lean_rl.backends.megatron.offload import StorageOffloader


def test_offload_releases_storages_and_restores_every_view():
    flat = torch.arange(10, dtype=torch.float32)
    param, other = flat[:6].view(2, 3), flat[6:]  # views of one buffer, as Megatron's DDP keeps them
    state = torch.full((4,), 3.0)
    grads = torch.ones(5)
    offloader = StorageOffloader(keep=[param, other, state, flat], discard=[grads])
    released = offloader.offload()
    assert released == (10 + 4 + 5) * 4  # each storage once
    assert flat.untyped_storage().nbytes() == 0 and grads.untyped_storage().nbytes() == 0
    with pytest.raises(RuntimeError, match="already offloaded"):
        offloader.offload()
    offloader.onload()
    assert torch.equal(flat, torch.arange(10, dtype=torch.float32))
    assert torch.equal(param, torch.tensor([[0.0, 1, 2], [3, 4, 5]])) and torch.equal(state, torch.full((4,), 3.0))
    assert torch.equal(grads, torch.zeros(5))  # grads are not kept: zeroed
    param.add_(1)  # views still alias the buffer
    assert flat[0].item() == 1.0


def test_host_buffers_are_reused_across_offloads():
    """The trainer rebuilds its offloader every step (Adam's state appears after the first): the host
    buffers stay in one pool, so only the first offload allocates them (pinned ones, on a GPU)."""
    from lean_rl.backends.megatron.offload import HostBuffers

    pool = HostBuffers()
    weights, state = torch.arange(8, dtype=torch.float32), torch.full((3,), 2.0)
    used = []
    for step in range(3):
        offloader = StorageOffloader(keep=[weights, state], host_buffers=pool)
        offloader.offload()
        used.append(sorted(h.data_ptr() for h in offloader._host.values()))
        offloader.onload()
        weights.add_(1)
        assert torch.equal(state, torch.full((3,), 2.0))
    assert pool.allocated == 2  # one per storage, at the first offload only
    assert used[0] == used[1] == used[2]
    assert torch.equal(weights, torch.arange(8, dtype=torch.float32) + 3)
