"""Evaluation rollouts: every prompt of each evaluation set (--eval-prompt-data, or --eval-config with
per-set sampling, reward and data keys), `--n-samples-per-eval-prompt` times (or the set's own);
mean reward and pass@k per set (rollout/pass_at_k.py). Eval prompts never touch the training buffer."""

from __future__ import annotations

import asyncio
import collections
import copy
import functools
import logging
from typing import TYPE_CHECKING

from lean_rl.options import rebuild
from lean_rl.buffer.images import processor_for
from lean_rl.buffer.prompt_source import PromptRecord, load_prompts, load_tokenizer
from lean_rl.rollout.base import RolloutOutput, generated_samples
from lean_rl.rollout.pass_at_k import PASS_REWARD, mean_pass_at_k
from lean_rl.rollout.reward_scoring import reward_entry_means, score_group
from lean_rl.sample import Sample, Status

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group (Megatron's included)
    from lean_rl.config import Config
    from lean_rl.rollout.eval_config import EvalSet
    from lean_rl.hook_protocols import Extensions, GenerateFunction

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=16)
def _eval_records(name: str, path: str, data_cfg, tokenizer_path: str) -> tuple[PromptRecord, ...]:
    records, _ = load_prompts(path, data_cfg, load_tokenizer(tokenizer_path), flag=f"--eval-prompt-data {name}",
                              processor=processor_for(data_cfg, tokenizer_path))
    return tuple(records)


def _set_records(cfg: Config, eval_set: EvalSet) -> tuple[PromptRecord, ...]:
    """The set's prompts, read with its own data keys (--eval-config) over the run's."""
    data = rebuild(cfg.data, **dict(eval_set.data_overrides)) if eval_set.data_overrides else cfg.data
    return _eval_records(eval_set.name, eval_set.path, data, cfg.engines.model_path)


def load_eval_datasets(cfg: Config) -> dict[str, int]:
    """Read every evaluation set now (the first evaluation then finds them loaded): a bad file fails
    at start-up, naming the set, not after the first --eval-interval steps. Returns the number of
    prompts per set."""
    return {s.name: len(_set_records(cfg, s)) for s in cfg.eval.sets}


class EvaluationFailedError(RuntimeError):
    """More than --eval-max-failed-fraction of an evaluation set failed to generate."""


def check_failed_evaluation(cfg: Config, name: str, failed: list[Sample], total: int) -> None:
    """Log the failed samples of evaluation set `name`; EvaluationFailedError past the threshold."""
    if not failed:
        return
    logger.warning("evaluation %s: %d of %d samples failed to generate (first: %s)", name, len(failed), total,
                   failed[0].metadata.get("generate_error"))
    if len(failed) > cfg.eval.max_failed_fraction * total:
        raise EvaluationFailedError(f"evaluation {name}: {len(failed)} of {total} samples failed to generate, more than "
                                    f"--eval-max-failed-fraction {cfg.eval.max_failed_fraction} (first: "
                                    f"{failed[0].metadata.get('generate_error')})")


async def run_evaluation(cfg: Config, rollout_id: int, extensions: Extensions,
                         default_generate: GenerateFunction) -> RolloutOutput:
    """Generate and score every prompt of each --eval-prompt-data set. The generate function gets
    evaluation=True; a generate that fans out (several samples per call) makes one attempt of them:
    pass@k counts an attempt as correct when any of its samples has reward >= 1.0, reward_mean
    averages over every sample."""
    if extensions.reward is None and extensions.generate is None and \
            len(extensions.eval_rewards) < len(cfg.eval.sets):  # nothing could set a set's reward
        raise ValueError("evaluation needs a reward: set --rm-type or --custom-rm-path")
    generate_call = extensions.generate_call or default_generate
    generate_fn = extensions.generate or default_generate
    semaphore = asyncio.Semaphore(cfg.rollout.max_concurrency)
    counters: collections.Counter = collections.Counter()
    output = RolloutOutput()

    async def one(sample: Sample, params: dict) -> list[Sample]:
        async with semaphore:
            try:
                result = await generate_call(cfg, sample, params, True)
            except Exception as err:  # noqa: BLE001 - one failed request must not end the run (it is counted)
                sample.status = Status.FAILED
                sample.metadata["generate_error"] = f"{type(err).__name__}: {err}"[:500]
                return [sample]
        return generated_samples(cfg, generate_fn, result, sample.group_index)

    for eval_set in cfg.eval.sets:
        name, n, params = eval_set.name, eval_set.n_samples_per_prompt, eval_set.sampling.to_sglang()
        reward_fn, group_rm = extensions.eval_rewards.get(name, (extensions.reward, extensions.group_reward))
        records = _set_records(cfg, eval_set)
        groups = [[Sample(index=i * n + j, group_index=i, prompt=r.prompt, tokens=list(r.tokens), label=r.label,
                          metadata=dict(r.metadata), multimodal_inputs=copy.deepcopy(r.multimodal_inputs))
                   for j in range(n)] for i, r in enumerate(records)]
        attempts = await asyncio.gather(*(asyncio.gather(*(one(s, dict(params)) for s in g)) for g in groups))
        failed = [s for g in attempts for attempt in g for s in attempt if s.status == Status.FAILED]
        check_failed_evaluation(cfg, name, failed, sum(len(attempt) for g in attempts for attempt in g))
        # what failed says nothing about the policy: no metric scores it (a failed attempt counts as not
        # passed in pass@k, which keeps its k attempts per prompt)
        attempts = [[[s for s in attempt if s.status != Status.FAILED] for attempt in g] for g in attempts]
        finished = [[s for attempt in g for s in attempt] for g in attempts]
        finished = [g for g in finished if g]
        await asyncio.gather(*(score_group(cfg, g, reward_fn, group_rm, counters, evaluation=True) for g in finished))
        output.metrics[f"eval/{name}/failed"] = float(len(failed))
        if not finished:  # every sample failed (--eval-max-failed-fraction 1): nothing to score
            continue
        unscored = [s.index for g in finished for s in g if s.reward is None]
        if unscored:
            raise ValueError(f"evaluation {name}: {len(unscored)} sample(s) have no reward (e.g. sample {unscored[0]}): "
                             "set --rm-type or --custom-rm-path (or set sample.reward in the generate function)")
        rewards = [s.reward for g in finished for s in g]
        output.metrics[f"eval/{name}/reward_mean"] = sum(rewards) / len(rewards)
        for key, mean in reward_entry_means([s for g in finished for s in g]).items():
            output.metrics[f"eval/{name}/reward/{key}_mean"] = mean
        correct = [sum(any(s.reward >= PASS_REWARD for s in attempt) for attempt in g) for g in attempts]
        for k in eval_set.ks:  # --eval-pass-k / the set's pass_k, else 1 and n (rollout/pass_at_k.py)
            output.metrics[f"eval/{name}/pass@{k}"] = mean_pass_at_k(correct, n, k)
        output.metrics[f"eval/{name}/response_len_mean"] = sum(s.response_length for g in finished for s in g) / len(rewards)
        output.samples[name] = [s for g in finished for s in g]
    output.metrics.update({f"eval/{k}": float(v) for k, v in counters.items()})
    return output
