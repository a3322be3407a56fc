"""The example's "pretrained" model: a short supervised warm start of the tiny random VLM, and its evaluation.

    python examples/vlm_shapes/warm_start.py --out DIR [--steps 120] [--seed 0]
    python examples/vlm_shapes/warm_start.py --evaluate CKPT --rows ROWS.jsonl [--shuffle-images]
    python examples/vlm_shapes/warm_start.py --rows ROWS.jsonl --write-shuffled OUT.jsonl

The random tiny Qwen2.5-VL (lean_rl/testing/tiny_vlm.py) never writes a number, so every reward is 0 and
GRPO has nothing to rank. A real run starts from a pretrained VLM that already answers in the right format and
roughly sees; this stands in for it: a few supervised steps (transformers, Adam, cross-entropy on the answer
tokens only) on `--question total` rows of their own seed, stopped early on purpose so that the model
answers in format but is often wrong. DIR/warm is then an HF checkpoint for `--hf-checkpoint`.

`--evaluate` answers each row greedily (transformers, up to 4 tokens) and prints the mean graded reward
(shapes_task.graded_score) and exact accuracy as one JSON line; with `--shuffle-images` each question gets
another row's image: a policy that reads the picture scores lower then, one that guesses from text does not.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import shapes_task

PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{text}<|im_end|>\n<|im_start|>assistant\n"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _question(row: dict) -> str:
    return row["prompt"].replace("<image>", "")


def _batch(processor, rows: list[dict], answers: list[str] | None):
    """Processor inputs for the rows' prompts (the chat the loop renders, image first), each followed by its
    answer and <|im_end|> when `answers` is given; labels cover only the answer tokens."""
    import torch
    from PIL import Image

    tok = processor.tokenizer
    out = {"input_ids": [], "mm": [], "labels": []}
    pixel_values, grids = [], []
    for i, row in enumerate(rows):
        enc = processor(text=[PROMPT.format(text=_question(row))], images=[Image.open(row["images"][0]).convert("RGB")],
                        return_tensors="pt")
        ids = enc["input_ids"][0].tolist()
        answer = tok.encode(answers[i], add_special_tokens=False) + [tok.eos_token_id] if answers else []
        out["input_ids"].append(ids + answer)
        out["mm"].append(enc["mm_token_type_ids"][0].tolist() + [0] * len(answer))
        out["labels"].append([-100] * len(ids) + answer)
        pixel_values.append(enc["pixel_values"])
        grids.append(enc["image_grid_thw"])
    width = max(len(x) for x in out["input_ids"])

    def pad(rows_: list[list[int]], value: int, left: bool) -> torch.Tensor:
        return torch.tensor([[value] * (width - len(r)) + r if left else r + [value] * (width - len(r)) for r in rows_])

    left = answers is None  # generation pads on the left
    return {"input_ids": pad(out["input_ids"], tok.pad_token_id, left),
            "attention_mask": pad([[1] * len(r) for r in out["input_ids"]], 0, left),
            "mm_token_type_ids": pad(out["mm"], 0, left), "labels": pad(out["labels"], -100, left),
            "pixel_values": torch.cat(pixel_values), "image_grid_thw": torch.cat(grids)}


def warm_start(out: Path, steps: int, seed: int, batch_size: int = 16, lr: float = 2e-3) -> Path:
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    from lean_rl.testing.tiny_vlm import make_tiny_vlm

    random_ckpt = make_tiny_vlm(out / "random", seed=seed)
    rows = _rows(shapes_task.make_prompts(out / "sft_data", 512, seed=seed + 1000, kind="total"))
    processor = AutoProcessor.from_pretrained(random_ckpt)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(random_ckpt, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    for step in range(steps):
        batch = rng.sample(rows, batch_size)
        inputs = _batch(processor, batch, [row["label"] for row in batch])
        loss = model(**inputs).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == steps - 1:
            print(json.dumps({"sft_step": step, "loss": round(loss.item(), 4)}), flush=True)
    model.eval()
    model.save_pretrained(out / "warm", safe_serialization=True)
    processor.save_pretrained(out / "warm")
    for name in ("generation_config.json",):
        (out / "warm" / name).write_text((random_ckpt / name).read_text())
    return out / "warm"


def shuffled(rows: list[dict], seed: int) -> list[dict]:
    """Each question with another row's picture (a rotation by a random shift: never its own)."""
    images = [row["images"] for row in rows]
    shift = random.Random(seed).randrange(1, len(rows))
    return [{**row, "images": images[(i + shift) % len(rows)]} for i, row in enumerate(rows)]


def evaluate(ckpt: Path, rows_path: Path, shuffle_images: bool = False, seed: int = 0, batch_size: int = 16) -> dict:
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    rows = shuffled(_rows(rows_path), seed) if shuffle_images else _rows(rows_path)
    processor = AutoProcessor.from_pretrained(ckpt)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    tok = processor.tokenizer
    rewards, exact = [], []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        inputs = _batch(processor, chunk, None)
        inputs.pop("labels")
        with torch.no_grad():
            generated = model.generate(**inputs, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
        for row, ids in zip(chunk, generated[:, inputs["input_ids"].shape[1]:]):
            text = tok.decode(ids, skip_special_tokens=True)
            rewards.append(shapes_task.graded_score(text, row["label"]))
            exact.append(shapes_task.score(text, row["label"]))
    return {"checkpoint": str(ckpt), "rows": len(rows), "shuffled_images": shuffle_images,
            "reward": sum(rewards) / len(rewards), "exact": sum(exact) / len(exact)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="writes OUT/random (the random tiny VLM) and OUT/warm")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--evaluate", type=Path, metavar="CKPT", help="evaluate this HF checkpoint instead")
    parser.add_argument("--rows", type=Path, help="with --evaluate: the rows (shapes_task.py --question total)")
    parser.add_argument("--shuffle-images", action="store_true", help="with --evaluate: another row's image")
    parser.add_argument("--write-shuffled", type=Path, metavar="OUT", help="write --rows with shuffled images to OUT")
    args = parser.parse_args(argv)
    if args.write_shuffled is not None:
        rows = shuffled(_rows(args.rows), args.seed)
        args.write_shuffled.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return
    if args.evaluate is not None:
        if args.rows is None:
            parser.error("--evaluate needs --rows")
        print(json.dumps(evaluate(args.evaluate, args.rows, args.shuffle_images, args.seed)))
    elif args.out is not None:
        print(warm_start(args.out, args.steps, args.seed))
    else:
        parser.error("give --out (warm start) or --evaluate CKPT --rows ROWS")


if __name__ == "__main__":
    main()
