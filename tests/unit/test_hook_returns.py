"""User hooks that return the wrong type (issue 12: bad input). A hook that raises on one sample is
that sample's failure (FAILED, counted; the run goes on); a wrong return TYPE is a bug in the hook:
HookReturnError stops the run, naming the flag, the function's dotted path and what it returned.
A reward of NaN / inf is one sample's failure."""

import asyncio
import collections
import copy
import dataclasses
import math
import types

import numpy as np
import pytest

from lean_rl.hook_protocols import Extensions
from lean_rl.rollout.base import RolloutOutput, rollout_output
from lean_rl.rollout.group_runner import GroupRunner
from lean_rl.rollout.reward_scoring import score_group
from lean_rl.sample import Sample, Status
from lean_rl.utils.plugins import HookReturnError
from tests.unit.stand_ins import RecordingBuffer


def _cfg(**rollout):
    return types.SimpleNamespace(
        reward=types.SimpleNamespace(rm_timeout=5.0, rm_retries=0, rm_url=None, custom_rm_path="my_hooks.rm",
                                     rm_type=None, reward_key=None),
        rollout=types.SimpleNamespace(max_concurrency=4, sampling=types.SimpleNamespace(to_sglang=lambda: {"max_new_tokens": 4}),
                                      custom_generate_function_path="my_hooks.gen",
                                      generate_function_flag="--custom-generate-function-path my_hooks.gen",
                                      dynamic_sampling_filter_path="my_hooks.keep",
                                      rollout_function_path="my_hooks.rollout", **rollout),
        run=types.SimpleNamespace(debug_rollout_only=False))


def _group(n=2):
    samples = [Sample(index=i, group_index=0, prompt="p", tokens=[1, 2]) for i in range(n)]
    for s in samples:
        s.append_response([3], text="x", log_probs=[-0.1], weight_versions=0)
        s.status = Status.COMPLETED
    return samples


def _score(reward_fn, group_rm=False, samples=None):
    samples, counters = samples or _group(), collections.Counter()
    asyncio.run(score_group(_cfg(), samples, reward_fn, group_rm=group_rm, counters=counters))
    return samples, counters


@pytest.mark.parametrize("value, shown", [("1.0", "str '1.0'"), (None, "NoneType None"), ([1.0], r"list \[1.0\]"),
                                          ({"reward": 1}, "dict"), (np.array([1.0, 2.0]), "ndarray")])
def test_bad_hook_reward_of_the_wrong_type_stops_the_run_naming_flag_and_function(value, shown):
    async def rm(cfg, sample):
        return value

    with pytest.raises(HookReturnError, match=rf"^--custom-rm-path my_hooks\.rm \({__name__}\..*rm\) returned {shown}.*"
                                              r"it must return a number \(int or float\)"):
        _score(rm)


def test_bad_hook_reward_nan_or_inf_fails_that_sample_only_and_numbers_of_any_kind_pass():
    async def rm(cfg, sample):
        return [math.nan, np.float32(0.5), True, math.inf][sample.index]

    samples, counters = _score(rm, samples=_group(4))
    assert [s.status for s in samples] == [Status.FAILED, Status.COMPLETED, Status.COMPLETED, Status.FAILED]
    assert [s.reward for s in samples] == [0.0, 0.5, 1.0, 0.0] and counters["reward_failed"] == 2
    assert samples[0].metadata["reward_error"] == "ValueError: the reward is nan, not a finite number"


def test_bad_hook_reward_that_raises_is_still_a_failed_sample_not_a_stop():
    async def rm(cfg, sample):
        raise KeyError("label")

    samples, counters = _score(rm)
    assert all(s.status is Status.FAILED for s in samples) and counters["reward_failed"] == 2


@pytest.mark.parametrize("value", ["0.5 0.5", None, 1.0, [1.0, None], [1.0, "x"]])
def test_bad_hook_group_reward_of_the_wrong_type_stops_the_run(value):
    async def rm(cfg, samples):
        return value

    with pytest.raises(HookReturnError, match=r"^--custom-rm-path my_hooks\.rm \(.*rm\) returned .*"
                                              r"it must return a list with one of these per sample: a number"):
        _score(rm, group_rm=True)


