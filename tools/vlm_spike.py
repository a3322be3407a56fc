"""Spike (issue 44): can SGLang serve a tiny random Qwen2.5-VL on CPU, and do its log-probs match transformers'?

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python tools/vlm_spike.py --out /tmp/vlm_spike [--port 30111]

Steps: (1) build a random Qwen2_5_VLForConditionalGeneration from transformers' own config classes, with
lean_rl's locally trained BPE tokenizer plus Qwen's vision special tokens, and save it with a
Qwen2_5_VLProcessor (no hub access needed); (2) make one PNG with PIL and compute transformers' next-token
log-probs for an image prompt; (3) start SGLang through `python -m lean_rl.backends.sglang.launch` (CPU
patches) on the checkpoint, POST /generate with `image_data` (base64 PNG), and compare the first generated
token's top log-probs with transformers'. Prints one JSON line with the result; exits 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from lean_rl.testing.tiny_vlm import IMAGE_PROMPT  # the checkpoint the spike built lives there now

PROMPT = f"<|im_start|>user\n{IMAGE_PROMPT}how many red shapes?<|im_end|>\n<|im_start|>assistant\n"


def build_checkpoint(out: Path, seed: int = 0) -> Path:
    from lean_rl.testing.tiny_vlm import make_tiny_vlm

    return make_tiny_vlm(out, seed)


def make_png() -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (84, 56), "white")
    draw = ImageDraw.Draw(img)
    draw.rectangle([4, 4, 30, 30], fill="red")
    draw.ellipse([40, 10, 80, 50], fill="blue")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def hf_inputs(ckpt: Path, png: bytes) -> dict:
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(ckpt)
    return processor(text=[PROMPT], images=[Image.open(io.BytesIO(png)).convert("RGB")], return_tensors="pt")


def hf_inputs_pad_id(ckpt: Path) -> int:
    return int(json.loads((ckpt / "config.json").read_text())["image_token_id"])


def hf_logprobs(ckpt: Path, inputs: dict, generated: list[int]) -> tuple[dict[int, float], list[float]]:
    """transformers' top-5 next-token log-probs after the prompt, and the log-prob of each generated token
    (one forward over prompt + generated: checks SGLang's decode positions, M-RoPE deltas included)."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    n = inputs["input_ids"].shape[1]
    full = dict(inputs)
    full["input_ids"] = torch.cat([inputs["input_ids"], torch.tensor([generated])], dim=1)
    full["attention_mask"] = torch.ones_like(full["input_ids"])
    for key, value in inputs.items():  # per-token side inputs (mm_token_type_ids): text for generated tokens
        if key not in ("input_ids", "attention_mask") and value.dim() == 2 and value.shape == (1, n):
            full[key] = torch.cat([value, torch.zeros((1, len(generated)), dtype=value.dtype)], dim=1)
    with torch.no_grad():
        lp = torch.log_softmax(model(**full).logits[0].float(), -1)
    top = torch.topk(lp[n - 1], 5)
    gen_lp = [float(lp[n - 1 + i, t]) for i, t in enumerate(generated)]
    return {int(i): float(v) for v, i in zip(top.values, top.indices)}, gen_lp


def post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def serve_and_generate(ckpt: Path, bodies: list[dict], port: int, log: Path, timeout_s: float) -> list[dict]:
    cmd = [sys.executable, "-m", "lean_rl.backends.sglang.launch", "--model-path", str(ckpt), "--device", "cpu",
           "--attention-backend", "torch_native", "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port),
           "--max-total-tokens", "2048", "--sleep-on-idle", "--skip-server-warmup", "--enable-multimodal"]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=os.environ.copy())
    try:
        deadline = time.time() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"SGLang exited with {proc.returncode} before serving; see {log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise TimeoutError(f"SGLang not healthy after {timeout_s}s; see {log}")
            time.sleep(2)
        return [post(f"http://127.0.0.1:{port}/generate", body) for body in bodies]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--port", type=int, default=30111)
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--skip-server", action="store_true", help="only build and run transformers")
    args = ap.parse_args()
    ckpt = build_checkpoint(args.out / "ckpt")
    png = make_png()
    inputs = hf_inputs(ckpt, png)
    hf_ids = inputs["input_ids"][0].tolist()
    result: dict = {"hf_prompt_len": len(hf_ids)}
    if args.skip_server:
        result["hf_top5"] = hf_logprobs(ckpt, inputs, [])[0]
    else:
        common = {"image_data": base64.b64encode(png).decode(), "return_logprob": True, "top_logprobs_num": 5,
                  "sampling_params": {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True}}
        # (a) text: SGLang's own processor expands <|image_pad|>; (b) token ids, as an RL rollout sends them:
        # SGLang wants ONE <|image_pad|> per image and expands it itself (base_processor.py build_input_ids);
        # transformers' already expanded ids make the request hang (docs/vlm_spike.md), so collapse the run.
        pad = hf_inputs_pad_id(ckpt)
        collapsed = [t for i, t in enumerate(hf_ids) if not (t == pad and i > 0 and hf_ids[i - 1] == pad)]
        by_text, by_ids = serve_and_generate(ckpt, [{"text": PROMPT, **common}, {"input_ids": collapsed, **common}],
                                             args.port, args.out / "sglang.log", args.timeout_s)
        meta = by_text["meta_info"]
        generated = [int(t) for _, t, _ in meta["output_token_logprobs"]]
        hf_top, hf_gen = hf_logprobs(ckpt, inputs, generated)
        sg_top = {int(t): float(lp) for lp, t, _ in meta["output_top_logprobs"][0]}
        sg_gen = [float(lp) for lp, _, _ in meta["output_token_logprobs"]]
        ids_gen = [(int(t), float(lp)) for lp, t, _ in by_ids["meta_info"]["output_token_logprobs"]]
        result.update(
            sglang_prompt_tokens=meta.get("prompt_tokens"), ids_prompt_tokens=by_ids["meta_info"].get("prompt_tokens"),
            hf_top5=hf_top, sglang_top5=sg_top, generated=generated, hf_gen_logprobs=hf_gen, sglang_gen_logprobs=sg_gen,
            top5_max_abs_diff=max(abs(sg_top[t] - hf_top[t]) if t in sg_top else float("inf") for t in hf_top),
            gen_max_abs_diff=max(abs(a - b) for a, b in zip(sg_gen, hf_gen)),
            ids_same_tokens=[t for t, _ in ids_gen] == generated,
            ids_vs_text_max_abs_diff=max(abs(a[1] - b) for a, b in zip(ids_gen, sg_gen)),
        )
        diffs = [result["top5_max_abs_diff"], result["gen_max_abs_diff"], result["ids_vs_text_max_abs_diff"]]
        result["match_1e-4"] = max(diffs) <= 1e-4 and result["ids_same_tokens"]
    print(json.dumps(result))
    if result.get("match_1e-4") is False:
        sys.exit(1)


if __name__ == "__main__":
    main()
