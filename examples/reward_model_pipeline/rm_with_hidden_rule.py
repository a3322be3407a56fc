"""The GRPO run's reward: the served reward model's score, trained on (--reward-key rm), with the toy task's
rule reward beside it as a metric only (rollout/reward/rule_mean, eval/toy/reward/rule_mean). The policy's
advantages come from "rm" alone; "rule" is what the reward model was meant to stand for, never trained on.

    --custom-rm-path rm_with_hidden_rule.reward --reward-key rm --rm-hf-checkpoint RM_HF_DIR
    (run.sh puts this directory on PYTHONPATH)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lean_rl.rollout.reward_model import reward_model_score
from lean_rl.testing.toy_task import kind_fraction_reward

if TYPE_CHECKING:
    from lean_rl.config import Config
    from lean_rl.sample import Sample


async def reward(cfg: Config, sample: Sample) -> dict[str, float]:
    return {"rm": await reward_model_score(cfg, sample), "rule": await kind_fraction_reward(cfg, sample)}
