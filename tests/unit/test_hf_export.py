"""--save-hf's background exports (hf_export.py) with the real converter in a child process: a
checkpoint's HF model appears whole in DIR/step_N (nothing partial beside it), and a failed export is
one line naming the step and the converter's error, with no DIR/step_N left behind."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from lean_rl.backends.megatron.train_config import CheckpointConfig
from lean_rl.convert.hf_to_megatron import convert_hf_to_megatron
from lean_rl.hf_export import HfExports
from lean_rl.options import ConfigError


def test_an_export_appears_whole_under_step_n(tiny_qwen2, tmp_path):
    convert_hf_to_megatron(tiny_qwen2, tmp_path / "ckpt", iteration=3)
    exports = HfExports(tmp_path / "hf", tmp_path / "ckpt")
    exports.start(3)
    assert exports.wait_all() == [] and exports.failures == []
    out = tmp_path / "hf" / "step_3"
    assert exports.written == [out]
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["step_3"]  # no partial dir, no log kept
    assert (out / "config.json").is_file()
    written = {k: v for f in out.glob("*.safetensors") for k, v in load_file(str(f)).items()}
    original = {k: v for f in tiny_qwen2.glob("*.safetensors") for k, v in load_file(str(f)).items()}
    assert written.keys() == original.keys()
    assert all(torch.equal(written[k].float(), original[k].float()) for k in original)


def test_a_failed_export_is_one_line_and_leaves_nothing(tiny_qwen2, tmp_path):
    convert_hf_to_megatron(tiny_qwen2, tmp_path / "ckpt", iteration=1)
    exports = HfExports(tmp_path / "hf", tmp_path / "ckpt")
    exports.start(2)  # no iteration 2 in the checkpoint
    failed = exports.wait_all()
    assert len(failed) == 1 and exports.failures == failed
    line = failed[0]
    assert line.startswith(f"--save-hf: step 2's HF model was not written to {tmp_path / 'hf' / 'step_2'}: "), line
    assert "\n" not in line and "iteration 2" in line, line  # the converter's own error, its last line
    assert not (tmp_path / "hf" / "step_2").exists()
    assert [p.name for p in (tmp_path / "hf").iterdir()] == [".step_2.log"]  # the converter's output, kept


def test_an_export_past_its_deadline_is_stopped_and_reported(tiny_qwen2, tmp_path):
    convert_hf_to_megatron(tiny_qwen2, tmp_path / "ckpt", iteration=1)
    exports = HfExports(tmp_path / "hf", tmp_path / "ckpt", deadline_s=0.0)
    exports.start(1)
    failed = exports.wait_all()
    assert len(failed) == 1 and failed[0].endswith("not done after 0s; stopped"), failed
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [".step_1.log"]  # nor a partial dir


def test_save_hf_needs_save():
    with pytest.raises(ConfigError, match=r"^--save-hf needs --save$"):
        CheckpointConfig(save_hf="/out/hf")
