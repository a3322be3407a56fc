"""lean_rl's slime compatibility modules (lean_rl/slime_compat): `slime.*` imports served by lean_rl,
the `args` view, the sample conversion both ways (versions, log-probs, status, prompt, attributes),
slime's hook contracts, rm_hub and filter_hub. Pure logic: no engine (tests/e2e/test_slime_compat_run.py
runs slime-style functions against real engines)."""

import asyncio
import collections
import copy
import json
import subprocess
import sys
import textwrap
import types

import pytest

from lean_rl.backends.sglang.server_command import server_flags
from lean_rl.config import parse_config
from lean_rl.extensions import load_extensions
from lean_rl.sample import NOT_GENERATED, Sample, Status
from lean_rl.slime_compat import convert
from lean_rl.slime_compat.args import build_args
from lean_rl.utils.slime_finder import install_slime_finder
from lean_rl.slime_compat.hooks import is_slime_function
from lean_rl.slime_compat.run_state import GenerateAnswer, bind_run
from lean_rl.train_hooks import before_training

install_slime_finder()
from slime.rollout.filter_hub.dynamic_sampling_filters import (  # noqa: E402  served by lean_rl
    check_reward_nonzero_std, check_reward_nonzero_std_with_fallback)
from slime.rollout.rm_hub import async_rm  # noqa: E402
from slime.utils.types import Sample as SlimeSample  # noqa: E402


@pytest.fixture
def make_cfg(tiny_qwen2, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": [{"role": "user", "content": "2+2?"}], "label": "4"}) + "\n")

    def make(*extra):
        cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--apply-chat-template",
                            "--output-dir", str(tmp_path / "out"), *extra])
        cfg.engines.live.publish(["http://127.0.0.1:31001"], "http://127.0.0.1:31000")
        bind_run(cfg)
        return cfg
    return make


def test_a_slime_generate_body_for_the_run_names_the_adapter_the_engines_serve(make_cfg):
    from lean_rl.slime_compat.http_utils import _served_by_policy

    cfg = make_cfg("--lora-rank", "4")
    assert cfg.engines.adapter_name == "policy" and cfg.weight_sync.transport == "adapter"
    body = {"input_ids": [1, 2], "sampling_params": {}}
    assert _served_by_policy("http://127.0.0.1:31000/generate", body) == {**body, "lora_path": "policy"}
    assert _served_by_policy("http://127.0.0.1:31001/generate", body)["lora_path"] == "policy"  # an engine of ours
    assert _served_by_policy("http://127.0.0.1:9/generate", body) is body  # not ours: a user's own server
    assert _served_by_policy("http://127.0.0.1:31000/health_generate", body) is body
    own = {**body, "lora_path": "other"}
    assert _served_by_policy("http://127.0.0.1:31000/generate", own) is own  # a body that names one keeps it
    make_cfg()  # without LoRA nothing is added
    assert _served_by_policy("http://127.0.0.1:31000/generate", body) is body


def prompt_sample(cfg, prompt_ids=(5, 6, 7)):
    return Sample(index=3, group_index=1, prompt=[{"role": "user", "content": "2+2?"}], tokens=list(prompt_ids),
                  label="4", metadata={"row": 9})


def test_slime_imports_resolve_to_lean_rls_modules():
    import slime.rollout.sglang_rollout as sglang_rollout
    import slime.utils.http_utils as http_utils
    from slime.utils.misc import SingletonMeta, load_function

    assert SlimeSample.__module__ == "lean_rl.slime_compat.types"
    assert http_utils.post.__module__ == "lean_rl.slime_compat.http_utils"
    assert sglang_rollout.GenerateState.__class__ is SingletonMeta
    assert load_function("slime.utils.types.Sample") is SlimeSample
    with pytest.raises(ModuleNotFoundError):
        import slime.agent.sandbox  # noqa: F401  not served: fails as it would without slime


