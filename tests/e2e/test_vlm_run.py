"""A vision-language model in the loop as a user runs it (issue 44): `python -m lean_rl.train` on the tiny
random Qwen2.5-VL (lean_rl/testing/tiny_vlm.py) with the shapes task's image rows (examples/vlm_shapes,
--multimodal-keys, --apply-chat-template). SGLang (CPU) generates from the images, the Megatron actor
(GPTModel + the HF vision tower) scores and trains on the same images, the weights (tower included) sync
to the engine, and --save-hf writes the trained model as an HF checkpoint. The reward is the toy task's
(fraction of letter tokens): the random model never counts shapes, and a constant reward gives no gradient.

Checked: finite loss and a gradient every step; the engine's and the trainer's log-probs of the sampled
tokens agree (train/rollout_logprob_abs_diff, the image tokens in context) at step 0 and after a sync
(step 1); the weight-sync probe scores a prompt with an image (weight_sync/image_probe.py: 6 vision tokens)
and passes after every sync; the saved HF model's tower moved from the checkpoint's, or with --freeze-vision-tower did not
(its language model moved in both); the frozen run is colocated. The lora_adapter run (slow) trains LoRA
adapters on the language model only, the engine serving them beside its base (--lora-sync adapter: each
sync ~45 kB), the probe and the engine-trainer agreement as above, the saved (merged) tower unchanged. ~2.5 min per run on 2 cores: the
tower_trains run is the default suite's one VLM end-to-end test, the frozen one is slow."""

import json
import math
import sys
from pathlib import Path

import pytest
from conftest import REPO, read_metrics, run_lean_rl

from lean_rl.testing.tiny_vlm import make_tiny_vlm

pytestmark = pytest.mark.e2e

SHAPES = REPO / "examples" / "vlm_shapes"


def _max_change(before: Path, after: Path, prefix: str) -> float:
    from safetensors.torch import load_file

    a, b = load_file(str(before / "model.safetensors")), load_file(str(after / "model.safetensors"))
    assert set(a) == set(b), set(a) ^ set(b)
    names = [n for n in a if n.startswith(prefix)]
    assert names, prefix
    return max(float((a[n] - b[n]).abs().max()) for n in names)


# the default suite's VLM run is the one whose tower trains (its probe covers the tower's sync); the frozen
# run is also colocated (weight sync by tensor payload instead of the gloo group with the engine): slow
# LoRA on the language model (the tower frozen): the engine serves the base with the adapter loaded apart
# (--lora-sync adapter), each sync sends A and B only; --save-hf writes the merged model: slow
@pytest.mark.parametrize("mode", [pytest.param("tower_trains", id="tower_trains"),
                                  pytest.param("frozen", id="tower_frozen_colocated", marks=pytest.mark.slow),
                                  pytest.param("lora", id="lora_adapter", marks=pytest.mark.slow)])
def test_vlm_trains_on_images_and_syncs(mode, tmp_path):
    ckpt = make_tiny_vlm(tmp_path / "ckpt")
    sys.path.insert(0, str(SHAPES))
    try:
        import shapes_task
    finally:
        sys.path.remove(str(SHAPES))
    prompts = shapes_task.make_prompts(tmp_path / "shapes", 16, seed=0)
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    data = tmp_path / "letters.jsonl"  # the shapes' images and questions, the toy reward's label
    data.write_text("".join(json.dumps({**row, "label": "letters"}) + "\n" for row in rows))
    hf_out = tmp_path / "hf"
    flags = ["--hf-checkpoint", str(ckpt), "--output-dir", str(tmp_path / "run"), "--no-tensorboard",
             "--prompt-data", str(data), "--multimodal-keys", '{"image": "images"}', "--apply-chat-template",
             "--sglang-enable-multimodal", "--custom-rm-path", "lean_rl.testing.toy_task.kind_fraction_reward",
             "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8",
             "--advantage-estimator", "grpo", "--lr", "1e-3", "--micro-batch-size", "8",
             "--rollout-num-engines", "1", "--sglang-max-total-tokens", "8192", "--num-rollout", "2",
             "--save", str(tmp_path / "save"), "--save-interval", "2", "--save-hf", str(hf_out),
             *{"tower_trains": [], "frozen": ["--freeze-vision-tower", "--colocate"],
               "lora": ["--lora-rank", "4", "--lora-alpha", "8", "--lora-sync", "adapter"]}[mode]]
    result = run_lean_rl("lean_rl.train", flags, timeout_s=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    metrics = read_metrics(tmp_path)
    assert [r["step"] for r in metrics] == [0, 1]
    for r in metrics:
        print(f"step {r['step']}: loss {r['train/loss']:.2e} grad {r['train/grad_norm']:.3f} engine-trainer "
              f"|Δ log p| {r['train/rollout_logprob_abs_diff']:.1e} probe {r['sync/probe_max_abs_diff']:.1e} "
              f"({r['sync/probe_image_tokens']:.0f} image tokens)")
        assert math.isfinite(r["train/loss"]) and r["train/grad_norm"] > 0
        # fp32 on both sides, the images in context on both: equal up to kernel rounding
        assert r["train/rollout_logprob_abs_diff"] < 1e-4 and r["sync/probe_max_abs_diff"] < 1e-4
        assert r["sync/probe_image_tokens"] == 6  # the probe's prompt held the image: the tower is covered
        if mode == "lora":  # the adapters' A and B only (45 kB here), not the model
            assert r["sync/bytes"] < 0.1 * (ckpt / "model.safetensors").stat().st_size
    tower, language = _max_change(ckpt, hf_out / "step_2", "visual."), _max_change(ckpt, hf_out / "step_2", "model.")
    print(f"{mode}: tower moved {tower:.2e}, language model {language:.2e}")
    assert language > 1e-4
    assert tower == 0.0 if mode in ("frozen", "lora") else tower > 1e-4
