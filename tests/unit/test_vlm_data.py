"""Image rows (--multimodal-keys): reading images, rendering with the HF processor, the errors, the
token-exact collapse SGLang takes and the client-side guard against its hang, the shapes task."""

import base64
import io
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lean_rl.backends.sglang.image_prompt import collapse_image_pads
from lean_rl.backends.sglang.responses import build_generate_payload
from lean_rl.buffer.config import DataConfig
from lean_rl.buffer.images import check_multimodal_keys, load_image
from lean_rl.buffer.prompt_source import BadRowError, load_prompts
from lean_rl.options import ConfigError
from lean_rl.rollout.vision import image_token_id, tokens_per_image, train_inputs
from lean_rl.testing.tiny_vlm import build_processor

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "vlm_shapes"))
import shapes_task  # noqa: E402

KEYS = '{"image": "images"}'


@pytest.fixture(scope="module")
def processor():
    return build_processor()


def _png(tmp_path: Path, name: str, size=(84, 56), colour="red") -> Path:
    path = tmp_path / name
    Image.new("RGB", size, colour).save(path)
    return path


def _rows(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _data(path: Path, **kw) -> DataConfig:
    return DataConfig(**{"prompt_data": str(path), "multimodal_keys": KEYS, "apply_chat_template": True,
                         "label_key": None, **kw})


def test_multimodal_keys_as_slime_gives_them_and_what_is_refused():
    assert check_multimodal_keys(KEYS) == KEYS and check_multimodal_keys(None) is None
    for bad, said in [("{image: x}", "not JSON"), ('["images"]', "JSON object"), ('{"video": "v"}', "'video'"),
                      ('{"image": ""}', "JSON object")]:
        with pytest.raises(ConfigError, match=f"--multimodal-keys.*{said}"):
            check_multimodal_keys(bad)


def test_images_as_path_file_url_data_url_and_base64_are_the_same_pixels(tmp_path):
    path = _png(tmp_path, "a.png")
    raw = path.read_bytes()
    b64 = base64.b64encode(raw).decode()
    images = [load_image(str(path)), load_image(path.as_uri()), load_image("data:image/png;base64," + b64),
              load_image(b64)]
    assert all(np.array_equal(np.asarray(images[0]), np.asarray(i)) for i in images[1:])
    rgba = tmp_path / "b.png"
    Image.new("RGBA", (60, 60), (0, 0, 255, 128)).save(rgba)
    assert load_image(str(rgba)).mode == "RGB"


def test_rows_render_with_the_processor_expansion(tmp_path, processor):
    a, b = _png(tmp_path, "a.png"), _png(tmp_path, "b.png", size=(112, 112), colour="blue")
    path = _rows(tmp_path / "p.jsonl", [
        {"prompt": "<image>how many?", "images": [str(a)], "label": "1"},
        {"prompt": "no placeholder: images go first", "images": str(b), "label": "0"},
        {"prompt": [{"role": "user", "content": "left <image> right <image>"}], "images": [str(a), b.as_uri()],
         "label": "2"},
    ])
    records, _ = load_prompts(path, _data(path), None, processor=processor)
    pad = image_token_id(processor)
    runs = [[n for n in _runs(r.tokens, pad)] for r in records]
    assert runs == [[6], [16], [6, 16]]  # 84x56 -> grid 1x4x6 -> 6 tokens; 112x112 -> 16
    assert records[2].multimodal_inputs == {"images": [str(a), b.as_uri()]}
    text = processor.tokenizer.decode(records[0].tokens)
    assert text.startswith("<|im_start|>user\n<|vision_start|><|image_pad|>") and "how many?" in text
    expected = processor(text=[processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "how many?"}]}],
        tokenize=False, add_generation_prompt=True)], images=[Image.open(a).convert("RGB")])["input_ids"][0]
    assert list(records[0].tokens) == [int(t) for t in expected]


def _runs(tokens, pad):
    run = 0
    for t in list(tokens) + [None]:
        if t == pad:
            run += 1
        elif run:
            yield run
            run = 0


def test_a_bad_image_is_one_line_naming_the_row_and_key(tmp_path, processor):
    good, broken = _png(tmp_path, "a.png"), tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    cases = [({"prompt": "<image>x", "images": [str(tmp_path / "missing.png")]}, "image 0: .*no such file"),
             ({"prompt": "<image>x", "images": [str(broken)]}, "image 0: .*broken.png"),
             ({"prompt": "<image>x", "images": ["http://example.com/a.png"]}, "only local images"),
             ({"prompt": "<image>x", "images": []}, "non-empty list"),
             ({"prompt": "<image>x"}, "missing key 'images'"),
             ({"prompt": "<image><image>x", "images": [str(good)]}, "2 <image> but 'images'.*holds 1")]
    for row, said in cases:
        path = _rows(tmp_path / "p.jsonl", [{"prompt": "<image>ok", "images": [str(good)]}, row])
        with pytest.raises(BadRowError, match=f"p.jsonl:2: .*{said}") as err:
            load_prompts(path, _data(path), None, processor=processor)
        assert "\n" not in str(err.value) and str(err.value).startswith("--prompt-data: ")
    records, skipped = load_prompts(path, _data(path, skip_bad_rows=True), None, processor=processor)
    assert len(records) == 1 and skipped["bad_row"] == 1
    with pytest.raises(ValueError, match="--apply-chat-template"):
        load_prompts(path, DataConfig(prompt_data=str(path), multimodal_keys=KEYS), None, processor=processor)


