"""--loss-type sft_loss: the loss (algorithms/losses.sft_loss), the conversation's loss mask
(rollout/sft.py) and the flags that go with it (config.parse_config)."""

import json

import pytest
import torch

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.hooks import loss_function
from lean_rl.algorithms.losses import aggregation_weights, sft_loss
from lean_rl.options import ConfigError, build
from lean_rl.rollout.sft import conversation_tokens, fill_sample
from lean_rl.sample import Sample

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "two plus two"},
        {"role": "assistant", "content": "four"}, {"role": "user", "content": "and three"},
        {"role": "assistant", "content": "seven"}]


def test_sft_loss_is_the_mean_negative_log_likelihood_of_the_masked_tokens():
    log_probs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]])
    weights = aggregation_weights(mask, "token-mean")
    loss, metrics = sft_loss(build(AlgorithmConfig, loss_type="sft_loss"), log_probs=log_probs, mask=mask, weights=weights,
                             metric_weights=weights, advantages=torch.zeros(2, 3))
    assert loss.item() == pytest.approx((1 + 3 + 0.5 + 4) / 4) and metrics["sft_loss"].item() == pytest.approx(2.125)
    loss.backward()  # only the trained tokens get a gradient, each -1/4
    assert log_probs.grad.tolist() == [[-0.25, 0.0, -0.25], [-0.25, -0.25, 0.0]]


def test_loss_type_chooses_the_loss_and_agrees_with_the_custom_path():
    assert loss_function(build(AlgorithmConfig, loss_type="sft_loss")) is sft_loss
    assert build(AlgorithmConfig).loss_type == "policy_loss"
    assert build(AlgorithmConfig, custom_loss_function_path="m.f").loss_type == "custom_loss"
    with pytest.raises(ConfigError, match="--loss-type custom_loss needs --custom-loss-function-path"):
        build(AlgorithmConfig, loss_type="custom_loss")
    with pytest.raises(ConfigError, match="it needs --loss-type custom_loss, not sft_loss"):
        build(AlgorithmConfig, loss_type="sft_loss", custom_loss_function_path="m.f")


def test_only_the_assistant_turns_are_trained(tiny_qwen2):
    from lean_rl.buffer.prompt_source import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_qwen2))
    tokens, mask = conversation_tokens(tokenizer, CHAT)
    whole = tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert tokenizer.decode(tokens) == whole  # the rendering of the whole conversation, nothing lost
    trained = tokenizer.decode([t for t, m in zip(tokens, mask) if m])
    assert "four" in trained and "seven" in trained
    assert "two plus two" not in trained and "and three" not in trained and "be brief" not in trained
    sample = fill_sample(Sample(index=0, group_index=0, prompt=CHAT, tokens=[]), tokens, mask)
    assert sample.loss_mask[0] == 1 and sample.loss_mask.count(1) == sum(mask)  # the prompt ends where training starts
    with pytest.raises(ValueError, match="no assistant message"):
        conversation_tokens(tokenizer, CHAT[:2])


def test_sft_flags_are_checked_at_parse_time(tmp_path, tiny_qwen2):
    from lean_rl.config import parse_config

    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"messages": CHAT}) + "\n")
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--input-key", "messages",
            "--loss-type", "sft_loss", "--n-samples-per-prompt", "1", "--rollout-batch-size", "1"]
    cfg = parse_config(base + ["--apply-chat-template"])
    assert not cfg.starts_engines and cfg.rollout.rollout_function_path == "lean_rl.rollout.sft.generate_rollout"
    with pytest.raises(ConfigError, match="pass --apply-chat-template"):
        parse_config(base)
    with pytest.raises(ConfigError, match="--n-samples-per-prompt 1, got 4"):
        parse_config(base + ["--apply-chat-template", "--n-samples-per-prompt", "4"])
