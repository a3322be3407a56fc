"""Image prompts through the real engine: SGLang 0.5.23 on CPU behind sglang-router serves the tiny random
Qwen2.5-VL (lean_rl/testing/tiny_vlm.py); the default rollout reads the shapes task's image rows
(--multimodal-keys), sends each /generate the images, and the samples it records are checked against
transformers: the prompt tokens are the processor's expansion, the pixel values the processor's, and
the engine's log-probs of the response match a transformers forward over Sample.tokens with those
pixels (<= 1e-4 fp32), which only holds when the engine expanded the images exactly where the sample's
tokens say. A second turn adds an image and keeps the first. Slow: its own engine (~1-2 min here)."""

import asyncio
import base64
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.engines import EngineGroup
from lean_rl.buffer.data_buffer import create_data_buffer
from lean_rl.buffer.images import load_image, load_processor
from lean_rl.config import parse_config
from lean_rl.extensions import install as install_hooks
from lean_rl.rollout.default import generate, generate_rollout
from lean_rl.rollout.vision import append_image_turn, image_token_id
from lean_rl.sample import Status
from lean_rl.testing.sglang_engines import engine_config_for_tests
from lean_rl.testing.tiny_vlm import IMAGE_PROMPT, make_tiny_vlm

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHAPES = Path(__file__).resolve().parents[2] / "examples" / "vlm_shapes"


@pytest.fixture(scope="module")
def vlm(tmp_path_factory, ray_cluster):
    root = tmp_path_factory.mktemp("vlm")
    ckpt = make_tiny_vlm(root / "ckpt")
    sys.path.insert(0, str(SHAPES))
    import shapes_task

    prompts = shapes_task.make_prompts(root / "shapes", 4, seed=0)
    config = engine_config_for_tests(ckpt, "--rollout-num-engines", "1", "--sglang-enable-multimodal")
    with EngineGroup(config, root / "engines") as group:
        yield group, prompts
    sys.path.remove(str(SHAPES))


