"""The whole loop as a user runs it: `python -m lean_rl.train[_async] ...` in a subprocess, on the tiny
model and the toy task, with real SGLang, router, Megatron and Ray started by the run itself."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lean_rl.testing.toy_task import write_dataset

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("toy_data")
    write_dataset(root / "train.jsonl", 256, seed=0)
    write_dataset(root / "eval.jsonl", 16, seed=1)
    return root


def run_flags(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    """The flags of scripts/run-tiny-cpu.sh, smaller: what the e2e runs share."""
    return [
        "--hf-checkpoint", str(model), "--output-dir", str(out / "run"), "--no-tensorboard",
        "--prompt-data", str(data / "train.jsonl"), "--rollout-shuffle",
        "--custom-rm-path", "lean_rl.testing.toy_task.kind_fraction_reward",
        "--rollout-batch-size", "8", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "12",
        "--advantage-estimator", "grpo", "--lr", "1e-3", "--lr-warmup-iters", "2", "--micro-batch-size", "16",
        "--rollout-num-engines", "1", "--sglang-max-total-tokens", "8192", *extra,
    ]


def run_lean_rl(module: str, flags: list[str], timeout_s: float = 600, extra_env: dict | None = None,
                **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", module, *flags], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout_s, **popen)


def read_metrics(out: Path) -> list[dict]:
    path = out / "run" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def reward_gain(rows: list[dict]) -> tuple[float, float]:
    """(mean reward of the first 2 steps, of the last 2)."""
    rewards = [r["rollout/reward_mean"] for r in rows]
    return sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2


def assert_each_prompt_trained_once(out: Path, model: Path, data: Path, steps: int, batch: int,
                                    in_order: bool = True) -> None:
    """Across a killed run and its resume, every step trained on `batch` fresh prompts and each prompt of
    the shuffled order (seed 42) was trained exactly once: exactly the first steps * batch of the order,
    none lost (steps after the last checkpoint were redone and their sample dumps rewritten). Fully
    async (`in_order=False`) groups finish out of order: no prompt twice, and none from past the
    prompts the generator may have issued."""
    import transformers

    from lean_rl.buffer.config import DataConfig
    from lean_rl.buffer.prompt_source import PromptSource, load_prompts

    trained = []
    for step in range(steps):
        lines = (out / "run" / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()
        groups = {(s["metadata"]["epoch"], s["metadata"]["prompt_row"]) for s in map(json.loads, lines)}
        assert len(groups) == batch
        trained += sorted(groups)
    assert len(set(trained)) == len(trained) == steps * batch
    if not in_order:
        return
    config = DataConfig(prompt_data=str(data / "train.jsonl"))
    records, _ = load_prompts(config.prompt_data, config, transformers.AutoTokenizer.from_pretrained(model))
    source = PromptSource(records, shuffle=True, seed=42)
    assert set(trained) == {(0, source.next()[1].row) for _ in range(steps * batch)}


_WAIT_ALIVE = """
import sys, time, ray
from lean_rl.utils.ray_utils import init_ray
init_ray(sys.argv[1])
deadline = time.monotonic() + float(sys.argv[3])
while sys.argv[2] not in {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}:
    assert time.monotonic() < deadline, f"node {sys.argv[2]} not alive again"
    time.sleep(0.5)
"""


def wait_node_alive(address: str, ip: str, timeout_s: float = 90.0) -> None:
    """Until Ray sees `ip` alive (in a short-lived driver: this process may hold another Ray)."""
    result = subprocess.run([sys.executable, "-c", _WAIT_ALIVE, address, ip, str(timeout_s)], capture_output=True,
                            text=True, timeout=timeout_s + 60)
    assert result.returncode == 0, result.stderr[-2000:]
