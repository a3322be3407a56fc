"""--rollout-timeout in fully async training (rollout/continuous.py): a group generating past it fails
and is dropped, counted, never trained; the wait for a batch is bounded by it too, and says so. The
generator, the group runner and the buffer are lean_rl's own; the generate function is a user's whose
group 0 never finishes, and no engine is involved (no request reaches one)."""

import asyncio
import json
import sys
import types

import pytest

from lean_rl.buffer.data_buffer import create_data_buffer
from lean_rl.config import parse_config
from lean_rl.extensions import load_extensions
from lean_rl.rollout.continuous import ContinuousGenerator
from lean_rl.sample import Status


async def generate(cfg, sample, sampling_params):
    if sample.group_index == 0:
        await asyncio.sleep(3600)  # an agent or environment that never answers
    sample.append_response([7, 8], log_probs=[-0.5, -0.5], weight_versions=[0, 0])
    sample.status, sample.reward = Status.COMPLETED, 1.0
    return sample


@pytest.fixture
def cfg(tiny_qwen2, tmp_path, monkeypatch):
    module = types.ModuleType("user_generate")
    module.generate = generate
    monkeypatch.setitem(sys.modules, "user_generate", module)
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "label": "x"}) + "\n" for i in range(8)))
    return parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data),
                         "--output-dir", str(tmp_path / "out"), "--async-mode", "full", "--max-staleness", "0",
                         "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                         "--custom-generate-function-path", "user_generate.generate", "--rollout-timeout", "1"])


def test_a_group_past_the_rollout_timeout_is_dropped_and_the_batch_wait_is_bounded(cfg):
    buffer = create_data_buffer(cfg)

    async def main():
        generator = ContinuousGenerator(cfg, buffer, load_extensions(cfg), start_version=0)
        generator.start()
        try:
            # --max-staleness 0 admits one batch (2 groups) at version 0: group 1 finishes, group 0 hangs
            with pytest.raises(TimeoutError, match=r"step 0: no batch of 2 groups within --rollout-timeout 1 s "
                                                   r"\(have 1\); nothing of it was trained"):
                await generator.next_batch(0)
            await asyncio.sleep(0.5)  # the group's own deadline started with it, a moment after the wait's
            return dict(generator.counters)
        finally:
            await generator.stop()

    counters = asyncio.run(main())
    assert counters["groups_timed_out"] == 1
    assert buffer.get_counters()["groups_dropped_timed_out"] == 1
    assert buffer.num_in_flight() == 0  # landed: not saved as pending, never handed out again
    assert [g[0].group_index for g in buffer.ready] == []  # group 1 was taken by the batch that timed out
    assert all(s.group_index != 0 for g in buffer.ready for s in g)