def _hf_log_probs(ckpt: str, sample) -> np.ndarray:
    """transformers' log p(token | before) for every token of the sample after the first, with its images."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    ids = torch.tensor([sample.tokens])
    pad = image_token_id(load_processor(ckpt))
    train = sample.multimodal_train_inputs
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                       mm_token_type_ids=(ids == pad).long(), pixel_values=torch.from_numpy(train["pixel_values"]),
                       image_grid_thw=torch.from_numpy(train["image_grid_thw"])).logits[0]
    lp = torch.log_softmax(logits.float(), -1)
    return lp[:-1].gather(1, ids[0, 1:, None])[:, 0].numpy()


def _response_diff(ckpt: str, sample, last: int | None = None) -> float:
    hf = _hf_log_probs(ckpt, sample)[sample.prompt_length - 1:]
    trained = [i for i, m in enumerate(sample.loss_mask) if m][-last if last else 0:]
    return float(np.max(np.abs(hf[trained] - np.asarray(sample.rollout_log_probs)[trained])))


def test_rollout_sends_images_and_records_what_the_engine_saw(vlm, tiny_qwen2):
    group, prompts = vlm
    ckpt = group.config.model_path
    # parse_config derives the trainer's Megatron architecture from --hf-checkpoint, which knows no
    # qwen2_5_vl yet (the training side, branch vlm-train): the flags are parsed against the tiny text
    # model and the engines (whose model_path the rollout, buffer and processor use) are the VLM's.
    cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(prompts), "--multimodal-keys",
                        '{"image": "images"}', "--apply-chat-template", "--rollout-batch-size", "2",
                        "--n-samples-per-prompt", "2", "--rollout-max-response-len", "6",
                        "--custom-rm-path", "shapes_task.shape_count_reward"])
    cfg = dataclasses.replace(cfg, engines=group.config)
    install_hooks(cfg)
    buffer = create_data_buffer(cfg)
    asyncio.run(generate_rollout(cfg, 0, buffer))
    samples = [s for g in buffer.get_train_groups(10) for s in g]
    assert len(samples) == 4
    processor = load_processor(ckpt)
    for s in samples:
        s.check()
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and s.reward in (0.0, 1.0), s.metadata
        image = load_image(s.multimodal_inputs["images"][0])
        text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                              "text": s.prompt.replace("<image>", "")}]}],
                                             tokenize=False, add_generation_prompt=True)
        expected = processor(text=[text], images=[image], return_tensors="np")
        assert s.tokens[:s.prompt_length] == expected["input_ids"][0].tolist()  # the processor's expansion
        assert np.array_equal(s.multimodal_train_inputs["pixel_values"], expected["pixel_values"])
        assert s.multimodal_train_inputs["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
    diff = _response_diff(ckpt, samples[0])
    print(f"\nengine vs transformers, response log-probs: max abs diff {diff:.2e}")
    assert diff <= 1e-4

    # a second turn shows another image; the request carries both, and the log-probs still match
    sample = samples[0]
    second = buffer.source.records[1].multimodal_inputs["images"][0]
    append_image_turn(ckpt, sample, f"<|im_end|>\n<|im_start|>user\n{IMAGE_PROMPT}and here?<|im_end|>\n"
                                    "<|im_start|>assistant\n", [second])
    before = sample.response_length
    sample = asyncio.run(generate(cfg, sample, {"max_new_tokens": before + 4, "temperature": 1.0}))
    assert sample.response_length == before + 4 and len(sample.multimodal_inputs["images"]) == 2
    assert sample.multimodal_train_inputs["image_grid_thw"].shape == (2, 3)
    diff2 = _response_diff(ckpt, sample, last=4)
    print(f"second turn (2 images): max abs diff {diff2:.2e}")
    assert diff2 <= 1e-4


def test_expanded_pads_are_refused_before_they_reach_the_engine(vlm):
    """SGLang never answers a request whose ids hold the expansion (docs/vlm_spike.md): refused at once."""
    group, _ = vlm
    processor = load_processor(group.config.model_path)
    pad = image_token_id(processor)
    client = EngineClient(group.engine_urls[0], timeout_s=30, api_key=group.config.api_key)
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"1 image\(s\) but 6 image pad token"):
        asyncio.run(client.generate([1] + [pad] * 6 + [2], {"max_new_tokens": 2}, image_data=["data:,"],
                                    image_token_id=pad))
    assert time.monotonic() - started < 5


def _hf_scored(model, token_ids: list[int], score_from: int, images: dict | None, pad: int) -> torch.Tensor:
    """transformers' log p of token_ids[score_from:], with the probe's image when given."""
    ids = torch.tensor([token_ids])
    extra = {} if images is None else {"pixel_values": torch.from_numpy(images["pixel_values"]),
                                       "image_grid_thw": torch.from_numpy(images["image_grid_thw"])}
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=(ids == pad).long(),
                       **extra).logits[0]
    lp = torch.log_softmax(logits.float(), -1)[:-1].gather(1, ids[0, 1:, None])[:, 0]
    return lp[score_from - 1:]


def test_the_image_probe_sees_the_vision_tower_the_text_probe_does_not(vlm, tmp_path):
    """The weight-sync probe of a VLM (weight_sync/image_probe.py) against the real engine: with the
    engine's weights on the trainer's side (transformers here) it passes; with the trainer's tower moved
    and the engine's not (a sync that left out visual.*) it fails, where the text probe still passes.
    Then the engine loads the moved tower: the probe passes again, which needs the engine to embed the
    probe's picture (seen before the update) with the new tower (backends/sglang/vlm_cache.py)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    from lean_rl.backends.sglang.blocking_client import BlockingEngineClient
    from lean_rl.weight_sync.image_probe import build_image_probe
    from lean_rl.weight_sync.probe import probe_token_ids, run_probe

    group, _ = vlm
    ckpt = group.config.model_path
    probe = build_image_probe(ckpt)
    text_ids = probe_token_ids(ckpt)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    pad = probe.image_token_id
    with BlockingEngineClient(group.engine_urls[0], timeout_s=60, api_key=group.config.api_key) as client:
        def probes() -> tuple:
            image = run_probe(_hf_scored(model, probe.token_ids, probe.score_from, probe.train_inputs, pad), [client],
                              [], "default", 1e-4, 60, image_probe=probe)
            text = run_probe(_hf_scored(model, text_ids, 1, None, pad), [client], text_ids, "default", 1e-4, 60)
            return image, text

        image, text = probes()
        print(f"same weights: image probe {image.max_abs_diff:.1e} over {image.num_tokens} tokens, "
              f"text probe {text.max_abs_diff:.1e}")
        assert image.image_tokens == probe.image_tokens == 6 and image.num_tokens >= 10
        assert image.max_abs_diff < 1e-4 and text.max_abs_diff < 1e-4
        torch.manual_seed(0)
        with torch.no_grad():  # the trainer's tower moves; the engine keeps the checkpoint's
            for param in model.model.visual.parameters():
                param.add_(0.05 * torch.randn_like(param))
        image, text = probes()
        print(f"tower moved on the trainer only: image probe {image.max_abs_diff:.1e}, text probe "
              f"{text.max_abs_diff:.1e}")
        assert not image.within(image.engines[0]) and image.max_abs_diff > 1e-3
        assert text.max_abs_diff < 1e-4  # blind to the tower
        model.save_pretrained(tmp_path / "moved", safe_serialization=True)
        try:
            client.update_weights_from_disk(str(tmp_path / "moved"))
            image, _ = probes()
            print(f"engine loaded the moved tower: image probe {image.max_abs_diff:.1e}")
            assert image.max_abs_diff < 1e-4  # not the old tower's cached embedding of the same picture
        finally:
            client.update_weights_from_disk(ckpt)  # the module's engine serves the checkpoint again


