"""The engines' sampler snapshots: the least recently sampled goes first, so a reference client made
at the start (DPO, KL) outlives the evaluation snapshots saved after it."""

import pytest

from lean_rl.tinker.snapshots import SnapshotSlots


def test_the_least_recently_sampled_snapshot_is_unloaded_first():
    slots = SnapshotSlots(3)
    for name in ("reference", "eval1", "eval2"):
        assert slots.make_room() == []
        slots.add(name)
    slots.touch("reference")  # sampled at every step
    assert slots.make_room() == ["eval1"]
    slots.add("eval3")
    assert "reference" in slots and "eval1" not in slots
    assert slots.make_room() == ["eval2"]


def test_without_sampling_the_oldest_goes_first():
    slots = SnapshotSlots(2)
    slots.add("a")
    slots.add("b")
    slots.touch("never-loaded")  # a name it does not hold changes nothing
    assert slots.make_room() == ["a"]


def test_capacity_must_hold_one():
    with pytest.raises(ValueError, match="capacity"):
        SnapshotSlots(0)