def test_collapse_is_token_exact_and_the_hang_is_refused_client_side(tmp_path, processor):
    images = [Image.open(_png(tmp_path, "a.png")), Image.open(_png(tmp_path, "b.png", size=(112, 112)))]
    train = train_inputs(processor, [i.convert("RGB") for i in images])
    assert train["pixel_values"].dtype == np.float32 and train["image_grid_thw"].tolist() == [[1, 4, 6], [1, 8, 8]]
    counts = tokens_per_image(processor, train["image_grid_thw"])
    assert counts == [6, 16]
    pad = image_token_id(processor)
    tokens = [1, pad] + [pad] * 5 + [2, 3, pad] + [pad] * 15 + [4]
    assert collapse_image_pads(tokens, pad, counts) == [1, pad, 2, 3, pad, 4]
    with pytest.raises(ValueError, match=r"runs of \[6, 15\].*\[6, 16\]"):
        collapse_image_pads(tokens[:-2] + [4], pad, counts)
    with pytest.raises(ValueError, match="2 image\\(s\\) but 22 image pad token"):  # the expansion sent as it is
        build_generate_payload(tokens, {}, image_data=["x", "y"], image_token_id=pad)
    payload = build_generate_payload([1, pad, 2, pad], {}, image_data=["x", "y"], image_token_id=pad)
    assert payload["image_data"] == ["x", "y"] and "image_data" not in build_generate_payload([1], {})


def test_shapes_task_data_and_reward(tmp_path, processor):
    rng = random.Random(0)
    image, shapes = shapes_task.draw_scene(rng)
    pixels = np.asarray(image)
    red_pixels = ((pixels[..., 0] > 200) & (pixels[..., 1] < 60)).sum()
    assert (red_pixels > 0) == any(colour == "red" for colour, _ in shapes)
    path = shapes_task.make_prompts(tmp_path / "shapes", 6, seed=1)
    inline = shapes_task.make_prompts(tmp_path / "inline", 6, seed=1, inline=True)
    a, _ = load_prompts(path, _data(path, label_key="label"), None, processor=processor)
    b, _ = load_prompts(inline, _data(inline, label_key="label"), None, processor=processor)
    assert [r.tokens for r in a] == [r.tokens for r in b] and [r.label for r in a] == [r.label for r in b]
    assert all(0 <= int(r.label) <= 6 for r in a)
    assert shapes_task.score("There are 2 red squares", "2") == 1.0
    assert shapes_task.score("two", "2") == 1.0 and shapes_task.score("3 or 2", "2") == 0.0
    assert shapes_task.score("none", "0") == 0.0 and shapes_task.score("", "1") == 0.0
    # --question total (the learning run): every shape counts, graded credit
    total = [json.loads(line) for line in shapes_task.make_prompts(tmp_path / "t", 8, 1, kind="total").read_text()
             .splitlines()]
    assert all(r["prompt"] == "<image>" + shapes_task.TOTAL_QUESTION and 1 <= int(r["label"]) <= 6 for r in total)
    assert [shapes_task.graded_score(x, "3") for x in ("3", "4.", "two", "5", "", "none")] == [1, 0.5, 0.5, 0, 0, 0]
    with pytest.raises(ValueError, match="--question 'colour'"):
        shapes_task.make_prompts(tmp_path / "x", 1, 0, kind="colour")


def test_the_teacher_and_the_reward_model_refuse_image_samples():
    """Both read token ids only: an image sample's pads would be read as text, so they refuse it."""
    import asyncio

    from lean_rl.rollout.distillation import score_with_teacher
    from lean_rl.rollout.reward_model import classify_body
    from lean_rl.sample import Sample

    s = Sample(index=0, group_index=0, prompt="<image>q", tokens=[1, 2], multimodal_inputs={"images": ["/a.png"]})
    s.append_response([3], "r", log_probs=[-1.0], weight_versions=0)
    with pytest.raises(ValueError, match="reward model .* not images"):
        classify_body(s, same_tokenizer=True)
    with pytest.raises(ValueError, match="--use-opd: the teacher scores token ids only"):
        asyncio.run(score_with_teacher(None, [s]))
