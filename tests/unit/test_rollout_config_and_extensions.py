import json
import sys
import textwrap

import pytest

from lean_rl.config import parse_config
from lean_rl.options import ConfigError
from lean_rl.extensions import load_extensions
from lean_rl.rollout.base import parse_weight_version
from lean_rl.rollout.pass_at_k import pass_at_k
from lean_rl.utils.plugins import PluginError


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "hi", "label": "x"}) + "\n")
    return path


def _cfg(tiny_qwen2, prompts, *flags):
    data = [] if "--data-source-path" in flags else ["--prompt-data", str(prompts)]
    return parse_config(["--hf-checkpoint", str(tiny_qwen2), *data, *flags])


def test_flags_become_typed_config_with_derived_values(tiny_qwen2, prompts):
    cfg = _cfg(tiny_qwen2, prompts, "--rollout-batch-size", "4", "--rollout-temperature", "0.7",
               "--rollout-stop", "</s>", "--sglang-chunked-prefill-size", "512", "--rm-type", "math")
    assert cfg.rollout.over_sampling_batch_size == 4  # defaults to the batch size
    assert cfg.rollout.sampling.to_sglang()["temperature"] == 0.7 and cfg.rollout.sampling.stop == ("</s>",)
    assert "--chunked-prefill-size" in cfg.engines.server_passthrough
    assert cfg.engines.router_url.startswith("http://127.0.0.1:") and len(cfg.engines.engine_urls) == 1
    assert cfg.eval.sampling.max_response_len == cfg.rollout.sampling.max_response_len


@pytest.mark.parametrize("flags, message", [
    (["--rollout-batch-size", "0"], "--rollout-batch-size must be > 0"),
    (["--over-sampling-batch-size", "2", "--rollout-batch-size", "4"], "--over-sampling-batch-size \\(2\\) must be >= --rollout-batch-size \\(4\\)"),
    (["--max-staleness", "-1"], "--max-staleness must be >= 0"),
    (["--rm-type", "remote"], "--rm-type remote needs --rm-url"),
    (["--group-rm"], "--group-rm needs --custom-rm-path"),
    (["--rollout-top-p", "1.5"], "--rollout-top-p must be in"),
    (["--eval-prompt-data", "x", "/nonexistent.jsonl"], "--eval-prompt-data x: file '/nonexistent.jsonl' does not exist"),
])
def test_bad_flags_name_the_flag(tiny_qwen2, prompts, flags, message):
    with pytest.raises(ValueError, match=message):
        _cfg(tiny_qwen2, prompts, *flags)


def test_unknown_flag_is_an_error(tiny_qwen2, prompts):
    with pytest.raises(ConfigError, match="unrecognized arguments: --not-a-flag"):
        _cfg(tiny_qwen2, prompts, "--not-a-flag", "3")