def test_an_agent_sends_images_through_the_capture_endpoint(vlm, tiny_qwen2):
    """An OpenAI-client agent sends image_url parts (a data: URL, then a local path in a second turn) to the
    capture endpoint: one Sample, its prompt the processor's expansion, the second turn's prompt the first
    turn's ids + the new ones, the images and the processor's train inputs recorded as for a
    --multimodal-keys row, and the engine's log-probs of both answers = transformers' over Sample.tokens
    with those pixels (which holds only if the engine saw exactly those tokens and images)."""
    import json

    import openai

    from lean_rl.rollout.openai_capture import CaptureSession, stop_capture_servers
    from lean_rl.sample import Sample

    group, prompts = vlm
    ckpt = group.config.model_path
    # the response budget holds the second turn's context too, its picture's 16 tokens included
    cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(prompts),
                        "--rollout-max-response-len", "64", "--rollout-temperature", "1.0"])
    cfg = dataclasses.replace(cfg, engines=group.config)
    install_hooks(cfg)
    paths = [json.loads(line)["images"][0] for line in Path(prompts).read_text().splitlines()[:2]]
    data_url = "data:image/png;base64," + base64.b64encode(Path(paths[0]).read_bytes()).decode()
    first_turn = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url}},
                                               {"type": "text", "text": "How many shapes?"}]}]

    async def scenario():
        try:
            async with CaptureSession(cfg, Sample(index=0, group_index=0, prompt="p", tokens=[1]),
                                      cfg.rollout.sampling.to_sglang()) as session:
                client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
                first = await client.chat.completions.create(model="policy", messages=first_turn, max_tokens=5)
                second_turn = first_turn + [first.choices[0].message, {"role": "user", "content": [
                    {"type": "text", "text": "and here?"}, {"type": "image_url", "image_url": {"url": paths[1]}}]}]
                await client.chat.completions.create(model="policy", messages=second_turn, max_tokens=5)
                with pytest.raises(openai.BadRequestError) as bad:
                    await client.chat.completions.create(model="policy", max_tokens=5, messages=[
                        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "/nope/x.png"}}]}])
            return session, str(bad.value)
        finally:
            await stop_capture_servers()

    session, bad = asyncio.run(scenario())
    assert "messages[0].content[0].image_url.url: '/nope/x.png': no such file" in bad
    [sample] = session.samples()
    sample.check()
    calls = sample.metadata["capture_calls"]
    assert len(calls) == 2 and sample.status in (Status.COMPLETED, Status.TRUNCATED), json.dumps(sample.metadata, default=str)
    assert sample.multimodal_inputs == {"images": [data_url, paths[1]], "prompt_images": 1}
    processor = load_processor(ckpt)
    images = [load_image(data_url), load_image(paths[1])]
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                          "text": "How many shapes?"}]}], tokenize=False, add_generation_prompt=True)
    assert sample.tokens[:sample.prompt_length] == processor(text=[text], images=images[:1],
                                                             return_tensors="np")["input_ids"][0].tolist()
    expected = processor.image_processor(images=images, return_tensors="np")
    assert np.array_equal(sample.multimodal_train_inputs["pixel_values"], expected["pixel_values"])
    assert sample.multimodal_train_inputs["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
    # the engine expanded each call's prompt to as many tokens as the recorded ids hold
    assert [c["engine_prompt_tokens"] for c in calls] == [c["prompt_tokens"] for c in calls]
    assert calls[1]["prompt_tokens"] == calls[0]["prompt_tokens"] + calls[0]["completion_tokens"] + \
        calls[1]["context_tokens"]  # the second prompt: the first call's ids + the new ones
    assert sample.loss_mask == [1] * calls[0]["completion_tokens"] + [0] * calls[1]["context_tokens"] + \
        [1] * calls[1]["completion_tokens"]
    diff = _response_diff(ckpt, sample)
    print(f"\ncapture endpoint, 2 turns with images: engine vs transformers max abs diff {diff:.2e} over "
          f"{sum(sample.loss_mask)} sampled tokens, {len(sample.tokens)} tokens")
    assert diff <= 1e-4
