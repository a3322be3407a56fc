"""A synthetic visual task: count the shapes of one colour and kind in a generated picture.

    python examples/vlm_shapes/shapes_task.py --out DIR [--n 64] [--seed 0] [--base64] [--question total]

writes DIR/images/NNNN.png and DIR/prompts.jsonl, one row per picture:
    {"prompt": "<image>How many red squares are in the picture? Answer with a number.",
     "images": ["/abs/DIR/images/0000.png"], "label": "2"}
read with `--multimodal-keys '{"image": "images"}' --apply-chat-template --label-key label`, and scored by
`--custom-rm-path shapes_task.shape_count_reward` (with examples/vlm_shapes on PYTHONPATH): 1 when the
first number of the response (digits or a word, zero..nine) is the count, else 0.
With --base64 the rows carry the PNG bytes themselves (no image files).
With --question total the question is "How many shapes are in the picture?" (1..6, every shape counts),
scored with graded credit by `--custom-rm-path shapes_task.shape_total_reward`: 1 for the count, 0.5 when one
off, else 0 (the example's learning run, README.md).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import random
import re
from pathlib import Path

COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 170, 60)}
KINDS = ("square", "circle")
SIZE = 112  # 112x112 pixels: 16 vision tokens on the tiny VLM (lean_rl/testing/tiny_vlm.py), a few on a real one
CELLS = 4  # a 4x4 grid of cells, at most one shape per cell: shapes never overlap
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def draw_scene(rng: random.Random):
    """A picture of 1..6 shapes, and the shapes as (colour, kind) pairs."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIZE, SIZE), "white")
    draw = ImageDraw.Draw(image)
    cell = SIZE // CELLS
    shapes = []
    for index in rng.sample(range(CELLS * CELLS), rng.randint(1, 6)):
        colour, kind = rng.choice(list(COLOURS)), rng.choice(KINDS)
        x, y = (index % CELLS) * cell + 3, (index // CELLS) * cell + 3
        box = [x, y, x + cell - 7, y + cell - 7]
        (draw.rectangle if kind == "square" else draw.ellipse)(box, fill=COLOURS[colour])
        shapes.append((colour, kind))
    return image, shapes


def question(rng: random.Random, shapes: list[tuple[str, str]]) -> tuple[str, int]:
    """Ask about a (colour, kind) in the picture half the time, else about any: counts 0 happen too."""
    colour, kind = rng.choice(shapes) if rng.random() < 0.5 else (rng.choice(list(COLOURS)), rng.choice(KINDS))
    text = f"How many {colour} {kind}s are in the picture? Answer with a number."
    return text, sum(1 for s in shapes if s == (colour, kind))


TOTAL_QUESTION = "How many shapes are in the picture? Answer with a number."
QUESTIONS = ("pair", "total")


def make_prompts(out: Path, n: int, seed: int, inline: bool = False, kind: str = "pair") -> Path:
    """`kind`: "pair" asks for one colour and kind (0..6), "total" for all the shapes (1..6)."""
    if kind not in QUESTIONS:
        raise ValueError(f"--question {kind!r}: choose one of {', '.join(QUESTIONS)}")
    out = out.resolve()
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        image, shapes = draw_scene(rng)
        text, count = question(rng, shapes) if kind == "pair" else (TOTAL_QUESTION, len(shapes))
        if inline:
            buf = io.BytesIO()
            image.save(buf, format="PNG")
            ref = base64.b64encode(buf.getvalue()).decode()
        else:
            path = out / "images" / f"{i:04d}.png"
            image.save(path)
            ref = str(path)
        rows.append({"prompt": "<image>" + text, "images": [ref], "label": str(count)})
    path = out / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def answer_number(response: str) -> int | None:
    """The first number in the response: digits, or a word zero..nine."""
    match = re.search(r"\d+|\b(" + "|".join(NUMBER_WORDS) + r")\b", response.lower())
    if match is None:
        return None
    return int(match.group()) if match.group().isdigit() else NUMBER_WORDS.index(match.group())


def score(response: str, label: str) -> float:
    return 1.0 if answer_number(response) == int(label) else 0.0


def graded_score(response: str, label: str) -> float:
    """1 for the count, 0.5 one off, else 0 (no number: 0): a policy that looks gets credit before it is exact."""
    answer = answer_number(response)
    if answer is None:
        return 0.0
    return {0: 1.0, 1: 0.5}.get(abs(answer - int(label)), 0.0)


async def shape_count_reward(cfg, sample) -> float:
    """--custom-rm-path: 1 when the response's first number is the count (the row's label), else 0."""
    return score(sample.response, sample.label)


async def shape_total_reward(cfg, sample) -> float:
    """--custom-rm-path for --question total rows: graded_score."""
    return graded_score(sample.response, sample.label)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base64", action="store_true", help="the PNG bytes in the rows, not files")
    parser.add_argument("--question", choices=QUESTIONS, default="pair",
                        help="pair: how many of one colour and kind; total: how many shapes")
    args = parser.parse_args(argv)
    print(make_prompts(args.out, args.n, args.seed, args.base64, args.question))


if __name__ == "__main__":
    main()
