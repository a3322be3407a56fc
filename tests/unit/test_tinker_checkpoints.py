"""lean_rl/tinker/checkpoints.py: save_state's paths and the checks load_state makes before any rank
reads a file."""

import pytest

from lean_rl.tinker.checkpoints import StateMeta, check_meta, parse_path, state_dir, tinker_path, write_meta
from lean_rl.tinker.futures import UserError

META = StateMeta(base_model="/models/m", lora_rank=8, ranks=2)


def test_a_tinker_path_names_its_directory(tmp_path):
    path = tinker_path("session-ab12:train:0", "final")
    assert path == "tinker://session-ab12:train:0/weights/final"
    assert parse_path(tmp_path, path) == tmp_path / "session-ab12:train:0" / "final"


@pytest.mark.parametrize("path", ["tinker://m/sampler_weights/x", "/tmp/x", "tinker://m/weights/../../etc",
                                  "tinker://../weights/x", "tinker://m/weights/"])
def test_other_paths_are_refused(tmp_path, path):
    with pytest.raises(UserError, match="path|state name|model_id"):
        parse_path(tmp_path, path)


def test_a_state_loads_only_complete_and_fitting(tmp_path):
    directory = state_dir(tmp_path, "m1", "s")
    directory.mkdir(parents=True)
    with pytest.raises(UserError, match="no such saved state"):
        check_meta(directory, "p", META)
    write_meta(directory, META)
    (directory / "rank0.pt").write_bytes(b"")
    with pytest.raises(UserError, match="lacks rank1.pt"):
        check_meta(directory, "p", META)
    (directory / "rank1.pt").write_bytes(b"")
    check_meta(directory, "p", META)
    with pytest.raises(UserError, match="saved with lora_rank 8, this server has 16"):
        check_meta(directory, "p", StateMeta("/models/m", 16, 2))
