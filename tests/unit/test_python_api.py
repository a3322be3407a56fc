"""lean_rl/api.py: keywords build the Config the equivalent flags build (parse_config, the same code),
bad keywords are refused in one line naming them, and hooks given as functions reach the loader and
cross a process boundary by value (utils/python_hooks.py). The run itself: tests/e2e/test_python_api_run.py."""

import asyncio
import dataclasses
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import types

import pytest

from lean_rl import api
from lean_rl.config import build_parser, parse_config
from lean_rl.options import ConfigError
from lean_rl.stop import RunStopped, StopSignals
from lean_rl.testing.toy_task import write_dataset
from lean_rl.utils.plugins import PluginError, load_function
from lean_rl.utils.python_hooks import PythonHook, python_hook


async def toy_reward(cfg, sample):
    return 1.0


@pytest.fixture
def files(tiny_qwen2, tmp_path):
    write_dataset(tmp_path / "train.jsonl", 8, seed=0)
    write_dataset(tmp_path / "eval.jsonl", 4, seed=1)
    return tiny_qwen2, tmp_path


def test_keywords_build_the_config_the_flags_build(files):
    model, data = files
    flags = ["--hf-checkpoint", str(model), "--prompt-data", str(data / "train.jsonl"), "--input-key", "prompt",
             "--label-key", "label", "--rollout-shuffle", "--no-tensorboard", "--num-rollout", "7",
             "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--lr", "0.002", "--kl-loss-coef", "0",
             "--advantage-estimator", "grpo", "--rollout-stop", "a", "b", "--eval-prompt-data", "toy",
             str(data / "eval.jsonl"), "--eval-interval", "5", "--custom-rm-path",
             "lean_rl.testing.toy_task.kind_fraction_reward", "--sglang-base-port", "31000", "--router-port", "31100",
             "--sglang-max-total-tokens", "8192", "--micro-batch-size", "4", "--sglang-api-key", "k",
             "--sglang-chunked-prefill-size", "256"]
    keywords = dict(hf_checkpoint=model, prompt_data=data / "train.jsonl", input_key="prompt", label_key="label",
                    rollout_shuffle=True, no_tensorboard=True, num_rollout=7, rollout_batch_size=4,
                    n_samples_per_prompt=2, lr=0.002, kl_loss_coef=0, advantage_estimator="grpo",
                    rollout_stop=["a", "b"], eval_prompt_data={"toy": data / "eval.jsonl"}, eval_interval=5,
                    custom_rm_path="lean_rl.testing.toy_task.kind_fraction_reward", sglang_base_port=31000,
                    router_port=31100, sglang_max_total_tokens=8192, micro_batch_size=4, sglang_api_key="k",
                    sglang_chunked_prefill_size=256,
                    colocate=False, save=None)  # False / None: the flag left out, as above
    from_keywords, from_flags = api.build_config(**keywords), parse_config(flags)
    assert comparable(from_keywords) == comparable(from_flags)
    assert from_keywords.rollout.sampling.stop == ("a", "b") and from_keywords.run.tensorboard is False
    assert from_keywords.engines.server_passthrough == ("--chunked-prefill-size", "256")
    assert comparable(api.build_config(**{**keywords, "lr": 0.003})) != comparable(from_flags)  # it can fail


