"""The preference pairs' rollout pieces (lean_rl/rollout/preference.py) and the flags of --loss-type
dpo_loss / rm_loss (rollout/preference_config.py via config.parse_config)."""

import json

import pytest
import transformers

from lean_rl.options import ConfigError
from lean_rl.buffer.preference_pairs import read_pairs
from lean_rl.rollout.preference import fill_pair_sample, response_tokens
from lean_rl.sample import Sample


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_pairs_are_read_and_bad_rows_named(tmp_path):
    good = _write(tmp_path / "good.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"}])
    assert read_pairs(str(good), "chosen", "rejected") == {1: ("a", "b")}
    bad = _write(tmp_path / "bad.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "q", "chosen": "a"}])
    with pytest.raises(ValueError, match=rf"--prompt-data {bad} row 2: missing field 'rejected' \(--rejected-key\)"):
        read_pairs(str(bad), "chosen", "rejected")
    empty = _write(tmp_path / "empty.jsonl", [{"prompt": "p", "good": "", "rejected": "b"}])
    with pytest.raises(ValueError, match=r"row 1: field 'good' \(--chosen-key\) must be non-empty text"):
        read_pairs(str(empty), "good", "rejected")


def test_pairs_of_token_ids(tmp_path, tiny_qwen2):
    """A policy's own samples as pairs: token ids taken as they are (a lone byte token would not survive
    decoding and re-tokenizing), EOS appended for DPO only; ids past the vocabulary or not ints are named."""
    ids = _write(tmp_path / "ids.jsonl", [{"prompt": "p", "chosen": [7, 8], "rejected": "b"}])
    assert read_pairs(str(ids), "chosen", "rejected") == {1: ([7, 8], "b")}
    for bad in ([], [1.5], [True], [-1]):
        path = _write(tmp_path / "bad_ids.jsonl", [{"prompt": "p", "chosen": "a", "rejected": bad}])
        with pytest.raises(ValueError, match=r"row 1: field 'rejected' \(--rejected-key\) must be non-empty text or a "
                                             r"non-empty list of token ids"):
            read_pairs.__wrapped__(str(path), "chosen", "rejected")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_qwen2)
    byte_token = next(t for t in range(len(tokenizer)) if tokenizer.decode([t]) == "\ufffd")
    assert tokenizer(tokenizer.decode([byte_token]), add_special_tokens=False)["input_ids"] != [byte_token]
    assert response_tokens(tokenizer, [byte_token, 9], eos=False) == [byte_token, 9]
    assert response_tokens(tokenizer, [byte_token, 9], eos=True) == [byte_token, 9, tokenizer.eos_token_id]
    with pytest.raises(ValueError, match=rf"token id {len(tokenizer)} is past the tokenizer's {len(tokenizer)} tokens"):
        response_tokens(tokenizer, [1, len(tokenizer)], eos=False)


def test_samples_of_a_pair(tiny_qwen2):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_qwen2)
    response = response_tokens(tokenizer, "1 2 3", eos=True)
    assert response[-1] == tokenizer.eos_token_id
    dpo = fill_pair_sample(Sample(0, 0, "p", [5, 6]), [5, 6], response, 1.0, score_only=False, placeholder=2)
    assert dpo.tokens == [5, 6, *response] and dpo.loss_mask == [1] * len(response) and dpo.reward == 1.0
    rm = fill_pair_sample(Sample(1, 0, "p", [5, 6]), [5, 6], [7, 8], 0.0, score_only=True, placeholder=2)
    # one trained position: the placeholder's, whose prediction position is the text's last token (8)
    assert rm.tokens == [5, 6, 7, 8, 2] and rm.response_length == 1 and rm.prompt_length == 4


def test_pair_flags_are_checked_at_parse_time(tmp_path, tiny_qwen2):
    from lean_rl.config import parse_config

    data = _write(tmp_path / "pairs.jsonl", [{"prompt": f"p{i}", "chosen": "a", "rejected": "b"} for i in range(4)])
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--rollout-batch-size", "2"]
    for loss in ("dpo_loss", "rm_loss"):
        cfg = parse_config(base + ["--loss-type", loss, "--n-samples-per-prompt", "2"])
        assert not cfg.starts_engines and cfg.rollout.rollout_function_path.endswith("preference.generate_rollout")
        assert cfg.data.label_key is None and cfg.algorithm.needs_reference == (loss == "dpo_loss")
    with pytest.raises(ConfigError, match="--n-samples-per-prompt 2, got 4"):
        parse_config(base + ["--loss-type", "dpo_loss", "--n-samples-per-prompt", "4"])
    with pytest.raises(ConfigError, match="one optimizer step per rollout of pairs"):
        parse_config(base + ["--loss-type", "dpo_loss", "--n-samples-per-prompt", "2", "--global-batch-size", "2"])
    broken = _write(tmp_path / "broken.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "q", "c": 1}])
    with pytest.raises(ConfigError, match=rf"^--prompt-data {broken} row 2: missing field 'chosen' \(--chosen-key\)"):
        parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(broken), "--loss-type", "rm_loss",
                      "--n-samples-per-prompt", "2"])
