import json
import sys
import textwrap

import pytest

from lean_rl.config import parse_config
from lean_rl.options import ConfigError
from lean_rl.rollout.base import load_extensions, parse_weight_version
from lean_rl.rollout.evaluation import pass_at_k
from lean_rl.utils.plugins import PluginError


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "hi", "label": "x"}) + "\n")
    return path


def _cfg(tiny_qwen2, prompts, *flags):
    return parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(prompts), *flags])


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