def comparable(cfg):
    """`cfg`'s fields, the engines' as a dict without `live` (the endpoints a run will start: a fresh
    object per Config, equal only to itself)."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    fields["engines"] = {k: v for k, v in vars(cfg.engines).items() if k != "live"}
    return fields


@pytest.mark.parametrize("keywords, message", [
    (dict(rollout_batch_sise=8), "rollout_batch_sise: no such option (no flag --rollout-batch-sise); did you mean "
                                 "rollout_batch_size?"),
    (dict(rollout_batch_size="8"), "rollout_batch_size (--rollout-batch-size) takes int, got '8'"),
    (dict(rollout_batch_size=True), "rollout_batch_size (--rollout-batch-size) takes int, got True"),
    (dict(lr="fast"), "lr (--lr) takes float, got 'fast'"),
    (dict(colocate=1), "colocate (--colocate) is a switch: give True or False, got 1"),
    (dict(async_mode="two-step"), "async_mode (--async-mode) must be one of off, one-step, full; got 'two-step'"),
    (dict(rollout_stop="a"), "rollout_stop (--rollout-stop) takes several values: give a list, got 'a'"),
    (dict(hf_checkpoint=toy_reward), "hf_checkpoint (--hf-checkpoint) takes a value, not a function"),
    (dict(prompt_data=3), "prompt_data (--prompt-data) takes a string, got 3"),
    (dict(sglang_chunked_prefill_size=toy_reward), "sglang_chunked_prefill_size (--sglang-chunked-prefill-size, passed to "
                                                   "the servers) takes numbers or strings"),
])
def test_bad_keywords_are_refused_naming_them(keywords, message):
    with pytest.raises(ConfigError) as err:
        api.command_line(**keywords)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_flags_checks_apply_to_keywords(files):
    model, data = files
    with pytest.raises(ConfigError, match="--rollout-batch-size must be > 0, got 0"):
        api.build_config(hf_checkpoint=model, prompt_data=data / "train.jsonl", rollout_batch_size=0)


def test_every_hook_flag_is_a_declared_flag():
    declared = build_parser()._option_string_actions
    assert [flag for flag in api.HOOK_FLAGS if flag not in declared] == []


def test_functions_reach_the_config_and_the_loader(files):
    model, data = files

    def loss(algo, **inputs):
        return None

    cfg = api.build_config(hf_checkpoint=model, prompt_data=data / "train.jsonl", custom_rm_path=toy_reward,
                           custom_loss_function_path=loss, rollout_sample_hook_path=[lambda cfg, s: None])
    hook = cfg.reward.custom_rm_path
    assert isinstance(hook, PythonHook) and hook == f"{__name__}.toy_reward" and hook.function is toy_reward
    assert load_function(hook, "--custom-rm-path", num_args=2, must_be_async=True) is toy_reward
    assert cfg.algorithm.custom_loss_function_path.function is loss
    assert cfg.algorithm.loss_type == "custom_loss"  # derived from the flag being given, as on the command line
    assert cfg.rollout.rollout_sample_hook_path[0].endswith("<lambda>")
    # the loader's checks apply to functions: a reward must be `async def`
    with pytest.raises(PluginError, match=r"--custom-rm-path '.*loss': must be an `async def` function"):
        load_function(cfg.algorithm.custom_loss_function_path, "--custom-rm-path", num_args=2, must_be_async=True)


def test_different_functions_of_one_name_get_different_names():
    first, second = (lambda: 1), (lambda: 2)
    assert python_hook(first) == python_hook(first) != python_hook(second)


def test_a_lambda_defined_in_main_travels_by_value(tmp_path):
    """Pickled in one process (where it is defined in __main__), called in another that cannot import it."""
    dump = textwrap.dedent(f"""
        import pickle, sys
        from lean_rl.utils.python_hooks import python_hook
        offset = 40
        hook = python_hook(lambda x: x + offset)
        open({str(tmp_path / 'hook.pkl')!r}, "wb").write(pickle.dumps(hook))
    """)
    subprocess.run([sys.executable, "-c", dump], check=True, timeout=120)
    load = f"import pickle; h = pickle.load(open({str(tmp_path / 'hook.pkl')!r}, 'rb')); print(h, h.function(2))"
    out = subprocess.run([sys.executable, "-c", load], check=True, timeout=120, capture_output=True, text=True)
    assert out.stdout.split() == ["__main__.<lambda>", "42"]
    assert pickle.loads(pickle.dumps(python_hook(toy_reward))).function is toy_reward  # importable: by reference


def test_an_interrupt_of_the_caller_stops_a_run_on_a_thread():
    """train() inside a running event loop (a Jupyter cell) runs on a thread; Python gives SIGINT to the
    main thread, which relays it to the run's StopSignals: the run stops at its next boundary."""
    stop = StopSignals(timeout_s=60)

    def run_on_the_thread():
        async def loop():
            stop.install()  # off the main thread: no OS handlers, the caller relays
            assert await stop.unless_stopped(asyncio.sleep(60)) is None  # cancelled by the relayed SIGINT
            stop.check(3)
        asyncio.run(loop())

    # Python's own SIGINT handler (KeyboardInterrupt in the main thread), as in a script or a notebook: an
    # earlier test of this pytest process (Ray, a run's StopSignals) may have left another one in place.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        with pytest.raises(RunStopped, match="stopped by SIGINT with 3 rollouts trained"):
            api._run_on_a_thread(run_on_the_thread, [types.SimpleNamespace(stop=stop)])
    finally:
        signal.signal(signal.SIGINT, previous)
        if stop.watchdog is not None:
            stop.watchdog.cancel()