def test_a_real_slime_is_left_alone(tmp_path):
    (tmp_path / "slime" / "utils").mkdir(parents=True)
    (tmp_path / "slime" / "__init__.py").write_text("")
    (tmp_path / "slime" / "utils" / "__init__.py").write_text("")
    (tmp_path / "slime" / "utils" / "types.py").write_text("REAL = True\n")
    code = textwrap.dedent("""
        import logging; logging.basicConfig(level=logging.INFO)
        from lean_rl.utils.slime_finder import install_slime_finder
        print("USING", install_slime_finder())
        import slime.utils.types as t
        print("REAL", getattr(t, "REAL", False))
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                            env={"PYTHONPATH": f"{tmp_path}:{':'.join(sys.path)}"})
    assert result.returncode == 0, result.stderr
    assert f"USING {tmp_path}/slime/__init__.py" in result.stdout and "REAL True" in result.stdout
    assert "slime is installed" in result.stderr


def test_args_view_has_slimes_names_is_mutable_and_deep_copies(make_cfg, tmp_path):
    custom = tmp_path / "c.yaml"
    custom.write_text("max_turns: 3\n")
    cfg = make_cfg("--rollout-temperature", "0.7", "--custom-config-path", str(custom), "--partial-rollout")
    args = build_args(cfg)
    assert (args.sglang_router_ip, args.sglang_router_port) == ("127.0.0.1", 31000)
    assert args.rollout_temperature == 0.7 and args.partial_rollout is True and args.max_turns == 3
    assert args.hf_checkpoint == cfg.engines.model_path and args.n_samples_per_prompt == cfg.rollout.n_samples_per_prompt
    assert args.rollout_max_context_len is None and args.sglang_server_concurrency >= 1
    args.max_turns = 5
    assert copy.deepcopy(args).max_turns == 5


def test_to_slime_renders_the_prompt_and_from_slime_restores_it(make_cfg, tiny_qwen2):
    import transformers

    cfg = make_cfg()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_qwen2)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False,
                                             add_generation_prompt=True)
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    original = prompt_sample(cfg, ids)
    slime = convert.to_slime(cfg, original)
    assert slime.prompt == rendered and slime.tokens == ids and slime.loss_mask is None
    assert slime.status is SlimeSample.Status.PENDING and slime.metadata is original.metadata
    slime.append_response_tokens(None, tokens=[1, 2], log_probs=[-0.1, -0.2],
                                 meta_info={"weight_version": "4", "finish_reason": {"type": "stop"}}, text="ab")
    back = convert.from_slime(cfg, slime, original, [GenerateAnswer([1, 2], [4, 4], False)], False, "--flag")
    assert back.prompt == original.prompt and back.status is Status.COMPLETED and back.weight_versions == [4, 4]
    assert original.response_length == 0  # the sample handed over is left as it was


def test_versions_come_from_the_answers_token_by_token():
    # policy [1 2] (v3), tool [9 9], policy [4 5] (v4): each token gets its answer's version
    versions = convert.response_versions([1, 2, 9, 9, 4, 5], [1, 1, 0, 0, 1, 1],
                                         [GenerateAnswer([1, 2], [3, 3], False), GenerateAnswer([4, 5], [4, 4], False)],
                                         [], "w")
    assert versions == [3, 3, NOT_GENERATED, NOT_GENERATED, 4, 4]
    # the second answer's ids also occur in the tool's text before it: only trainable tokens are its own
    versions = convert.response_versions([1, 7, 9, 7], [1, 0, 0, 1],
                                         [GenerateAnswer([1], [3], False), GenerateAnswer([7], [4], False)], [], "w")
    assert versions == [3, NOT_GENERATED, NOT_GENERATED, 4]
    # the function re-tokenised the text (ids no answer holds): one version seen is still exact
    assert convert.response_versions([8, 8], [1, 1], [GenerateAnswer([1, 2], [3, 3], False)], [], "w") == [3, 3]
    with pytest.raises(ValueError, match=r"policy versions \[3, 4\]: which one made them is unknown"):
        convert.response_versions([8, 8], [1, 1], [GenerateAnswer([1], [3], False), GenerateAnswer([2], [4], False)],
                                  [], "w")
    with pytest.raises(ValueError, match="no /generate answer was seen"):
        convert.response_versions([8], [1], [], [], "w")
    # a resumed response keeps the versions of what it had
    assert convert.response_versions([1, 2, 3], [1, 1, 1], [GenerateAnswer([3], [6], False)], [5, 5], "w") == [5, 5, 6]


def test_missing_log_probs_train_but_are_refused_under_tis(make_cfg):
    for extra, refused in (((), False), (("--use-tis",), True)):
        cfg = make_cfg(*extra)
        original = prompt_sample(cfg)
        slime = convert.to_slime(cfg, original)
        slime.tokens, slime.response_length, slime.status = [5, 6, 7, 1, 2], 2, SlimeSample.Status.COMPLETED
        answers = [GenerateAnswer([1, 2], [0, 0], False)]
        if refused:
            with pytest.raises(ValueError, match="no rollout_log_probs, which --use-tis needs"):
                convert.from_slime(cfg, slime, original, answers, False, "--custom-generate-function-path f")
        else:
            back = convert.from_slime(cfg, slime, original, answers, False, "--flag")
            assert back.rollout_log_probs == [0.0, 0.0] and back.loss_mask == [1, 1]
            assert back.metadata["rollout_log_probs_missing"] is True


@pytest.mark.parametrize("status, remove, stopping, expected", [
    ("aborted", False, False, Status.FAILED),   # slime's "failed": never requeued forever
    ("aborted", False, True, Status.ABORTED),   # lean_rl aborted it (surplus / weight update): resumed
    ("completed", True, False, Status.FAILED),  # remove_sample
    ("pending", False, False, Status.COMPLETED),
    ("truncated", False, False, Status.TRUNCATED),
])
def test_status_at_the_boundary(make_cfg, status, remove, stopping, expected):
    cfg = make_cfg()
    original = prompt_sample(cfg)
    slime = convert.to_slime(cfg, original)
    slime.append_response_tokens(None, tokens=[1], log_probs=[-1.0])
    slime.status, slime.remove_sample = SlimeSample.Status(status), remove
    back = convert.from_slime(cfg, slime, original, [GenerateAnswer([1], [0], False)], stopping, "--flag")
    assert back.status is expected
    assert (expected is Status.FAILED) == ("generate_error" in back.metadata)


def test_ad_hoc_attributes_survive_the_round_trip(make_cfg):
    cfg = make_cfg()
    original = prompt_sample(cfg)
    slime = convert.to_slime(cfg, original)
    slime.append_response_tokens(None, tokens=[1], log_probs=[-1.0])
    slime.tool_calls, slime.session_id = ["search"], "s-1"
    back = convert.from_slime(cfg, slime, original, [GenerateAnswer([1], [0], False)], False, "--flag")
    assert back.metadata["slime_attributes"] == {"tool_calls": ["search"], "session_id": "s-1"}
    again = convert.to_slime(cfg, back)
    assert again.tool_calls == ["search"] and again.session_id == "s-1"
    assert Sample.from_dict(json.loads(json.dumps(back.to_dict()))).metadata == back.metadata  # saved and loaded


def test_slime_sample_api():
    s = SlimeSample(tokens=[1], reward={"acc": 1.0, "fmt": 0.5})
    s.append_response_tokens(None, tokens=[2, 3], log_probs=[-0.1, -0.2])
    s.append_response_tokens(None, tokens=[4], trainable=False)
    assert s.loss_mask == [1, 1, 0] and s.rollout_log_probs == [-0.1, -0.2, 0.0] and s.effective_response_length == 2
    assert s.get_reward_value(types.SimpleNamespace(reward_key="fmt")) == 0.5
    s.extra = 1
    t = SlimeSample.from_dict(s.to_dict())
    assert t.extra == 1 and t.tokens == [1, 2, 3, 4] and t.status is SlimeSample.Status.PENDING
    with pytest.raises(ValueError, match="require rollout log probabilities"):
        s.append_response_tokens(None, tokens=[5])


def test_filter_hub():
    args = types.SimpleNamespace(reward_key=None)
    same = [SlimeSample(reward=1.0), SlimeSample(reward=1.0)]
    varied = [SlimeSample(reward=1.0), SlimeSample(reward=0.0)]
    assert check_reward_nonzero_std(args, varied).keep is True
    out = check_reward_nonzero_std(args, same)
    assert (out.keep, out.reason) == (False, "zero_std_1.0")
    assert check_reward_nonzero_std_with_fallback(args, same).keep_when_insufficient is True


def test_rm_hub_rewards(make_cfg):
    cfg = make_cfg()

    def score(rm_type, response, label, metadata=None):
        args = types.SimpleNamespace(rm_type=rm_type, custom_rm_path=None)
        return asyncio.run(async_rm(args, SlimeSample(response=response, label=label, metadata=metadata or {})))

    assert score("deepscaler", "think</think> so \\boxed{\\frac{1}{2}}", "0.5") == 1
    assert score("deepscaler", "no think tag \\boxed{4}", "4") == 0
    assert score("math", "x = \\boxed{4}", "4") == 1 and score("math", "\\boxed{5}", "4") == 0
    assert score("dapo", "work... Answer: 42", "42") == {"score": 1.0, "acc": True, "pred": "42"}
    assert score("dapo", "Answer: 41", "42")["score"] == -1.0
    assert score("f1", "the Eiffel tower", "Eiffel Tower") == 1.0
    assert score("boxed_f1", "so \\boxed{Paris}", "paris") == 1.0
    assert score("gpqa", "The answer is (C).", "C") == 1.0 and score("gpqa", "answer: B", "C") == 0.0
    assert score("random", "", "") in (0, 1)
    with pytest.raises(NotImplementedError, match="ifbench"):
        score("ifbench", "", "")
    assert cfg  # the math rewards grade in the bound run's worker


SLIME_HOOKS = '''
from slime.utils.types import Sample

def sample_filter(args, data):
    for group in data:
        for sample in group:
            sample.remove_sample = sample.reward < 0.5

def post_process(args, samples):
    raw = [s.get_reward_value(args) for s in samples]
    mean = sum(raw) / len(raw)
    return raw, [r - mean for r in raw]   # over the whole rollout, as slime calls it
'''


def test_slime_sample_filter_and_reward_post_process_run_over_the_rollout(make_cfg, monkeypatch):
    module = types.ModuleType("slime_style_hooks")
    exec(SLIME_HOOKS, module.__dict__)
    monkeypatch.setitem(sys.modules, "slime_style_hooks", module)
    cfg = make_cfg("--rollout-sample-filter-path", "slime_style_hooks.sample_filter",
                   "--custom-reward-post-process-path", "slime_style_hooks.post_process", "--rm-type", "exact")
    assert is_slime_function(module.sample_filter)
    extensions = load_extensions(cfg)

    def done(index, group, reward):
        s = prompt_sample(cfg)
        s.index, s.group_index, s.reward, s.status = index, group, reward, Status.COMPLETED
        s.append_response([1, 2], log_probs=[-1.0, -1.0], weight_versions=0)
        return s

    groups = [[done(0, 0, 1.0), done(1, 0, 0.0)], [done(2, 1, 1.0), done(3, 1, 1.0)]]
    metrics = before_training(cfg, extensions, groups)
    assert metrics["train/samples_rejected"] == 1.0 and groups[0][1].loss_mask == [0, 0]
    assert [s.reward for g in groups for s in g] == [0.25, -0.75, 0.25, 0.25]  # the rollout's mean, 0.75, off


def test_a_lean_rl_hook_is_not_taken_for_a_slime_one():
    from lean_rl.rollout import filters

    assert not is_slime_function(filters.reward_varies)
    assert is_slime_function(check_reward_nonzero_std)


SAMPLE_HOOKS = '''
from slime.utils.types import Sample

def tag(args, sample, *, evaluation=False):
    sample.metadata["hooked"] = evaluation
    sample.note = "seen"

async def replace(args, sample, **kwargs):
    return Sample.from_dict({**sample.to_dict(), "label": "relabelled"})
'''


def test_rollout_sample_hooks_run_in_order_after_any_generate(make_cfg, monkeypatch):
    module = types.ModuleType("slime_sample_hooks")
    exec(SAMPLE_HOOKS, module.__dict__)
    monkeypatch.setitem(sys.modules, "slime_sample_hooks", module)
    cfg = make_cfg("--rollout-sample-hook-path", "slime_sample_hooks.tag",
                   "--rollout-sample-hook-path", "slime_sample_hooks.replace", "--rm-type", "exact")
    assert cfg.rollout.rollout_sample_hook_path == ("slime_sample_hooks.tag", "slime_sample_hooks.replace")
    extensions = load_extensions(cfg)

    async def made_by_lean_rl(cfg, sample, params, evaluation):
        sample.append_response([1, 2], log_probs=[-1.0, -1.0], weight_versions=[7, 7])
        sample.status = Status.COMPLETED
        return sample

    monkeypatch.setattr(extensions.generate, "call", made_by_lean_rl)  # the default generate, engines aside
    out = asyncio.run(extensions.generate_call(cfg, prompt_sample(cfg), {}, True))
    assert out.label == "relabelled" and out.metadata["hooked"] is True
    assert out.metadata["slime_attributes"] == {"note": "seen"} and out.weight_versions == [7, 7]


def test_lora_runs_start_the_engines_with_the_adapter_and_teachers_without(make_cfg, tiny_qwen2):
    """--lora-rank: the policy's servers get SGLang's LoRA flags (the torch_native backend on CPU); a
    --lora-sync merged run and the distillation teacher's servers serve plain weights."""
    flags = server_flags(make_cfg("--lora-rank", "4", "--lora-target-modules", "linear_qkv", "--use-opd", "--opd-type",
                                  "sglang", "--opd-teacher-hf-checkpoint", str(tiny_qwen2)).engines, 0, 30000)
    start = flags.index("--lora-target-modules")
    assert flags[start + 1:start + 4] == ["q_proj", "k_proj", "v_proj"]
    assert {"--enable-lora", "--max-lora-rank", "--lora-backend", "torch_native"} <= set(flags)
    cfg = make_cfg("--lora-rank", "4", "--use-opd", "--opd-type", "sglang", "--opd-teacher-hf-checkpoint", str(tiny_qwen2))
    assert "--enable-lora" not in server_flags(cfg.distillation.teacher_engines, 0, 30000)
    merged = make_cfg("--lora-rank", "4", "--lora-sync", "merged")
    assert merged.engines.adapter is None and merged.weight_sync.transport != "adapter"
    assert "--enable-lora" not in server_flags(merged.engines, 0, 30000)


def test_slimes_counters_cross_the_boundary_as_json(make_cfg):
    cfg = make_cfg()
    original = prompt_sample(cfg)
    slime = convert.to_slime(cfg, original)
    slime.append_response_tokens(None, tokens=[1], log_probs=[-1.0], meta_info={
        "weight_version": "0", "finish_reason": {"type": "stop"}, "cached_tokens": 2, "prompt_tokens": 3})
    back = convert.from_slime(cfg, slime, original, [GenerateAnswer([1], [0], False)], False, "--flag")
    assert back.metadata["slime_attributes"] == {"prefix_cache_info": {"cached_tokens": 2, "total_prompt_tokens": 3}}
    json.dumps(back.to_dict())  # the sample dumps hold it
    again = convert.to_slime(cfg, back)
    assert again.prefix_cache_info == SlimeSample.PrefixCacheInfo(cached_tokens=2, total_prompt_tokens=3)


RETOOL_STYLE_REWARD = '''
from slime.utils.types import Sample

async def reward_func(args, sample, **kwargs):
    seen = sample.reward  # on a second call: the dict of the first, whole
    return {"score": -1.0 if seen is None else 0.5, "acc": False, "pred": "42", "seen": seen}
'''


def test_a_slime_reward_dict_may_hold_entries_that_are_no_numbers(make_cfg, monkeypatch):
    from lean_rl.rollout.reward_scoring import score_group

    module = types.ModuleType("retool_style_reward")
    exec(RETOOL_STYLE_REWARD, module.__dict__)
    monkeypatch.setitem(sys.modules, "retool_style_reward", module)
    cfg = make_cfg("--custom-rm-path", "retool_style_reward.reward_func", "--reward-key", "score")
    extensions = load_extensions(cfg)
    sample = prompt_sample(cfg)
    sample.append_response([1], log_probs=[-1.0], weight_versions=0)
    sample.status = Status.COMPLETED
    counters = collections.Counter()
    asyncio.run(score_group(cfg, [sample], extensions.reward, False, counters))
    # slime trains the --reward-key entry; the text and the nested value stay for slime's functions
    assert sample.reward == -1.0 and counters["reward_failed"] == 0
    assert sample.metadata["rewards"] == {"score": -1.0, "acc": False}
    assert sample.metadata["slime_reward_details"] == {"pred": "42", "seen": None}
    json.dumps(sample.to_dict())
    assert convert.to_slime(cfg, sample).reward == {"score": -1.0, "acc": False, "pred": "42", "seen": None}


def test_slime_calls_carry_the_key_only_to_the_runs_own_listeners(make_cfg, tmp_path):
    """slime's post/get add the run's key on URLs of the run only, and there only when the listener
    proves to be the run's (listener_check.py): a squatter on an engine's address gets no key."""
    import asyncio

    from lean_rl.slime_compat import http_utils
    from tests.unit.test_listener_check import start_server

    cfg = make_cfg()
    key = cfg.engines.api_key
    ours, squatter, elsewhere = start_server(tmp_path, key), start_server(tmp_path, None), start_server(tmp_path, None)
    try:
        cfg.engines.live.publish([squatter.url], ours.url)
        asyncio.run(http_utils.get(f"{ours.url}/workers"))
        asyncio.run(http_utils.post(f"{ours.url}/flush_cache", {}))
        with pytest.raises(RuntimeError, match="not by a server of this run"):
            asyncio.run(http_utils.post(f"{squatter.url}/flush_cache", {}, max_retries=2))
        asyncio.run(http_utils.post(f"{elsewhere.url}/score", {}))  # not the run's: a user's server, no key
        assert [auth for path, auth in ours.seen() if path != "/health"] == [f"Bearer {key}"] * 2
        assert all(auth is None for _, auth in squatter.seen() + elsewhere.seen())
    finally:
        for server in (ours, squatter, elsewhere):
            server.proc.kill()
            server.proc.wait()
