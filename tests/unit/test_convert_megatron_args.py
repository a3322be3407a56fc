"""Megatron architecture flags derived from HF configs: scripts/models/*.sh are exactly what the
derivation prints for the published config.json of each model (so they cannot drift), they are valid
bash, they parse back to the HF architecture, and flags that contradict an HF config are errors."""

from __future__ import annotations

import argparse
import shlex
import subprocess
from pathlib import Path

import pytest
from published_hf_configs import PUBLISHED

from lean_rl.backends.megatron.arch_flags import (
    FREE_FIELDS,
    arch_flags,
    check_given_flags,
    given_model_flags_parser,
    model_args_script,
)
from lean_rl.backends.megatron.config import ModelFlags
from lean_rl.backends.megatron.model_arch import ModelArch
from lean_rl.backends.megatron.hf_config import arch_from_hf_config
from lean_rl.options import ConfigError, add_options, read_options

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "models"


def model_args_of(script: Path) -> list[str]:
    lines = script.read_text().split("MODEL_ARGS=(", 1)[1].split("\n)", 1)[0]
    return shlex.split(lines, comments=True)


def arch_of(flags: list[str]) -> ModelArch:
    return read_options(ModelFlags, add_options(argparse.ArgumentParser(), ModelFlags).parse_args(flags)).arch()


def same_architecture(a: ModelArch, b: ModelArch) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in ModelArch.__dataclass_fields__ if f not in FREE_FIELDS)


def test_every_script_has_a_published_config_and_back():
    assert sorted(p.stem for p in SCRIPTS.glob("*.sh")) == sorted(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_script_is_what_the_derivation_prints(name):
    script = SCRIPTS / f"{name}.sh"
    assert script.read_text() == model_args_script(PUBLISHED[name], title=name)
    expected = arch_from_hf_config(PUBLISHED[name])
    assert same_architecture(arch_of(model_args_of(script)), expected)
    sourced = subprocess.run(["bash", "-c", f'source "{script}" && printf "%s\\n" "${{MODEL_ARGS[@]}}"'],
                             capture_output=True, text=True, check=True).stdout.split("\n")[:-1]
    assert sourced == model_args_of(script)


def test_published_values_reach_the_flags():
    qwen3_moe = {flag[0]: flag[1:] and flag[1] for flag in arch_flags(arch_from_hf_config(PUBLISHED["qwen3-30B-A3B"]))}
    assert qwen3_moe["--kv-channels"] == "128" and qwen3_moe["--num-experts"] == "128"
    assert qwen3_moe["--moe-ffn-hidden-size"] == "768" and qwen3_moe["--moe-router-topk"] == "8"
    assert "--moe-router-pre-softmax" not in qwen3_moe  # norm_topk_prob: renormalised top-k
    assert "--untie-embeddings-and-output-weights" in qwen3_moe and "--qk-layernorm" in qwen3_moe
    qwen25 = [f[0] for f in arch_flags(arch_from_hf_config(PUBLISHED["qwen2.5-0.5B"]))]
    assert "--add-qkv-bias" in qwen25 and "--untie-embeddings-and-output-weights" not in qwen25
    llama = arch_from_hf_config(PUBLISHED["llama3-8B"])
    assert (llama.rotary_base, llama.norm_epsilon, llama.num_query_groups) == (500000.0, 1e-5, 8)


def given(*argv: str) -> dict:
    return vars(given_model_flags_parser().parse_args(list(argv)))


def test_given_flags_are_only_those_typed():
    assert given() == {}
    assert given("--normalization", "LayerNorm", "--swiglu") == {"normalization": "LayerNorm", "swiglu": True}


def test_agreeing_flags_pass_and_free_flags_are_free(tiny_model_factory):
    hf_arch = arch_from_hf_config(tiny_model_factory("qwen2"))
    typed = [part for flag in arch_flags(hf_arch) for part in flag]
    assert same_architecture(check_given_flags(given(*typed), hf_arch, "tiny"), hf_arch)
    assert check_given_flags(given("--seq-length", "256"), hf_arch, "tiny").seq_length == 256


@pytest.mark.parametrize("argv, message", [
    (["--hidden-size", "128"], r"--hidden-size gives hidden_size=128 but the HF config \(hidden_size\) gives 64"),
    (["--normalization", "LayerNorm"], r"--normalization gives normalization='LayerNorm' .* gives 'RMSNorm'"),
    (["--qk-layernorm"], r"--qk-layernorm gives qk_layernorm=True .* gives False"),
    (["--rotary-base", "500000"], r"--rotary-base gives rotary_base=500000.0 but the HF config \(rope_theta\) gives 10000.0"),
    (["--group-query-attention", "--num-query-groups", "4"],
     r"--num-query-groups gives num_query_groups=4 but the HF config \(num_key_value_heads\) gives 2"),
])
def test_contradicting_flags_name_flag_and_both_values(tiny_model_factory, argv, message):
    hf_arch = arch_from_hf_config(tiny_model_factory("qwen2"))
    with pytest.raises(ConfigError, match=message):
        check_given_flags(given(*argv), hf_arch, "tiny")
