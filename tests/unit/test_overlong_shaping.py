"""DAPO's soft over-long punishment (lean_rl/algorithms/overlong.py) by hand and against verl's DAPO
reward manager formula: min(-(|y| - (L_max - L_cache)) / L_cache * factor, 0)."""

import pytest

from lean_rl.algorithms.overlong import overlong_penalty


def _verl(length, max_len, buffer_len, factor):
    return min(-(length - (max_len - buffer_len)) / buffer_len * factor, 0)


def test_by_hand():
    # L_max 20, L_cache 5: no penalty up to 15 tokens, then -0.2 per token down to -1 at 20
    assert overlong_penalty(10, 20, 5) == 0.0
    assert overlong_penalty(15, 20, 5) == 0.0
    assert overlong_penalty(16, 20, 5) == pytest.approx(-0.2)
    assert overlong_penalty(18, 20, 5, penalty_factor=0.5) == pytest.approx(-0.3)
    assert overlong_penalty(20, 20, 5) == pytest.approx(-1.0)
    assert overlong_penalty(25, 20, 5) == -1.0  # past the budget (a multi-turn sample's total): -factor


@pytest.mark.parametrize("buffer_len,factor", [(1, 1.0), (4, 0.5), (16, 2.0), (32, 1.0)])
def test_matches_verl(buffer_len, factor):
    for length in range(0, 33):
        assert overlong_penalty(length, 32, buffer_len, factor) == pytest.approx(_verl(length, 32, buffer_len, factor))


def test_bad_buffer():
    with pytest.raises(ValueError, match="--overlong-buffer-len must be in"):
        overlong_penalty(3, 8, 9)


def _samples(lengths_statuses, reward=1.0):
    from lean_rl.sample import Sample, Status

    out = []
    for i, (length, status) in enumerate(lengths_statuses):
        sample = Sample(index=i, group_index=0, prompt="p", tokens=[1, 2])
        sample.append_response(list(range(3, 3 + length)), log_probs=[-1.0] * length, weight_versions=0)
        sample.status, sample.reward = Status(status), reward
        out.append(sample)
    return [out]


def test_shaping_a_step_penalises_and_filters():
    from lean_rl.options import build
    from lean_rl.overlong_shaping import shape_overlong
    from lean_rl.rollout.config import RewardConfig

    groups = _samples([(4, "completed"), (7, "completed"), (8, "truncated"), (8, "failed")])
    reward = build(RewardConfig, overlong_buffer_len=4, overlong_penalty_factor=0.5, overlong_filtering=True)
    metrics = shape_overlong(reward, 8, groups)
    # L_max 8, buffer 4: 4 tokens -> 0; 7 -> -(3/4) * 0.5; 8 -> -0.5; the FAILED sample is left alone
    assert [s.reward for s in groups[0]] == [1.0, pytest.approx(1 - 0.375), pytest.approx(0.5), 1.0]
    assert groups[0][2].loss_mask == [0] * 8 and groups[0][1].loss_mask == [1] * 7 and groups[0][3].loss_mask == [1] * 8
    assert metrics["train/overlong_filtered_frac"] == pytest.approx(1 / 3)
    assert metrics["train/overlong_penalized_frac"] == pytest.approx(2 / 3)
    assert metrics["train/overlong_penalty_mean"] == pytest.approx(-(0.375 + 0.5) / 3)
    assert shape_overlong(build(RewardConfig), 8, groups) == {}  # off by default


def test_flags_are_checked(tiny_qwen2, tmp_path):
    from lean_rl.config import parse_config
    from lean_rl.options import ConfigError

    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "x", "label": "y"}\n')
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--rollout-max-response-len", "16"]
    assert parse_config(base + ["--overlong-buffer-len", "4", "--overlong-filtering"]).reward.overlong_filtering
    with pytest.raises(ConfigError, match="--overlong-buffer-len 32 is more than --rollout-max-response-len 16"):
        parse_config(base + ["--overlong-buffer-len", "32"])
    with pytest.raises(ConfigError, match="--overlong-penalty-factor must be >= 0"):
        parse_config(base + ["--overlong-buffer-len", "4", "--overlong-penalty-factor", "-1"])
