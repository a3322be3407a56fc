"""slime's examples whose HTTP clients lean_rl did not write, run unchanged (vendored from THUDM/slime at
624b824 under tests/e2e/slime_examples/, Apache-2.0) through `python -m lean_rl.slime_launch train.py`:
strands_sglang (strands-agents with strands-sglang's own aiohttp client posting /generate to
`args.sglang_router_ip:port`, which is lean_rl's router gateway: it adds the run's key and records the
policy version of every token it relays). Real SGLang, router, Megatron and Ray, the tiny model, 2
steps; every sample trains (none FAILED) with the per-token versions of the answers the gateway saw.

strands-agents / strands-sglang are an optional extra (requirements-slime-examples.txt, installed into
.slime-example-deps/ beside the venv, not into it): the test is slow and skipped without them."""

import os

import pytest
from conftest import REPO
from test_slime_examples import EXAMPLES, QUESTIONS, STEPS, run_example, slime_flags, write_rows

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXTRA = REPO / ".slime-example-deps"
INSTALL = ".venv/bin/pip install --no-deps --target .slime-example-deps -r requirements-slime-examples.txt"


@pytest.fixture
def example_deps(monkeypatch):
    if not (EXTRA / "strands_sglang").is_dir() or not (EXTRA / "strands").is_dir():
        pytest.skip(f"the optional extra of slime's agent examples is not installed ({INSTALL})")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(EXTRA)]))


def test_strands_sglang_runs_unchanged(tiny_qwen2, tmp_path, example_deps):
    data = tmp_path / "dapo.jsonl"
    # the prompt as text: the example asks for no --apply-chat-template (strands renders the conversation
    # itself), and without it lean_rl's reader takes text prompts only (slime hands a message list over as is)
    write_rows(data, [{"prompt": q, "label": a} for q, a in QUESTIONS])
    # strands_qwen3_8b.sh's flags for its functions; slime_flags' --apply-chat-template dropped
    flags = [f for f in slime_flags(tiny_qwen2, data, tmp_path, "--label-key", "label",
                                    "--rollout-max-response-len", "24", "--context-parallel-size", "1",
                                    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "2048",
                                    "--kl-loss-type", "low_var_kl", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
                                    "--custom-generate-function-path",
                                    "examples.strands_sglang.generate_with_strands.generate",
                                    "--custom-rm-path", "examples.strands_sglang.generate_with_strands.reward_func")
             if f != "--apply-chat-template"]
    rows, samples = run_example(tmp_path, flags, EXAMPLES / "slime_root")
    assert len(samples) == STEPS * 8
    for s in samples:  # every trained token's version is one the gateway recorded: the step's policy
        assert all(v == s["weight_versions"][0] for v, m in zip(s["weight_versions"], s["loss_mask"]) if m)
    # the example's own attributes, set after its agent ran (kept by lean_rl for its reward function)
    assert all("tool_iters" in s["metadata"]["slime_attributes"] for s in samples)