def test_extensions_are_checked_before_anything_starts(tiny_qwen2, prompts, tmp_path, monkeypatch):
    (tmp_path / "ext_mod.py").write_text(textwrap.dedent("""
        def sync_generate(cfg, sample, params):
            return sample
        async def rm(cfg, sample):
            return 1.0
        async def async_filter(cfg, group):
            return True
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    ok = load_extensions(_cfg(tiny_qwen2, prompts, "--custom-rm-path", "ext_mod.rm"))
    assert ok.reward.__name__ == "rm" and ok.generate is None
    with pytest.raises(PluginError, match="--custom-generate-function-path 'ext_mod.sync_generate': must be an `async def`"):
        load_extensions(_cfg(tiny_qwen2, prompts, "--custom-generate-function-path", "ext_mod.sync_generate"))
    with pytest.raises(PluginError, match="--dynamic-sampling-filter-path 'ext_mod.async_filter': must be a plain"):
        load_extensions(_cfg(tiny_qwen2, prompts, "--dynamic-sampling-filter-path", "ext_mod.async_filter"))
    with pytest.raises(PluginError, match="--rollout-function-path 'ext_mod.missing'"):
        load_extensions(_cfg(tiny_qwen2, prompts, "--rollout-function-path", "ext_mod.missing"))
    sys.modules.pop("ext_mod", None)


def test_pass_at_k_matches_the_combinatorial_definition():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 3, 2) == 1.0


def test_weight_version_strings():
    assert parse_weight_version("default") == 0 and parse_weight_version(None) == 0
    assert parse_weight_version("12") == 12


HOOKS = textwrap.dedent("""
    import torch
    from lean_rl.algorithms.hooks import builtin_advantages
    from lean_rl.algorithms.losses import policy_loss
    from lean_rl.buffer.prompt_source import PromptRecord, PromptSource

    async def generate3(cfg, sample, params):
        sample.metadata["seen"] = "3 parameters"
        return sample
    async def generate4(cfg, sample, params, evaluation=False):
        sample.metadata["seen"] = evaluation
        return sample
    async def generate_kw(cfg, sample, params, *, evaluation=False):
        sample.metadata["seen"] = ("keyword", evaluation)
        return sample
    def eval_rollout(cfg, rollout_id, buffer, evaluation=False):
        return None
    def sample_filter(cfg, group):
        return [True] * len(group)
    def process(cfg, groups, rollout_id):
        return None
    def post_process(cfg, group):
        return [s.reward for s in group]
    def loss(algo, **inputs):
        return policy_loss(algo, **inputs)
    def advantages(algo, inputs):
        return builtin_advantages(algo, inputs)
    def source(cfg):
        return PromptSource([PromptRecord(1, "p", (1, 2))])
    async def async_filter(cfg, group):
        return [True]
    def loss_without_keywords(algo, log_probs):
        return None
""")


@pytest.fixture
def hooks_module(tmp_path, monkeypatch):
    (tmp_path / "user_hooks_mod.py").write_text(HOOKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_hooks_mod"
    sys.modules.pop("user_hooks_mod", None)


def test_every_new_hook_is_loaded_and_checked_at_start_up(tiny_qwen2, prompts, hooks_module):
    m = hooks_module
    ext = load_extensions(_cfg(
        tiny_qwen2, prompts, "--eval-function-path", f"{m}.eval_rollout", "--rollout-sample-filter-path",
        f"{m}.sample_filter", "--rollout-all-samples-process-path", f"{m}.process", "--custom-reward-post-process-path",
        f"{m}.post_process", "--custom-loss-function-path", f"{m}.loss", "--custom-advantage-function-path",
        f"{m}.advantages", "--data-source-path", f"{m}.source"))
    named = {name: getattr(ext, name).__name__ for name in (
        "eval_rollout", "sample_filter", "all_samples_process", "reward_post_process", "custom_loss",
        "custom_advantage", "data_source")}
    assert named == {"eval_rollout": "eval_rollout", "sample_filter": "sample_filter", "all_samples_process": "process",
                     "reward_post_process": "post_process", "custom_loss": "loss", "custom_advantage": "advantages",
                     "data_source": "source"}
    assert ext.evaluation_rollout is ext.eval_rollout
    default = load_extensions(_cfg(tiny_qwen2, prompts))
    assert default.evaluation_rollout is default.rollout  # --eval-function-path defaults to the rollout function


@pytest.mark.parametrize("flag, hook, message", [
    ("--rollout-sample-filter-path", "async_filter", "must be a plain `def` function"),
    ("--custom-reward-post-process-path", "generate3", "must be a plain `def` function"),
    ("--rollout-all-samples-process-path", "sample_filter", r"must accept 3 positional argument\(s\)"),
    ("--eval-function-path", "sample_filter", r"must accept 4 positional argument\(s\)"),
    ("--custom-generate-function-path", "sample_filter", "must be an `async def`"),
    ("--custom-loss-function-path", "loss_without_keywords", r"must accept 1 positional argument\(s\) and the keyword "
                                                             r"argument\(s\) log_probs, advantages, mask"),
    ("--custom-advantage-function-path", "process", r"must accept 2 positional argument\(s\)"),
    ("--data-source-path", "missing", "module 'user_hooks_mod' has no attribute 'missing'"),
])
def test_a_bad_new_hook_fails_at_start_up_naming_its_flag(tiny_qwen2, prompts, hooks_module, flag, hook, message):
    with pytest.raises(PluginError, match=rf"^{flag} 'user_hooks_mod.{hook}': {message}"):
        load_extensions(_cfg(tiny_qwen2, prompts, flag, f"{hooks_module}.{hook}"))


@pytest.mark.parametrize("hook, training, evaluation", [
    ("generate3", "3 parameters", "3 parameters"), ("generate4", False, True),
    ("generate_kw", ("keyword", False), ("keyword", True))])
def test_generate_gets_evaluation_when_its_signature_takes_it(tiny_qwen2, prompts, hooks_module, hook, training,
                                                              evaluation):
    import asyncio

    from lean_rl.sample import Sample

    ext = load_extensions(_cfg(tiny_qwen2, prompts, "--custom-generate-function-path", f"{hooks_module}.{hook}"))
    seen = [asyncio.run(ext.generate_call(None, Sample(0, 0, "p", [1]), {}, flag)).metadata["seen"]
            for flag in (False, True)]
    assert seen == [training, evaluation]


def test_data_source_replaces_prompt_data_and_some_hooks_need_a_rollout(tiny_qwen2, hooks_module, prompts):
    cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--data-source-path", f"{hooks_module}.source"])
    # both: the file is the source's to read (slime's data sources read args.prompt_data)
    both = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--data-source-path", f"{hooks_module}.source",
                         "--prompt-data", str(prompts)])
    assert both.data.prompt_data == str(prompts) and both.data.data_source_path == f"{hooks_module}.source"
    assert cfg.data.prompt_data is None and cfg.data.data_source_path == f"{hooks_module}.source"
    with pytest.raises(ConfigError, match="--prompt-data is required \\(or --data-source-path\\)"):
        parse_config(["--hf-checkpoint", str(tiny_qwen2)])
    with pytest.raises(ConfigError, match="--rollout-all-samples-process-path is called at the end of each rollout"):
        _cfg(tiny_qwen2, prompts, "--async-mode", "full", "--max-staleness", "1",
             "--rollout-all-samples-process-path", f"{hooks_module}.process")


def test_custom_config_is_read_once_read_only_and_reaches_the_trainer_side(tiny_qwen2, prompts, tmp_path):
    import pickle

    path = tmp_path / "custom.yaml"
    path.write_text("length_penalty: 0.01\njudge:\n  url: http://127.0.0.1:9\n  retries: [1, 2]\n")
    cfg = _cfg(tiny_qwen2, prompts, "--custom-config-path", str(path), "--reward-key", "acc",
               "--eval-reward-key", "pass")
    assert cfg.custom["length_penalty"] == 0.01 and cfg.custom.judge.url == "http://127.0.0.1:9"
    assert cfg.custom["judge"]["retries"] == (1, 2) and cfg.algorithm.custom == cfg.custom
    assert (cfg.reward.reward_key, cfg.eval.reward_key) == ("acc", "pass")
    with pytest.raises(TypeError):
        cfg.custom["length_penalty"] = 1.0
    with pytest.raises(TypeError, match="cfg.custom is read-only"):
        cfg.custom.judge.url = "elsewhere"
    with pytest.raises(AttributeError, match="cfg.custom has no key 'missing'"):
        cfg.custom.missing
    assert pickle.loads(pickle.dumps(cfg.algorithm)).custom["judge"]["url"] == "http://127.0.0.1:9"
    assert _cfg(tiny_qwen2, prompts).custom == {}


@pytest.mark.parametrize("text, message", [
    ("a: 1\nb: [1, 2\nc: 3\n", r"--custom-config-path: .*custom.yaml:3:\d+: invalid YAML"),
    ("- 1\n- 2\n", "the file must hold a mapping"),
    ("1: x\n", "top-level keys must be strings"),
])
def test_a_bad_custom_config_names_the_file_and_line(tiny_qwen2, prompts, tmp_path, text, message):
    path = tmp_path / "custom.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        _cfg(tiny_qwen2, prompts, "--custom-config-path", str(path))
    with pytest.raises(ConfigError, match="--custom-config-path .*nope.yaml: cannot read the file"):
        _cfg(tiny_qwen2, prompts, "--custom-config-path", str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize("flags, named", [
    ([], "the default generate function"),
    (["--environment-path", "my_pkg.MyEnv"],
     "--environment-path my_pkg.MyEnv (its generate, lean_rl.rollout.multi_turn.generate)"),
    (["--custom-generate-function-path", "my_pkg.gen"], "--custom-generate-function-path my_pkg.gen"),
    (["--environment-path", "my_pkg.MyEnv", "--custom-generate-function-path", "my_pkg.gen"],
     "--custom-generate-function-path my_pkg.gen"),
])
def test_a_bad_generate_return_names_the_flag_the_user_typed(tiny_qwen2, prompts, flags, named):
    from lean_rl.rollout.base import generated_samples
    from lean_rl.utils.plugins import HookReturnError

    cfg = _cfg(tiny_qwen2, prompts, *flags)
    assert cfg.rollout.generate_function_flag == named

    async def generate(cfg, sample, sampling_params):
        return "not a sample"

    with pytest.raises(HookReturnError) as err:
        generated_samples(cfg, generate, "not a sample")
    assert str(err.value).startswith(named)


def test_eval_config_sets_take_the_set_then_defaults_then_the_flags(tiny_qwen2, prompts, tmp_path):
    config = tmp_path / "eval.yaml"
    config.write_text(f"eval:\n  defaults: {{top_p: 0.5, n_samples_per_eval_prompt: 4}}\n  datasets:\n"
                      f"    - {{name: a, path: {prompts}}}\n"
                      f"    - {{name: b, path: {prompts}, top_p: 0.9, rm_type: exact, input_key: q, stop: ['x']}}\n")
    cfg = _cfg(tiny_qwen2, prompts, "--eval-config", str(config), "--eval-temperature", "0.3")
    a, b = cfg.eval.sets
    assert (a.n_samples_per_prompt, a.sampling.top_p, a.sampling.temperature, a.rm_type) == (4, 0.5, 0.3, None)
    assert (b.sampling.top_p, b.rm_type, dict(b.data_overrides), b.sampling.stop) == (0.9, "exact", {"input_key": "q"},
                                                                                      ("x",))
    assert cfg.eval.datasets == (("a", str(prompts)), ("b", str(prompts)))
    plain = _cfg(tiny_qwen2, prompts, "--eval-prompt-data", "p", str(prompts), "--n-samples-per-eval-prompt", "2")
    assert [(s.name, s.n_samples_per_prompt) for s in plain.eval.sets] == [("p", 2)]


@pytest.mark.parametrize("body, message", [
    ("eval:\n  datasets: []\n", "expected `eval:"),
    ("eval:\n  datasets:\n    - {name: a}\n", "datasets\\[0\\] needs a name and a path"),
    ("eval:\n  datasets:\n    - {name: a, path: p, min_new_tokens: 3}\n", "a: key 'min_new_tokens' is not one"),
    ("eval:\n  datasets:\n    - {name: a, path: p, rm_type: dapo}\n", "a: rm_type 'dapo': choose one of"),
    ("eval:\n  datasets:\n    - {name: a, path: p}\n    - {name: a, path: q}\n", "two sets share a name"),
])
def test_a_bad_eval_config_names_the_file_and_the_set(tiny_qwen2, prompts, tmp_path, body, message):
    config = tmp_path / "eval.yaml"
    config.write_text(body)
    with pytest.raises(ConfigError, match=f"--eval-config {config}: .*{message}"):
        _cfg(tiny_qwen2, prompts, "--eval-config", str(config))


def test_verifiers_env_runs_its_generate_and_feeds_its_dataset_unless_prompts_are_given(tiny_qwen2, prompts):
    from lean_rl.rollout.config import VERIFIERS_GENERATE, VERIFIERS_PROMPTS

    cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--verifiers-env", "my_envs.load_environment"])
    assert cfg.rollout.custom_generate_function_path == VERIFIERS_GENERATE
    assert cfg.data.data_source_path == VERIFIERS_PROMPTS and cfg.data.prompt_data is None
    assert cfg.rollout.generate_function_flag.startswith("--verifiers-env my_envs.load_environment")
    own = _cfg(tiny_qwen2, prompts, "--verifiers-env", "my_envs.load_environment")
    assert own.data.prompt_data == str(prompts) and own.data.data_source_path is None


def test_verifiers_env_without_the_library_says_how_to_install_it(monkeypatch):
    import sys

    from lean_rl.rollout.verifiers_env import load_environment
    from lean_rl.utils.plugins import PluginError

    monkeypatch.setitem(sys.modules, "verifiers", None)  # as on the core install: `import verifiers` fails
    load_environment.cache_clear()
    with pytest.raises(PluginError, match="--verifiers-env my_envs.load: the verifiers library is not installed.*"
                                          "pip install -r requirements-envs.txt"):
        load_environment("my_envs.load")