def test_bad_hook_group_reward_nan_fails_that_sample_and_a_wrong_length_the_group():
    async def nan(cfg, samples):
        return (1.0, math.nan)

    samples, counters = _score(nan, group_rm=True)
    assert [s.status for s in samples] == [Status.COMPLETED, Status.FAILED] and counters["reward_failed"] == 1

    async def short(cfg, samples):
        return [1.0]

    samples, counters = _score(short, group_rm=True)
    assert all(s.status is Status.FAILED for s in samples) and counters["reward_failed"] == 2


def _run_group(generate=None, keep=None):
    async def default_generate(cfg, sample, params):
        sample.append_response([3], text="x", log_probs=[-0.1], weight_versions=0)
        sample.status = Status.COMPLETED
        return sample

    async def rm(cfg, sample):
        return 1.0

    buffer = RecordingBuffer()
    ext = Extensions(rollout=None, generate=generate or default_generate, reward=rm, group_reward=False,
                     dynamic_filter=keep)
    runner = GroupRunner(_cfg(), buffer, ext, keep_partial_tokens=False)
    group = [Sample(index=i, group_index=0, prompt="p", tokens=[1, 2]) for i in range(2)]
    return asyncio.run(runner.run_group(group)), buffer, runner


@pytest.mark.parametrize("value, shown", [(lambda s: {"tokens": [1]}, "dict"), (lambda s: None, "NoneType None"),
                                          (lambda s: [], r"list \[\]"), (lambda s: [s, "turn 2"], "list"),
                                          (lambda s: (s,), "tuple")])
def test_bad_hook_generate_returning_no_sample_stops_the_run(value, shown):
    async def gen(cfg, sample, params):
        return value(sample)

    with pytest.raises(HookReturnError, match=rf"^--custom-generate-function-path my_hooks\.gen \(.*gen\) returned "
                                              rf"{shown}.*it must return the Sample, or a non-empty list of Samples"):
        _run_group(generate=gen)


def test_bad_hook_generate_that_raises_is_a_failed_sample_and_a_list_of_samples_is_fine():
    async def boom(cfg, sample, params):
        raise RuntimeError("tool crashed")

    kept, buffer, runner = _run_group(generate=boom)
    assert kept is not None and all(s.status is Status.FAILED for s in kept) and runner.counters["generate_failed"] == 2

    async def two_turns(cfg, sample, params):
        sample.append_response([3], text="x", log_probs=[-0.1], weight_versions=0)
        sample.status = Status.COMPLETED
        return [sample, copy.deepcopy(sample)]

    kept, buffer, runner = _run_group(generate=two_turns)
    assert len(kept) == 4 and buffer.finished == [kept] and runner.counters["fanout_samples"] == 2
    assert {s.group_index for s in kept} == {0} and all(s.reward == 1.0 for s in kept)  # one group, all scored


@pytest.mark.parametrize("fan_out, problem", [
    (lambda s: [s, s], "it holds the same Sample object more than once"),
    (lambda s: [s, dataclasses.replace(s, group_index=7)], r"every sample must keep group_index 0, got \[0, 7\]"),
])
def test_bad_hook_generate_fan_out_leaving_its_group_stops_the_run(fan_out, problem):
    async def gen(cfg, sample, params):
        sample.append_response([3], text="x", log_probs=[-0.1], weight_versions=0)
        sample.status = Status.COMPLETED
        return fan_out(sample)

    with pytest.raises(HookReturnError, match=rf"^--custom-generate-function-path my_hooks\.gen .*{problem}"):
        _run_group(generate=gen)


