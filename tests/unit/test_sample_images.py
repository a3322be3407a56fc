"""A Sample's image fields: checked, and kept bit for bit by the buffer's checkpoint state, the debug
rollout files and the sample dumps (all JSON)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from lean_rl.buffer.data_buffer import DataBuffer
from lean_rl.buffer.prompt_source import PromptRecord, PromptSource
from lean_rl.debug_rollout import load_debug_rollout, record_train_groups
from lean_rl.sample import Sample, Status

IMAGES = {"images": ["/data/a.png", "data:image/png;base64,iVBORw0KGgo="]}


def _train_inputs(seed=0):
    rng = np.random.default_rng(seed)
    grid = np.array([[1, 4, 6], [1, 8, 8]], dtype=np.int64)
    return {"pixel_values": rng.standard_normal((24 + 64, 1176)).astype(np.float32), "image_grid_thw": grid}


def _sample(**kw):
    s = Sample(index=3, group_index=1, prompt="<image>how many?", tokens=[1, 9, 9, 2],
               multimodal_inputs=json.loads(json.dumps(IMAGES)), multimodal_train_inputs=_train_inputs(), **kw)
    s.append_response([5, 6], "r", log_probs=[-0.5, -0.25], weight_versions=0)
    s.status, s.reward = Status.COMPLETED, 1.0
    return s


def _same(a: Sample, b: Sample):
    assert a.multimodal_inputs == b.multimodal_inputs
    for key, value in a.multimodal_train_inputs.items():
        other = b.multimodal_train_inputs[key]
        assert other.dtype == value.dtype and other.shape == value.shape and other.tobytes() == value.tobytes()
    assert {k: v for k, v in a.to_dict().items()} == {k: v for k, v in b.to_dict().items()}


def test_json_round_trip_is_bitwise_and_text_samples_are_unchanged():
    s = _sample()
    s.check()
    back = Sample.from_dict(json.loads(json.dumps(s.to_dict())))
    _same(s, back)
    text = Sample(index=0, group_index=0, prompt="p", tokens=[1])
    assert text.to_dict()["multimodal_inputs"] is None
    assert Sample.from_dict(text.to_dict()).multimodal_train_inputs is None


def test_bad_image_fields_are_one_line_naming_the_field():
    cases = [
        (dict(multimodal_inputs={"images": []}), "multimodal_inputs must be"),
        (dict(multimodal_inputs={"images": ["a"], "other": 1}), "unknown key"),
        (dict(multimodal_inputs=None, multimodal_train_inputs=_train_inputs()), "without multimodal_inputs"),
        (dict(multimodal_inputs=IMAGES, multimodal_train_inputs={"pixel_values": np.zeros((2, 3))}), "float32"),
        (dict(multimodal_inputs={"images": ["a"]}, multimodal_train_inputs=_train_inputs()),
         r"image_grid_thw \[2, 3\] for 1 images"),
    ]
    for fields, said in cases:
        s = Sample(index=7, group_index=0, prompt="p", tokens=[1], **fields)
        with pytest.raises(ValueError, match=f"sample 7: .*{said}") as err:
            s.check()
        assert "\n" not in str(err.value)
    data = _sample().to_dict()
    data["multimodal_train_inputs"]["pixel_values"]["base64"] = "!!"
    with pytest.raises(ValueError, match=r"sample 3: field 'multimodal_train_inputs'\['pixel_values'\]"):
        Sample.from_dict(data)
    data["multimodal_inputs"] = "a.png"
    with pytest.raises(ValueError, match="field 'multimodal_inputs' must be an object or null"):
        Sample.from_dict(data)


def test_reset_response_drops_the_images_later_turns_added():
    s = _sample()
    s.multimodal_inputs = {"images": ["/p.png", "/turn2.png"], "prompt_images": 1}
    s.multimodal_train_inputs = None
    s.reset_response()
    assert s.multimodal_inputs == {"images": ["/p.png"]} and s.tokens == [1, 9, 9, 2]
    s.check()


def test_buffer_checkpoint_state_keeps_images_and_train_inputs():
    records = [PromptRecord(row=i + 1, prompt="<image>q", tokens=(1, 9, 2), multimodal_inputs={"images": [f"/{i}.png"]})
               for i in range(2)]
    buf = DataBuffer(PromptSource(records, num_epochs=1), 2, None)
    ready, pending = buf.get_prompt_groups(2)
    assert [s.multimodal_inputs for s in ready] == [{"images": ["/0.png"]}] * 2
    ready[0].multimodal_inputs["images"].append("/mutated.png")  # samples do not share the record's dict
    assert ready[1].multimodal_inputs == {"images": ["/0.png"]}
    ready[0].multimodal_inputs = {"images": ["/0.png", "/1.png"]}
    for s in ready:
        s.multimodal_train_inputs = _train_inputs(s.index)
        s.append_response([5], "r", log_probs=[-1.0], weight_versions=0)
        s.status, s.reward = Status.COMPLETED, 0.0
    ready[1].multimodal_inputs = {"images": ["/0.png", "/1.png"]}
    buf.put_finished_groups([ready])
    state = json.loads(json.dumps(buf.state_dict()))  # the checkpoint writes it as JSON (extra_state.json)
    restored = DataBuffer(PromptSource(records, num_epochs=1), 2, None)
    restored.load_state_dict(state)
    for a, b in zip(ready, restored.get_train_groups(1)[0]):
        _same(a, b)
    assert [s.multimodal_inputs for s in restored.pending[0]] == [{"images": ["/1.png"]}] * 2


def test_debug_rollout_file_and_sample_dumps_keep_them(tmp_path):
    groups = [[_sample()]]
    run = SimpleNamespace(save_debug_rollout_data=str(tmp_path / "rollout_{rollout_id}.jsonl"),
                          dump_samples_interval=1, output_dir=str(tmp_path / "run"))
    record_train_groups(run, 4, groups)
    _same(groups[0][0], load_debug_rollout(run.save_debug_rollout_data, 4)[0][0])
    dumped = json.loads((tmp_path / "run" / "samples" / "step_000004.jsonl").read_text().splitlines()[0])
    _same(groups[0][0], Sample.from_dict(dumped))
