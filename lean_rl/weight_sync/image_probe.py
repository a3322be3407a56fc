"""The weight-sync probe of a vision-language model: a prompt with an image, so that the vision tower's
weights are checked too (issue 44).

The text probe (probe.py) never reaches the tower: with no image in the prompt, a stale or garbled
tower on the engine scores exactly like the right one. This probe draws a fixed picture (PIL: two shapes
on white), renders it with the checkpoint's own processor and chat template, and appends a fixed text
continuation. The trainer scores the tokens after the image (MegatronGroup.compute_log_probs with the
image's pixel values); each engine scores the same tokens in one /generate with the image (SGLang takes
ONE pad per image and expands it: rollout/vision.py), so every scored token depends on the language model
and on the tower's output for the picture.

    probe = build_image_probe(model_path)           # None: the checkpoint has no image processor
    trainer = group.compute_log_probs([probe.token_ids], [probe.score_from], images=[probe.train_inputs])
    run_probe(trainer.log_probs[0], clients, probe.engine_ids, ..., score=score_image_probe, request=probe)
"""

from __future__ import annotations

from dataclasses import dataclass

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.image_prompt import collapse_image_pads
from lean_rl.backends.sglang.responses import ScoreResult, build_generate_payload, parse_score_response

QUESTION = "What is in the picture?"
CONTINUATION = " A red square on the left and a blue circle on the right, on white."
SIZE = (84, 56)  # 6x4 patches of 14 pixels: a few vision tokens on any Qwen-VL processor


@dataclass(frozen=True)
class ImageProbe:
    token_ids: list[int]  # the trainer's: the processor's expansion (one pad per vision token) + continuation
    engine_ids: list[int]  # the engine's: the same with the image's run of pads collapsed to one
    image_data: list[str]  # the picture as a PNG data URL
    image_token_id: int
    train_inputs: dict  # {"pixel_values", "image_grid_thw"} (numpy), as Sample.multimodal_train_inputs
    score_from: int  # index in token_ids of the first scored token: the first one after the image's pads

    @property
    def image_tokens(self) -> int:
        return self.token_ids.count(self.image_token_id)



def draw_probe_image():
    from PIL import Image, ImageDraw

    image = Image.new("RGB", SIZE, "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle([4, 4, 30, 30], fill=(220, 30, 30))
    draw.ellipse([44, 10, 80, 46], fill=(30, 60, 220))
    return image


def build_image_probe(model_path: str) -> ImageProbe:
    """The probe for the checkpoint at `model_path` (its processor and chat template)."""
    from lean_rl.buffer.images import image_data_uri, load_processor
    from lean_rl.rollout.vision import image_token_id, tokens_per_image, train_inputs

    processor = load_processor(model_path)
    image = draw_probe_image()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    rendered = processor(text=[text], images=[image], return_tensors="np")
    prompt = [int(t) for t in rendered["input_ids"][0]]
    continuation = processor.tokenizer.encode(CONTINUATION, add_special_tokens=False)
    pad = image_token_id(processor)
    inputs = train_inputs(processor, [image])
    token_ids = prompt + continuation
    engine_ids = collapse_image_pads(token_ids, pad, tokens_per_image(processor, inputs["image_grid_thw"]))
    last_pad = max(i for i, t in enumerate(token_ids) if t == pad)
    return ImageProbe(token_ids=token_ids, engine_ids=engine_ids, image_data=[image_data_uri(image)],
                      image_token_id=pad, train_inputs=inputs, score_from=last_pad + 1)


def build_image_score_payload(probe: ImageProbe, adapter: str | None = None) -> dict:
    """One forward with the image, returning the log-probs of token_ids[score_from:]. SGLang counts
    logprob_start_len in the expanded ids (measured on 0.5.23: one pad sent, the image's run of pads
    reported), so the start is the trainer's index, not the index in engine_ids."""
    payload = build_generate_payload(probe.engine_ids, {"max_new_tokens": 1, "temperature": 0.0}, adapter=adapter,
                                     image_data=probe.image_data, image_token_id=probe.image_token_id)
    payload["return_logprob"] = True
    payload["logprob_start_len"] = probe.score_from - 1
    return payload


def parse_image_score(body: object, probe: ImageProbe) -> ScoreResult:
    """The scored tokens' log-probs from SGLang's answer: its input_token_logprobs are those of
    token_ids[score_from - 1:] (the first, the image's last pad, has no use); the checks of any scored
    answer (ids, nulls, meta_info) are parse_score_response's, the count is named as the image's here."""
    expected = probe.token_ids[probe.score_from - 1:]
    meta = body.get("meta_info") if isinstance(body, dict) else None
    entries = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
    if isinstance(entries, list) and len(entries) != len(expected):
        raise ValueError(f"expected {len(expected)} input_token_logprobs after the image, got {len(entries)}")
    return parse_score_response(body, expected)


async def score_image_probe(client: EngineClient, probe: ImageProbe, *, timeout_s: float | None = None) -> ScoreResult:
    """EngineClient.score's counterpart for the image probe (submit_all calls it with the client first)."""
    from lean_rl.backends.sglang.client import _json_body
    from lean_rl.backends.sglang.client_errors import EngineError

    response = await client.request("POST", "/generate", build_image_score_payload(probe, client.adapter),
                                    timeout_s=timeout_s)
    try:
        return parse_image_score(_json_body(response), probe)
    except ValueError as exc:
        raise EngineError(client.base_url, "/generate", f"unexpected image probe response: {exc}") from exc

