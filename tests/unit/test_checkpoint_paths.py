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
