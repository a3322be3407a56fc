"""--load-debug-rollout-data files that are not what --save-debug-rollout-data wrote (issue 12: bad
input): every error names the flag, the file, the line and the field."""

import json

import pytest

from lean_rl.debug_rollout import load_debug_rollout
from lean_rl.sample import Sample, Status


def _sample(index=0, **changes):
    s = Sample(index=index, group_index=0, prompt="p", tokens=[1, 2])
    s.append_response([3, 4], text="ab", log_probs=[-0.5, -0.25], weight_versions=2)
    s.reward, s.status = 1.0, Status.COMPLETED
    return {**s.to_dict(), **changes}


def _write(tmp_path, step, lines):
    (tmp_path / f"{step}.jsonl").write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return str(tmp_path / "{rollout_id}.jsonl")


def test_a_saved_rollout_loads_back(tmp_path):
    template = _write(tmp_path, 3, [[_sample(0), _sample(1)], "", [_sample(2)]])
    groups = load_debug_rollout(template, 3)
    assert [[s.index for s in g] for g in groups] == [[0, 1], [2]]
    assert groups[0][0].rollout_log_probs == [-0.5, -0.25] and groups[0][0].status is Status.COMPLETED


def test_bad_debug_rollout_missing_file_names_the_step(tmp_path):
    template = _write(tmp_path, 0, [[_sample()]])
    with pytest.raises(FileNotFoundError, match=r"--load-debug-rollout-data: .*/1\.jsonl does not exist \(rollout 1\)"):
        load_debug_rollout(template, 1)


def test_bad_debug_rollout_template_names_the_flag(tmp_path):
    with pytest.raises(ValueError, match=r"--load-debug-rollout-data '.*\{step\}\.jsonl': cannot fill in the file name"):
        load_debug_rollout(str(tmp_path / "{step}.jsonl"), 0)


@pytest.mark.parametrize("line, message", [
    ("{not json", r"invalid JSON \(Expecting property name enclosed in double quotes at column 2\)"),
    (_sample(), "expected a non-empty JSON list of samples \\(one group\\), got dict"),
    ([], "expected a non-empty JSON list of samples \\(one group\\), got an empty list"),
    ([7], "a sample must be a JSON object, got int"),
    ([{k: v for k, v in _sample().items() if k != "tokens"}], r"sample 0: missing field\(s\) \['tokens'\]"),
    ([_sample(extra=1)], r"sample 0: unknown field\(s\) \['extra'\]"),
    ([_sample(tokens="1 2 3 4")], "sample 0: field 'tokens' must be a list of token ids, got '1 2 3 4'"),
    ([_sample(tokens=[1, 2, 3.5, 4])], "sample 0: field 'tokens' must be a list of token ids"),
    ([_sample(reward="1.0")], "sample 0: field 'reward' must be a number or null, got '1.0'"),
    ([_sample(index="0")], "sample 0: field 'index' must be an integer, got '0'"),
    ([_sample(status="done")], r"sample 0: field 'status' must be one of \['pending', 'completed'"),
    ([_sample(metadata=[1])], "sample 0: field 'metadata' must be an object"),
    ([_sample(loss_mask=[1])], "sample 0: response_length 2, tokens 4, loss_mask 1"),
])
def test_bad_debug_rollout_line_names_file_line_and_field(tmp_path, line, message):
    template = _write(tmp_path, 5, [[_sample(0)], line])
    with pytest.raises(ValueError, match=rf"^--load-debug-rollout-data: .*/5\.jsonl:2: {message}"):
        load_debug_rollout(template, 5)


def test_bad_debug_rollout_empty_file_or_not_utf8(tmp_path):
    template = _write(tmp_path, 0, ["", ""])
    with pytest.raises(ValueError, match=r"--load-debug-rollout-data: .*/0\.jsonl holds no groups \(rollout 0\)"):
        load_debug_rollout(template, 0)
    (tmp_path / "1.jsonl").write_bytes(b"[\xff]\n")
    with pytest.raises(ValueError, match=r"--load-debug-rollout-data: .*/1\.jsonl: not UTF-8 text"):
        load_debug_rollout(template, 1)


def test_sample_from_dict_names_the_field_and_keeps_what_to_dict_writes():
    with pytest.raises(ValueError, match=r"sample 0: missing field\(s\) \['group_index', 'tokens'\]"):
        Sample.from_dict({"index": 0, "prompt": "p"})
    for label in (True, None, 3, "x", {"a": 1}):  # the label is the data row's: any JSON value
        assert Sample.from_dict(_sample(label=label)).label == label
    assert Sample.from_dict(_sample(reward=None)).reward is None
