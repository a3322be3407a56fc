import pytest

from lean_rl.backends.megatron import checkpoint_paths as cp
from lean_rl.options import build


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


# -- durable checkpoints (issue 12, item 7): the publish protocol, crash states, cleanup, keep-last --

import itertools  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

NEW_STEP_PHASES = ["synced", "renamed", "tracked"]
RESAVE_PHASES = ["synced", "moved_aside", "renamed", "tracked", "old_deleted"]


def _write(root, step, content):
    """A stand-in torch_dist checkpoint written to the temporary directory (files and a sub-directory)."""
    written = cp.prepare_temporary_dir(root, step)
    (written / cp.DCP_METADATA).write_text(content)
    (written / "__0_0.distcp").write_text(content)
    (written / cp.HF_CONFIG_DIR).mkdir()
    (written / cp.HF_CONFIG_DIR / "config.json").write_text(content)
    return written


def _loaded(root):
    """(step, content) of what a resume would load: the resolver's checkpoint, checked complete."""
    step, directory = cp.find_checkpoint(root)
    content = (directory / "__0_0.distcp").read_text()
    assert (directory / cp.DCP_METADATA).read_text() == content
    assert (directory / cp.HF_CONFIG_DIR / "config.json").read_text() == content
    return step, content


def _names(root):
    return {p.name for p in Path(root).iterdir()}


def _crash_after(root, step, written, phases):
    """Run the first `phases` steps of the protocol, then stop dead: nothing more runs (no finally)."""
    steps = cp.publish_phases(root, step, written)
    done = list(itertools.islice(steps, phases))
    del steps  # abandoned, as a kill -9 abandons it
    return done


def test_the_protocol_phases_in_order(tmp_path):
    assert list(cp.publish_phases(tmp_path, 1, _write(tmp_path, 1, "a"))) == NEW_STEP_PHASES
    assert list(cp.publish_phases(tmp_path, 1, _write(tmp_path, 1, "b"))) == RESAVE_PHASES
    assert _loaded(tmp_path) == (1, "b") and _names(tmp_path) == {cp.TRACKER, "iter_0000001"}


@pytest.mark.parametrize("phases", range(len(NEW_STEP_PHASES) + 1))
def test_a_crash_at_any_phase_of_a_new_step_leaves_a_complete_latest(tmp_path, phases):
    cp.publish(tmp_path, 1, _write(tmp_path, 1, "a"))
    assert _crash_after(tmp_path, 2, _write(tmp_path, 2, "b"), phases) == NEW_STEP_PHASES[:phases]
    expected = (2, "b") if phases >= NEW_STEP_PHASES.index("tracked") + 1 else (1, "a")
    assert _loaded(tmp_path) == expected
    cp.remove_stale_temporaries(tmp_path)  # what the next save does first
    assert _loaded(tmp_path) == expected
    published = ["iter_0000001", "iter_0000002"] if phases >= NEW_STEP_PHASES.index("renamed") + 1 else ["iter_0000001"]
    assert _names(tmp_path) == {cp.TRACKER, *published}  # no leftover
    cp.publish(tmp_path, 2, _write(tmp_path, 2, "c"))  # and the next save goes through
    assert _loaded(tmp_path) == (2, "c") and _names(tmp_path) == {cp.TRACKER, "iter_0000001", "iter_0000002"}


@pytest.mark.parametrize("phases", range(len(RESAVE_PHASES) + 1))
def test_a_crash_at_any_phase_of_a_resave_leaves_a_complete_latest(tmp_path, phases):
    """Re-saving the step the tracker names: there is never a moment without a complete checkpoint of
    it (the old one moves aside whole and is deleted only once the new one is in)."""
    cp.publish(tmp_path, 1, _write(tmp_path, 1, "a"))
    cp.publish(tmp_path, 2, _write(tmp_path, 2, "b"))
    assert _crash_after(tmp_path, 2, _write(tmp_path, 2, "c"), phases) == RESAVE_PHASES[:phases]
    expected = (2, "c") if phases >= RESAVE_PHASES.index("renamed") + 1 else (2, "b")
    assert cp.latest_step(tmp_path) == 2
    assert _loaded(tmp_path) == expected
    step, directory = cp.find_checkpoint(tmp_path, 2)  # by step too (the converters' --iteration)
    assert (step, (directory / "__0_0.distcp").read_text()) == expected
    cp.remove_stale_temporaries(tmp_path)
    assert _loaded(tmp_path) == expected
    assert cp.find_checkpoint(tmp_path) == (2, cp.iteration_dir(tmp_path, 2))  # back under its own name
    assert _names(tmp_path) == {cp.TRACKER, "iter_0000001", "iter_0000002"}
    cp.publish(tmp_path, 2, _write(tmp_path, 2, "d"))
    assert _loaded(tmp_path) == (2, "d") and _names(tmp_path) == {cp.TRACKER, "iter_0000001", "iter_0000002"}


