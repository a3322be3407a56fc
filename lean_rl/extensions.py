"""The user's hooks (slime's extension points: --rollout-function-path, --custom-generate-function-path,
--custom-rm-path, the filters, the post-processes, the data source, the advantage and the loss) loaded:
load_extensions imports and checks every dotted path once at start-up, before any engine starts (their
protocols and the Extensions that holds them: lean_rl/hook_protocols.py). The run installs the result
(rollout/base.install_extensions); the rollout, the train
hooks (train_hooks.py) and the trainer then use what was loaded, never reloading per step.
docs/extending.md documents each hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lean_rl.hook_protocols import Extensions, generate_caller
from lean_rl.rollout import rewards
from lean_rl.rollout.base import install_extensions
from lean_rl.rollout.reward_routing import served_reward_function
from lean_rl.rollout.config import MULTI_TURN_GENERATE
from lean_rl.utils.slime_finder import install_slime_finder
from lean_rl.rollout.generate import generate as default_generate
from lean_rl.slime_compat.hooks import (HookedGenerate, SampleHooks, SlimeAllSamplesProcess, SlimeDynamicFilter,
                                        SlimeGenerate, SlimeReward, SlimeRewardPostProcess, SlimeSampleFilter,
                                        is_slime_function)
from lean_rl.slime_compat.rollout_function import SlimeRolloutFunction
from lean_rl.slime_compat.run_state import bind_run
from lean_rl.slime_compat.source_adapter import SlimeSourceFactory, is_slime_source
from lean_rl.utils.plugins import load_function

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group
    from lean_rl.config import Config


def load_extensions(cfg: Config) -> Extensions:
    """Import and check every dotted-path extension; called at start-up, before any engine starts."""
    from lean_rl.algorithms.hooks import load_advantage_function, load_loss_function
    from lean_rl.algorithms.slime_contracts import load_tis_function
    from lean_rl.buffer.user_source import load_source_factory

    # a hook written for slime imports slime.*: served by lean_rl's compatibility modules unless slime is
    # installed (lean_rl/slime_compat), and wrapped into lean_rl's contract below (slime_hook)
    install_slime_finder()
    bind_run(cfg)
    r = cfg.rollout
    rollout_fn = slime_hook(load_function(r.rollout_function_path, "--rollout-function-path", num_args=4,
                                          must_be_sync=False),
                            SlimeRolloutFunction, f"--rollout-function-path {r.rollout_function_path}")
    eval_fn = None
    if cfg.eval.function_path:
        eval_fn = slime_hook(load_function(cfg.eval.function_path, "--eval-function-path", num_args=4, must_be_sync=False),
                             SlimeRolloutFunction, f"--eval-function-path {cfg.eval.function_path}")
    generate_fn = None
    if r.custom_generate_function_path:
        generate_fn = slime_hook(load_function(r.custom_generate_function_path, "--custom-generate-function-path",
                                               num_args=(3, 4), must_be_async=True),
                                 SlimeGenerate, f"--custom-generate-function-path {r.custom_generate_function_path}")
    if r.rollout_sample_hook_path:  # slime's sample hooks: after whichever generate function runs
        hooks = SampleHooks([load_function(path, "--rollout-sample-hook-path", num_args=2)
                             for path in r.rollout_sample_hook_path], list(r.rollout_sample_hook_path))
        if isinstance(generate_fn, SlimeGenerate):
            generate_fn.hooks = hooks  # on the slime samples, before their versions are read
        else:
            inner = generate_fn or default_generate
            generate_fn = HookedGenerate(inner, generate_caller(inner), r.generate_function_flag, hooks)
    if r.multi_turn.environment_path or r.custom_generate_function_path == MULTI_TURN_GENERATE:
        from lean_rl.rollout.multi_turn import check_environment  # multi_turn builds on this module

        check_environment(cfg)
    if cfg.reward.custom_rm_path:
        reward_fn = slime_hook(load_function(cfg.reward.custom_rm_path, "--custom-rm-path", num_args=2, must_be_async=True),
                               SlimeReward, f"--custom-rm-path {cfg.reward.custom_rm_path}")
    elif cfg.reward.rm_type:
        reward_fn = rewards.BUILTIN_REWARDS[cfg.reward.rm_type]
    else:
        reward_fn = None
    served = served_reward_function(cfg)  # --reward-routes, --rm-hf-checkpoint, --judge-* (and prepares the judge)
    reward_fn = reward_fn or served
    eval_rewards: dict[str, tuple[Callable, bool]] = {}
    for eval_set in cfg.eval.sets:  # --eval-config: a set's own reward (never a group reward)
        if eval_set.custom_rm_path:
            flag = f"--eval-config {cfg.eval.config_path}: {eval_set.name}: custom_rm_path"
            eval_rewards[eval_set.name] = (slime_hook(load_function(eval_set.custom_rm_path, flag, num_args=2,
                                                                    must_be_async=True), SlimeReward, flag), False)
        elif eval_set.rm_type:  # checked by parse_config
            eval_rewards[eval_set.name] = (rewards.BUILTIN_REWARDS[eval_set.rm_type], False)

    def optional(path: str | None, flag: str, num_args: int, slime_wrapper, **checks) -> Callable | None:
        return slime_hook(load_function(path, flag, num_args=num_args, **checks), slime_wrapper,
                          f"{flag} {path}") if path else None

    return Extensions(
        rollout_fn, generate_fn, reward_fn, cfg.reward.group_rm,
        dynamic_filter=optional(r.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path", 2,
                                SlimeDynamicFilter, must_be_sync=True),
        eval_rollout=eval_fn,
        sample_filter=optional(r.rollout_sample_filter_path, "--rollout-sample-filter-path", 2, SlimeSampleFilter,
                               must_be_sync=True),
        all_samples_process=optional(r.rollout_all_samples_process_path, "--rollout-all-samples-process-path", 3,
                                     SlimeAllSamplesProcess),
        reward_post_process=optional(cfg.reward.custom_reward_post_process_path, "--custom-reward-post-process-path",
                                     2, SlimeRewardPostProcess, must_be_sync=True),
        data_source=slime_hook(load_source_factory(cfg.data.data_source_path), SlimeSourceFactory,
                               f"--data-source-path {cfg.data.data_source_path}") if cfg.data.data_source_path else None,
        custom_advantage=load_advantage_function(cfg.algorithm.custom_advantage_function_path)
        if cfg.algorithm.custom_advantage_function_path else None,
        custom_loss=load_loss_function(cfg.algorithm.custom_loss_function_path)
        if cfg.algorithm.custom_loss_function_path else None,
        custom_tis=load_tis_function(cfg.algorithm.custom_tis_function_path)
        if cfg.algorithm.custom_tis_function_path else None,
        eval_rewards=eval_rewards,
    )


def slime_hook(fn: Callable, wrapper, flag: str) -> Callable:
    """`fn` itself, or, when it was written against slime's API (its module imports slime, or it is a
    slime data source class), `fn` wrapped into lean_rl's contract for its flag (lean_rl/slime_compat/)."""
    return wrapper(fn, flag) if is_slime_function(fn) or is_slime_source(fn) else fn


def install(cfg: Config) -> Extensions:
    """load_extensions(cfg), installed for the rollout (what a run does at start-up; scripts and tests
    that call a rollout function directly do the same)."""
    return install_extensions(cfg, load_extensions(cfg))
