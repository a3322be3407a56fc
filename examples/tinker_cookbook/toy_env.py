"""The toy task ("answer in digits: cat dog" / "answer in letters: ...", lean_rl/testing/toy_task.py) as
a tinker-cookbook RL dataset: its own Env / EnvGroupBuilder / RLDataset / RLDatasetBuilder abstractions,
so that rl_basic's training loop (tinker_cookbook.rl.train) runs unchanged on data made here, with no
Hugging Face hub. The reward is the fraction of the response's tokens of the kind the prompt asks for
(a random tiny model scores about 0.1, the ceiling is 1.0)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import chz
import tinker
from tinker_cookbook import renderers
from tinker_cookbook.rl.types import (Action, Env, EnvGroupBuilder, Metrics, Observation, RLDataset,
                                      RLDatasetBuilder, StepResult, StopCondition, Trajectory)
from tinker_cookbook.tokenizer_utils import get_tokenizer

from lean_rl.testing.toy_task import KINDS, kind_fraction

_WORDS = "the a cat dog sat on mat ran fast slow big small red blue green hello world".split()


class ToyEnv(Env):
    def __init__(self, prompt: str, kind: str, renderer: renderers.Renderer):
        self.prompt, self.kind, self.renderer = prompt, kind, renderer

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        convo: list[renderers.Message] = [{"role": "user", "content": self.prompt}]
        return self.renderer.build_generation_prompt(convo), self.renderer.get_stop_sequences()

    async def step(self, action: Action, *, extra=None) -> StepResult:
        tokenizer = self.renderer.tokenizer
        special = set(getattr(tokenizer, "all_special_ids", []))
        texts = [tokenizer.decode([t]) for t in action if t not in special]
        reward = kind_fraction(texts, self.kind)
        return StepResult(reward=reward, episode_done=True, next_observation=tinker.ModelInput.empty(),
                          next_stop_condition=self.renderer.get_stop_sequences(), metrics={"kind_fraction": reward})


@dataclass(frozen=True)
class ToyGroupBuilder(EnvGroupBuilder):
    prompt: str
    kind: str
    renderer: renderers.Renderer
    group_size: int

    async def make_envs(self) -> Sequence[Env]:
        return [ToyEnv(self.prompt, self.kind, self.renderer) for _ in range(self.group_size)]

    async def compute_group_rewards(self, trajectory_group: list[Trajectory],
                                    env_group: Sequence[Env]) -> list[tuple[float, Metrics]]:
        return [(0.0, {}) for _ in trajectory_group]  # the reward is each step's

    def logging_tags(self) -> list[str]:
        return ["toy"]


class ToyDataset(RLDataset):
    def __init__(self, batch_size: int, group_size: int, num_batches: int, renderer: renderers.Renderer, seed: int):
        rng = random.Random(seed)
        kinds = sorted(KINDS)
        self.batches = [[ToyGroupBuilder(f"answer in {kinds[i % 2]}: "
                                         + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 5))),
                                         kinds[i % 2], renderer, group_size) for i in range(batch_size)]
                        for _ in range(num_batches)]

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return self.batches[index]

    def __len__(self) -> int:
        return len(self.batches)


@chz.chz
class ToyDatasetBuilder(RLDatasetBuilder):
    batch_size: int
    group_size: int
    num_batches: int
    model_name_for_tokenizer: str
    renderer_name: str
    seed: int = 0

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        renderer = renderers.get_renderer(self.renderer_name, get_tokenizer(self.model_name_for_tokenizer))
        return ToyDataset(self.batch_size, self.group_size, self.num_batches, renderer, self.seed), None