_KILLER = """
import os, signal, sys
from lean_rl.backends.megatron import checkpoint_paths as cp
root, step, after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for done, phase in enumerate(cp.publish_phases(root, step, cp.temporary_dir(root, step)), 1):
    if done == after:
        os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("after", range(1, len(RESAVE_PHASES)))
def test_kill_9_of_a_process_mid_resave_then_load_and_save(tmp_path, after):
    """A real kill -9 (of a child process, at a chosen phase), then what a resume does: resolve,
    load, repair at the next save, save."""
    cp.publish(tmp_path, 3, _write(tmp_path, 3, "old"))
    _write(tmp_path, 3, "new")
    child = subprocess.run([sys.executable, "-c", _KILLER, str(tmp_path), "3", str(after)],
                           cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    expected = (3, "new") if after >= RESAVE_PHASES.index("renamed") + 1 else (3, "old")
    assert _loaded(tmp_path) == expected
    written = _write(tmp_path, 4, "next")  # prepare_temporary_dir repairs first
    assert _names(tmp_path) == {cp.TRACKER, "iter_0000003", "iter_0000004.tmp"}
    cp.publish(tmp_path, 4, written)
    assert _loaded(tmp_path) == (4, "next") and cp.find_checkpoint(tmp_path, 3)[1] == cp.iteration_dir(tmp_path, 3)


def test_everything_is_fsynced_before_the_rename_that_publishes_it(tmp_path, monkeypatch):
    cp.publish(tmp_path, 1, _write(tmp_path, 1, "a"))
    written = _write(tmp_path, 1, "b")
    files = {str(p) for p in written.rglob("*") if p.is_file()}
    dirs = {str(written), str(written / cp.HF_CONFIG_DIR)}
    events = []
    real = {name: getattr(cp, name) for name in ("fsync_file", "fsync_dir")}
    monkeypatch.setattr(cp, "fsync_file", lambda p: (events.append(("file", str(p))), real["fsync_file"](p)))
    monkeypatch.setattr(cp, "fsync_dir", lambda p: (events.append(("dir", str(p))), real["fsync_dir"](p)))
    real_rename, real_replace, real_fsync = os.rename, os.replace, os.fsync
    monkeypatch.setattr(os, "rename", lambda a, b: (events.append(("rename", str(a), str(b))), real_rename(a, b)))
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a), str(b))), real_replace(a, b)))
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fd", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd)))
    cp.publish(tmp_path, 1, written)
    renames = [i for i, e in enumerate(events) if e[0] in ("rename", "replace")]
    publish_at = next(i for i in renames if events[i][1] == str(written))
    synced = {e[1] for e in events[:publish_at] if e[0] in ("file", "dir")}
    assert files <= synced and dirs <= synced, "not every file / directory was fsynced before publishing"
    for i in renames:  # every rename made durable by an fsync of ROOT right after it
        assert events[i + 1] == ("dir", str(tmp_path)), events[i:i + 2]
    tracker_replace = next(i for i in renames if events[i][2] == str(tmp_path / cp.TRACKER))
    tracker_tmp = os.path.realpath(events[tracker_replace][1])  # fsynced (through its own descriptor) before the rename
    assert ("fd", tracker_tmp) in events[:tracker_replace] and ("fd", tracker_tmp) not in events[:publish_at]
    assert renames.index(tracker_replace) > renames.index(publish_at)  # tracker only after the directory


def test_leftovers_of_every_kind_are_repaired_and_nothing_else_is_touched(tmp_path):
    cp.publish(tmp_path, 1, _write(tmp_path, 1, "a"))
    cp.publish(tmp_path, 2, _write(tmp_path, 2, "b"))
    _write(tmp_path, 5, "half")  # iter_0000005.tmp: a save that never got published
    half_deleted = cp.trash_dir(tmp_path, 1)  # a prune that died mid-delete
    os.rename(cp.iteration_dir(tmp_path, 1), half_deleted)
    (half_deleted / "__0_0.distcp").unlink()
    os.rename(cp.iteration_dir(tmp_path, 2), cp.aside_dir(tmp_path, 2))  # a re-save that died mid-way
    (tmp_path / f".{cp.TRACKER}.tmp-4242").write_text("9\n")  # a tracker update that died
    foreign = ["iter_abc.tmp", "iter_0000001.tmpx", "notes.tmp", "iter_00000001.old", "keep.del", "critic"]
    for name in foreign:
        (tmp_path / name).mkdir()
    (tmp_path / "critic" / "iter_0000001.tmp").mkdir()  # another root's business
    assert _loaded(tmp_path) == (2, "b")  # read from iter_0000002.old
    removed = cp.remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == sorted(["iter_0000005.tmp", "iter_0000001.del",
                                                      f".{cp.TRACKER}.tmp-4242"])
    assert _names(tmp_path) == {cp.TRACKER, "iter_0000002", *foreign}
    assert (tmp_path / "critic" / "iter_0000001.tmp").is_dir()
    assert _loaded(tmp_path) == (2, "b") and cp.list_steps(tmp_path) == [2]
    # an .old beside its published step is garbage (the re-save finished): deleted, the step kept
    cp.publish(tmp_path, 2, _write(tmp_path, 2, "c"))
    cp.aside_dir(tmp_path, 2).mkdir()
    assert cp.remove_stale_temporaries(tmp_path) == [cp.aside_dir(tmp_path, 2)]
    assert _loaded(tmp_path) == (2, "c")


def test_prepare_temporary_dir_repairs_first(tmp_path):
    cp.publish(tmp_path, 1, _write(tmp_path, 1, "a"))
    os.rename(cp.iteration_dir(tmp_path, 1), cp.aside_dir(tmp_path, 1))
    _write(tmp_path, 7, "stale")
    cp.prepare_temporary_dir(tmp_path, 2)
    assert _names(tmp_path) == {cp.TRACKER, "iter_0000001", "iter_0000002.tmp"}


def test_keep_last_deletes_all_but_the_newest_and_never_the_trackers(tmp_path):
    for step in range(1, 6):
        cp.publish(tmp_path, step, _write(tmp_path, step, str(step)))
    assert cp.prune(tmp_path, 2) == [1, 2, 3]
    assert cp.list_steps(tmp_path) == [4, 5] and _names(tmp_path) == {cp.TRACKER, "iter_0000004", "iter_0000005"}
    cp.publish(tmp_path, 4, _write(tmp_path, 4, "4b"))  # the tracker now names an older step than the newest
    assert cp.prune(tmp_path, 1) == []
    assert cp.list_steps(tmp_path) == [4, 5] and _loaded(tmp_path) == (4, "4b")
    cp.publish(tmp_path, 6, _write(tmp_path, 6, "6"))
    assert cp.prune(tmp_path, 1) == [4, 5] and cp.list_steps(tmp_path) == [6] and _loaded(tmp_path) == (6, "6")
    assert cp.prune(tmp_path, 3) == []
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        cp.prune(tmp_path, 0)


def test_a_crash_mid_prune_never_leaves_a_half_deleted_step(tmp_path, monkeypatch):
    for step in (1, 2, 3):
        cp.publish(tmp_path, step, _write(tmp_path, step, str(step)))
    real_rmtree = cp.shutil.rmtree

    def dies_half_way(path, *args, **kwargs):  # deletes one file, then the process "dies"
        next(p for p in Path(path).rglob("*") if p.is_file()).unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(cp.shutil, "rmtree", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        cp.prune(tmp_path, 1)
    monkeypatch.setattr(cp.shutil, "rmtree", real_rmtree)
    assert cp.list_steps(tmp_path) == [2, 3]  # step 1 is no longer under its name, steps 2 and 3 intact
    for step in (2, 3):
        assert (cp.find_checkpoint(tmp_path, step)[1] / "__0_0.distcp").read_text() == str(step)
    assert cp.remove_stale_temporaries(tmp_path) == [cp.trash_dir(tmp_path, 1)]
    assert _names(tmp_path) == {cp.TRACKER, "iter_0000002", "iter_0000003"}


# ---------------------------------------------------------------- bad --load (issue 12: bad input)
def _init_for_training(load):
    from lean_rl.algorithms.config import AlgorithmConfig
    from lean_rl.backends.megatron.train_config import CheckpointConfig, TrainConfig
    from lean_rl.backends.megatron.trainer_init import initialize_for_training

    train = TrainConfig(checkpoint=CheckpointConfig(hf_checkpoint="/hf", load=str(load)))
    return initialize_for_training(None, train, build(AlgorithmConfig))  # fails before the group is touched


@pytest.mark.parametrize("tracker, message", [
    ("release\n", r"expected an iteration number, found 'release'"),
    ("\x00\x00garbage", r"expected an iteration number"),
    ("", r"expected an iteration number, found ''"),
    ("7\n", r"names step 7 but .*iter_0000007 is missing"),
])
def test_bad_load_tracker_names_the_flag_and_loads_nothing(tmp_path, tracker, message):
    from lean_rl.options import ConfigError

    published = cp.prepare_temporary_dir(tmp_path, 2)
    (published / cp.DCP_METADATA).write_text("")
    cp.publish(tmp_path, 2, published)
    (tmp_path / cp.TRACKER).write_text(tracker)
    with pytest.raises(ConfigError, match=rf"^--load {tmp_path}: .*{cp.TRACKER}.*{message}.*the checkpoint root is damaged"):
        _init_for_training(tmp_path)
    assert cp.list_steps(tmp_path) == [2]  # nothing removed or changed


def test_bad_load_that_is_a_file_names_the_flag(tmp_path):
    from lean_rl.options import ConfigError

    (tmp_path / "ckpt.pt").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"^--load .*ckpt\.pt: not a directory"):
        _init_for_training(tmp_path / "ckpt.pt")


def _stored(**shapes):
    import torch
    from torch.distributed.checkpoint.metadata import Metadata, TensorProperties, TensorStorageMetadata

    return Metadata(state_dict_metadata={k.replace("__", "."): TensorStorageMetadata(
        properties=TensorProperties(dtype=torch.float32), size=torch.Size(s), chunks=[]) for k, s in shapes.items()})


def _model(**shapes):
    import torch
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    return {k.replace("__", "."): ShardedTensor.from_rank_offsets(k.replace("__", "."), torch.zeros(s), replica_id=0)
            for k, s in shapes.items()}


EMB, QKV, OUT = "embedding__word_embeddings__weight", "decoder__layers__self_attention__linear_qkv__weight", \
    "output_layer__weight"


@pytest.mark.parametrize("checkpoint, message", [
    ({EMB: (512, 128), QKV: (2, 256, 128), OUT: (512, 128)},  # another hidden size
     r"decoder\.layers\.self_attention\.linear_qkv\.weight is \[2, 256, 128\] in the checkpoint, \[2, 128, 64\] in the model"),
    ({EMB: (512, 64), QKV: (4, 128, 64), OUT: (512, 64)},  # another number of layers
     r"linear_qkv\.weight is \[4, 128, 64\] in the checkpoint, \[2, 128, 64\]"),
    ({EMB: (256, 64), QKV: (2, 128, 64), OUT: (256, 64)},  # a smaller vocab
     r"embedding\.word_embeddings\.weight has 256 rows in the checkpoint, fewer than the vocab size 500"),
    ({EMB: (512, 64), OUT: (512, 64)},  # another layer spec / model family
     r"decoder\.layers\.self_attention\.linear_qkv\.weight is not in the checkpoint"),
])
def test_bad_load_checkpoint_of_another_model_says_it_does_not_match_the_architecture(checkpoint, message):
    from lean_rl.backends.megatron.model_checkpoint import ArchitectureMismatch, adapt_model_request

    model = _model(**{EMB: (512, 64), QKV: (2, 128, 64), OUT: (512, 64)})
    with pytest.raises(ArchitectureMismatch, match=r"^ckpt/iter_0000002: the checkpoint does not match --hf-checkpoint's "
                                                   rf"architecture \(another hidden size, vocab, layers or heads\?\): .*{message}"):
        adapt_model_request(model, _stored(**checkpoint), vocab_size=500, source="ckpt/iter_0000002")


def test_vocab_padding_of_another_tp_still_loads():
    from lean_rl.backends.megatron.model_checkpoint import adapt_model_request

    model = _model(**{EMB: (512, 64), QKV: (2, 128, 64), OUT: (512, 64)})
    adapted = adapt_model_request(model, _stored(**{EMB: (640, 64), QKV: (2, 128, 64), OUT: (640, 64)}), vocab_size=500)
    assert adapted["embedding.word_embeddings.weight"].allow_shape_mismatch
    assert not adapted["decoder.layers.self_attention.linear_qkv.weight"].allow_shape_mismatch