@pytest.mark.parametrize("verdict", [1, None, "yes", [True]])
def test_bad_hook_filter_returning_a_non_bool_stops_the_run(verdict):
    def keep(cfg, group):
        return verdict

    with pytest.raises(HookReturnError, match=r"^--dynamic-sampling-filter-path my_hooks\.keep \(.*keep\) returned "
                                              r".*it must return True \(keep the group\) or False \(drop it\)"):
        _run_group(keep=keep)


def test_a_filter_returning_bools_numpy_ones_too_keeps_or_drops():
    kept, buffer, _ = _run_group(keep=lambda cfg, group: np.bool_(False))
    assert kept is None and len(buffer.dropped) == 1
    kept, buffer, _ = _run_group(keep=lambda cfg, group: True)
    assert kept is not None and buffer.finished == [kept]


def my_rollout(cfg, rollout_id, buffer, evaluation=False):
    return {"rollout/reward_mean": 1.0}


@pytest.mark.parametrize("output, match", [
    ({"rollout/reward_mean": 1.0}, r"dict \{'rollout/reward_mean': 1.0\}; it must return a lean_rl.rollout.base.RolloutOutput"),
    (None, "NoneType None; it must return a lean_rl.rollout.base.RolloutOutput"),
    (RolloutOutput(metrics={"ok": 1.0, "bad": "high"}), r"RolloutOutput .*these metrics are not numbers: \{'bad': 'high'\}"),
    (RolloutOutput(metrics=[("a", 1.0)]), r"RolloutOutput RolloutOutput\(metrics=\[.*it must return"),
])
def test_bad_hook_rollout_function_returning_no_rollout_output_stops_the_run(output, match):
    with pytest.raises(HookReturnError, match=rf"^--rollout-function-path my_hooks\.rollout \({__name__}\.my_rollout\) "
                                              rf"returned {match}"):
        rollout_output(_cfg(), my_rollout, output)
    good = RolloutOutput(metrics={"a": 1, "b": np.float64(2.0)})
    assert rollout_output(_cfg(), my_rollout, good) is good


def test_the_all_samples_process_sees_kept_and_filtered_groups_once_and_not_the_surplus():
    from lean_rl.buffer.data_buffer import DataBuffer
    from lean_rl.buffer.prompt_source import PromptRecord, PromptSource
    from lean_rl.rollout.default import _collect_batch
    from lean_rl.rollout.filters import reward_varies

    async def generate(cfg, sample, params):  # prompt row 1 gets equal rewards: filtered out
        sample.append_response([3], text="x", log_probs=[-0.1], weight_versions=0)
        sample.status = Status.COMPLETED
        sample.reward = 1.0 if sample.metadata["prompt_row"] == 1 else float(sample.index % 2)
        return sample

    seen = []

    async def process(cfg, groups, rollout_id):
        seen.append((rollout_id, sorted(g[0].metadata["prompt_row"] for g in groups)))

    buffer = DataBuffer(PromptSource([PromptRecord(row, "p", (1, 2)) for row in range(4)], num_epochs=1), 2)
    ext = Extensions(rollout=None, generate=generate, reward=None, group_reward=False, dynamic_filter=reward_varies,
                     all_samples_process=process)
    cfg = _cfg(rollout_batch_size=1, over_sampling_batch_size=2, partial_rollout=False)
    out = asyncio.run(_collect_batch(cfg, buffer, ext, rollout_id=5))
    assert out.metrics["rollout/groups"] == 1 and out.metrics["rollout/groups_filtered"] == 1
    assert seen == [(5, [0, 1])]  # row 0 kept, row 1 filtered; rows 2-3 were never needed


def test_an_eval_function_returning_the_wrong_type_names_its_own_flag():
    cfg = _cfg()
    cfg.eval = types.SimpleNamespace(function_path="my_hooks.evaluate")
    with pytest.raises(HookReturnError, match=r"^--eval-function-path my_hooks\.evaluate \(.*\) returned NoneType"):
        rollout_output(cfg, my_rollout, None, evaluation=True)
    with pytest.raises(HookReturnError, match=r"^--rollout-function-path my_hooks\.rollout"):
        rollout_output(cfg, my_rollout, None)
