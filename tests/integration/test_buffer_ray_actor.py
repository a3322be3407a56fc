"""The DataBuffer class unchanged as a Ray actor (the design runs it either way)."""

import pytest

from lean_rl.buffer.data_buffer import DataBuffer
from lean_rl.buffer.prompt_source import PromptRecord, PromptSource
from lean_rl.sample import Status

pytestmark = pytest.mark.integration


def test_buffer_as_a_ray_actor_hands_out_takes_back_and_checkpoints(ray_cluster):
    ray = ray_cluster
    records = [PromptRecord(row=i + 1, prompt=f"p{i}", tokens=(1, i)) for i in range(6)]
    actor = ray.remote(DataBuffer).options(num_cpus=0).remote(PromptSource(records, num_epochs=1), 2, None)
    try:
        groups = ray.get(actor.get_prompt_groups.remote(4), timeout=60)
        assert [len(g) for g in groups] == [2, 2, 2, 2]
        for s in groups[0]:
            s.append_response([5], "x", log_probs=[-0.1], weight_versions=0)
            s.status, s.reward = Status.COMPLETED, 1.0
        ray.get(actor.put_finished_groups.remote([groups[0]]), timeout=60)
        state = ray.get(actor.state_dict.remote(), timeout=60)
        restored = DataBuffer(PromptSource(records, num_epochs=1), 2)
        restored.load_state_dict(state)
        # the finished group is ready, the 3 in flight come back pending, 2 prompts never handed out
        assert restored.num_ready() == 1 and restored.num_pending() == 3
        rows = sorted(g[0].metadata["prompt_row"] for g in restored.get_prompt_groups(10))
        assert rows == [2, 3, 4, 5, 6]
    finally:
        ray.kill(actor)
