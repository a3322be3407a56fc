"""--rollout-timeout bounds the rollout function (async or blocking) the loop awaits; the error names the
flag. Runtime is built without starting anything: only its rollout call is under test."""

import asyncio
import json
import sys
import time
import types

import pytest

from lean_rl.config import parse_config
from lean_rl.runtime import Runtime


@pytest.fixture
def flags(tiny_qwen2, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "label": "x"}) + "\n")
    return ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--output-dir", str(tmp_path / "out"),
            "--rollout-timeout", "0.5"]


def _user_module(monkeypatch, **functions):
    module = types.ModuleType("user_rollouts")
    module.__dict__.update(functions)
    monkeypatch.setitem(sys.modules, "user_rollouts", module)


async def hanging_async(cfg, rollout_id, buffer, evaluation=False):
    await asyncio.sleep(3600)


def hanging_blocking(cfg, rollout_id, buffer, evaluation=False):
    time.sleep(3600)


@pytest.mark.parametrize("name", ["hanging_async", "hanging_blocking"])
def test_a_rollout_past_its_deadline_stops_with_the_flag_named(flags, monkeypatch, name):
    _user_module(monkeypatch, hanging_async=hanging_async, hanging_blocking=hanging_blocking)
    rt = Runtime(parse_config([*flags, "--rollout-function-path", f"user_rollouts.{name}"]))
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rollout 3 \(user_rollouts\..*\) did not finish within --rollout-timeout 0.5 s"):
        asyncio.run(rt.rollout(3))
    assert time.monotonic() - started < 30
