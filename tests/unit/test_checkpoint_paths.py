import pytest

from lean_rl.backends.megatron import checkpoint_paths as cp


def test_publish_renames_and_updates_the_tracker(tmp_path):
    assert cp.latest_step(tmp_path) is None
    written = cp.prepare_temporary_dir(tmp_path, 5)
    (written / "shard").write_text("x")
    assert cp.latest_step(tmp_path) is None  # not published yet: nothing to resume from
    cp.publish(tmp_path, 5, written)
    assert cp.latest_step(tmp_path) == 5 and (cp.iteration_dir(tmp_path, 5) / "shard").read_text() == "x"
    assert not written.exists() and cp.list_steps(tmp_path) == [5]


def test_a_crash_mid_save_leaves_the_previous_checkpoint_latest(tmp_path):
    cp.publish(tmp_path, 1, cp.prepare_temporary_dir(tmp_path, 1))
    cp.prepare_temporary_dir(tmp_path, 2)  # the "crash": written but never published
    assert cp.latest_step(tmp_path) == 1 and cp.list_steps(tmp_path) == [1]
    assert cp.remove_stale_temporaries(tmp_path) == [cp.temporary_dir(tmp_path, 2)]


def test_tracker_naming_a_missing_directory_is_an_error(tmp_path):
    (tmp_path / cp.TRACKER).write_text("3\n")
    with pytest.raises(FileNotFoundError, match="names step 3"):
        cp.latest_step(tmp_path)
    (tmp_path / cp.TRACKER).write_text("release\n")
    with pytest.raises(ValueError, match="expected an iteration number"):
        cp.latest_step(tmp_path)


def test_one_resolver_takes_a_root_or_one_torch_dist_directory(tmp_path):
    for step in (1, 2):
        written = cp.prepare_temporary_dir(tmp_path, step)
        (written / cp.DCP_METADATA).write_text("")
        cp.publish(tmp_path, step, written)
    assert cp.find_checkpoint(tmp_path) == (2, cp.iteration_dir(tmp_path, 2))
    assert cp.find_checkpoint(tmp_path, 1) == (1, cp.iteration_dir(tmp_path, 1))
    assert cp.find_checkpoint(cp.iteration_dir(tmp_path, 1)) == (1, cp.iteration_dir(tmp_path, 1))
    bare = tmp_path / "exported"
    bare.mkdir()
    (bare / cp.DCP_METADATA).write_text("")
    assert cp.find_checkpoint(bare) == (None, bare)
    with pytest.raises(cp.CheckpointError, match="has no iteration 7"):
        cp.find_checkpoint(tmp_path, 7)
    with pytest.raises(cp.CheckpointError, match="no such directory"):
        cp.find_checkpoint(tmp_path / "absent")
    cp.prepare_temporary_dir(tmp_path / "crashed", 1)  # only a half-written save
    with pytest.raises(cp.CheckpointError, match="neither a torch_dist checkpoint"):
        cp.find_checkpoint(tmp_path / "crashed")
