"""A math-verify worker stuck past its deadline is replaced: the reward queued behind it fails with a
clear error (the sample is counted FAILED by score_group), and the next reward is answered at once."""

import asyncio
import time
import types

from lean_rl.rollout import rewards
from lean_rl.sample import Sample


def _sample(response: str, label: str) -> Sample:
    return Sample(index=0, group_index=0, prompt="q", tokens=[1], response=response, label=label)


def test_a_stuck_worker_is_replaced_and_later_rewards_are_answered():
    cfg = types.SimpleNamespace(reward=types.SimpleNamespace(rm_timeout=1))

    async def main():
        stuck_pool = rewards._math_pool()
        stuck_pool.submit(time.sleep, 3600)  # the only worker hangs (as math-verify can on some inputs)
        started = time.monotonic()
        try:
            await rewards.math_reward(cfg, _sample("\\boxed{2}", "2"))
        except TimeoutError as err:
            assert "its worker was replaced" in str(err)
        else:
            raise AssertionError("the reward queued behind the stuck worker should time out")
        assert time.monotonic() - started < 30 and rewards._MATH_POOL is not stuck_pool
        started = time.monotonic()
        assert await rewards.math_reward(cfg, _sample("The answer is \\boxed{2}", "2")) == 1.0
        assert time.monotonic() - started < 60  # a fresh worker (spawn + import math-verify), not the stuck one

    asyncio.run(main())
