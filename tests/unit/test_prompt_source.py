import json

import pytest
import transformers

from lean_rl.buffer.prompt_source import BadRowError, PromptSource, load_prompts
from lean_rl.buffer.config import DataConfig


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2):
    return transformers.AutoTokenizer.from_pretrained(tiny_qwen2)


def _write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_jsonl_text_and_messages_with_chat_template(tmp_path, tokenizer):
    path = _write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "the cat", "label": "1", "meta": {"k": 1}},
        {"prompt": [{"role": "user", "content": "the dog"}], "label": "2"},
    ])
    records, skipped = load_prompts(path, DataConfig(prompt_data=str(path), metadata_key="meta", apply_chat_template=True), tokenizer)
    assert [r.row for r in records] == [1, 2] and not skipped
    rendered = tokenizer.decode(list(records[1].tokens))
    assert rendered == "<|im_start|>user\nthe dog<|im_end|>\n<|im_start|>assistant\n"
    assert records[0].metadata == {"k": 1} and records[1].label == "2"


def test_parquet_rows(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"question": ["a b", "c d e"], "answer": ["x", "y"]}), path)
    records, _ = load_prompts(path, DataConfig(prompt_data=str(path), input_key="question", label_key="answer"), tokenizer)
    assert [r.label for r in records] == ["x", "y"]
    assert tokenizer.decode(list(records[1].tokens)) == "c d e"


def test_bad_row_names_file_and_line_unless_skipped(tmp_path, tokenizer):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "ok", "label": 1}, "{not json", {"label": 2}, {"prompt": "fine", "label": 3}])
    with pytest.raises(BadRowError, match=r"p\.jsonl:2: invalid JSON"):
        load_prompts(path, DataConfig(prompt_data=str(path)), tokenizer)
    records, skipped = load_prompts(path, DataConfig(prompt_data=str(path), skip_bad_rows=True), tokenizer)
    assert [r.row for r in records] == [1, 4] and skipped["bad_row"] == 2
    path2 = _write_jsonl(tmp_path / "q.jsonl", [{"prompt": "ok", "label": 1}, {"text": "x", "label": 1}])
    with pytest.raises(BadRowError, match=r"q\.jsonl:2: missing key 'prompt' \(--input-key\)"):
        load_prompts(path2, DataConfig(prompt_data=str(path2)), tokenizer)


def test_too_long_prompts_are_skipped_and_counted(tmp_path, tokenizer):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "label": 0}, {"prompt": "the cat sat on the mat " * 10, "label": 0}])
    records, skipped = load_prompts(path, DataConfig(prompt_data=str(path), rollout_max_prompt_len=8), tokenizer)
    assert len(records) == 1 and skipped["prompt_too_long"] == 1


def test_messages_without_chat_template_is_an_error(tmp_path, tokenizer):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": [{"role": "user", "content": "x"}], "label": 0}])
    with pytest.raises(BadRowError, match="--apply-chat-template"):
        load_prompts(path, DataConfig(prompt_data=str(path)), tokenizer)


def _records(n):
    from lean_rl.buffer.prompt_source import PromptRecord

    return [PromptRecord(row=i + 1, prompt=f"p{i}", tokens=(i,)) for i in range(n)]


def test_shuffled_epochs_are_permutations_seeded_and_differ_between_epochs():
    src = PromptSource(_records(20), shuffle=True, seed=7, num_epochs=2)
    seen = [src.next() for _ in range(40)]
    assert src.next() is None
    epoch0 = [r.row for e, r in seen[:20]]
    epoch1 = [r.row for e, r in seen[20:]]
    assert sorted(epoch0) == sorted(epoch1) == list(range(1, 21))
    assert epoch0 != epoch1 and epoch0 != sorted(epoch0)
    again = PromptSource(_records(20), shuffle=True, seed=7, num_epochs=2)
    assert [again.next()[1].row for _ in range(20)] == epoch0


def test_cursor_state_resumes_exactly():
    src = PromptSource(_records(5), shuffle=True, seed=1)
    for _ in range(7):
        src.next()
    state = src.state_dict()
    expected = [src.next() for _ in range(6)]
    other = PromptSource(_records(5), shuffle=True, seed=1)
    other.load_state_dict(state)
    assert [other.next() for _ in range(6)] == expected
    with pytest.raises(ValueError, match="has 4 usable rows but the checkpoint was taken with 5"):
        PromptSource(_records(4)).load_state_dict(state)


def test_resume_refuses_other_prompts_labels_or_order_with_the_same_row_count():
    import dataclasses

    state = PromptSource(_records(5), shuffle=True, seed=1).state_dict()
    PromptSource(_records(5), shuffle=True, seed=1).load_state_dict(state)  # the same data and order: fine
    relabelled = [dataclasses.replace(r, label="other") if r.row == 3 else r for r in _records(5)]
    retokenized = [dataclasses.replace(r, tokens=r.tokens + (7,)) if r.row == 2 else r for r in _records(5)]
    for changed in (PromptSource(relabelled, shuffle=True, seed=1), PromptSource(retokenized, shuffle=True, seed=1),
                    PromptSource(_records(5), shuffle=True, seed=2), PromptSource(_records(5), shuffle=False)):
        with pytest.raises(ValueError, match="the prompt data differs from the run that saved the checkpoint"):
            changed.load_state_dict(state)
    older = {k: v for k, v in state.items() if k != "fingerprint"}  # checkpoints from before the fingerprint
    PromptSource(_records(5), shuffle=True, seed=1).load_state_dict(older)


# ---------------------------------------------------------------- bad datasets (issue 12: bad input)
def _load(path, **data):
    from lean_rl.buffer.prompt_source import load_tokenizer

    return load_prompts(path, DataConfig(prompt_data=str(path), **data), load_tokenizer(_TINY[0]))


_TINY: list = []


@pytest.fixture(autouse=True)
def _tiny_path(tiny_qwen2):
    _TINY[:] = [str(tiny_qwen2)]


def test_bad_dataset_csv_is_an_unsupported_type_named_at_parse_time(tmp_path, tiny_qwen2):
    from lean_rl.config import parse_config
    from lean_rl.options import ConfigError

    path = tmp_path / "p.csv"
    path.write_text("prompt,label\nthe cat,1\n")
    with pytest.raises(ValueError, match=r"--prompt-data: .*p\.csv: unsupported prompt file type '\.csv' \(use \.jsonl"):
        _load(path)
    with pytest.raises(ConfigError, match=r"--prompt-data: .*p\.csv: unsupported prompt file type '\.csv'"):
        parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(path)])
    good = _write_jsonl(tmp_path / "ok.jsonl", [{"prompt": "a", "label": 1}])
    with pytest.raises(ConfigError, match=r"--eval-prompt-data held: .*p\.csv: unsupported prompt file type"):
        parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(good),
                      "--eval-prompt-data", "held", str(path)])


@pytest.mark.parametrize("content", ["", "\n\n   \n\t\n"], ids=["empty", "blank_lines"])
def test_bad_dataset_empty_or_blank_file_says_it_has_no_rows(tmp_path, content):
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=r"--prompt-data: .*p\.jsonl: no usable prompts \(skipped: none; the file has no rows\)"):
        _load(path)


def test_bad_dataset_every_row_skipped_says_why(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"text": "x"}, "[1, 2]"])
    with pytest.raises(ValueError, match=r"no usable prompts \(skipped: \{'bad_row': 2\}\)"):
        _load(path, skip_bad_rows=True)


@pytest.mark.parametrize("row, message", [
    ({"prompt": "x"}, r"p\.jsonl:2: missing key 'label' \(--label-key\)"),
    ({"label": 1}, r"p\.jsonl:2: missing key 'prompt' \(--input-key\); keys: \['label'\]"),
    ({"prompt": {"a": 1}, "label": 1}, r"p\.jsonl:2: 'prompt' must be text, a list of messages or a scalar value, got dict"),
    ({"prompt": None, "label": 1}, r"p\.jsonl:2: 'prompt' must be text, a list of messages or a scalar value, got null"),
    ({"prompt": [{"content": "x"}], "label": 1}, r"p\.jsonl:2: 'prompt' must be text or a list of \{'role', 'content'\}"),
    ({"prompt": "x", "label": 1, "meta": [1, 2]}, r"p\.jsonl:2: 'meta' \(--metadata-key\) must be an object, got a list"),
    ({"prompt": "x", "label": 1, "meta": "k=v"}, r"p\.jsonl:2: 'meta' \(--metadata-key\) must be an object, got a string"),
    ("[1, 2]", r"p\.jsonl:2: expected a JSON object, got a list"),
    ("3.5", r"p\.jsonl:2: expected a JSON object, got a number"),
    ('"a prompt"', r"p\.jsonl:2: expected a JSON object, got a string"),
])
def test_bad_dataset_row_names_flag_file_line_and_key_unless_skipped(tmp_path, row, message):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "ok", "label": 0, "meta": {}}, row, {"prompt": "fine", "label": 2}])
    with pytest.raises(BadRowError, match=rf"^--prompt-data: .*{message}.*\(pass --skip-bad-rows to skip such rows\)"):
        _load(path, metadata_key="meta")
    records, skipped = _load(path, metadata_key="meta", skip_bad_rows=True)  # nothing else is lost
    assert [r.row for r in records] == [1, 3] and skipped == {"bad_row": 1}


def test_bad_dataset_not_utf8_names_file_and_line_and_is_never_skipped(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "ok", "label": 0}\n\n{"prompt": "caf\xe9", "label": 1}\n')  # latin-1
    for skip in (False, True):  # a wrongly encoded file is not a bad row: skipping would hide the rest
        with pytest.raises(ValueError, match=r"--prompt-data: .*p\.jsonl:3: not UTF-8 text \(byte b'\\xe9' at column 16\)"):
            _load(path, skip_bad_rows=skip)


def test_bad_parquet_metadata_names_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "label": ["x", "y"], "meta": ["k", "v"]}), path)
    with pytest.raises(BadRowError, match=r"p\.parquet:1: 'meta' \(--metadata-key\) must be an object, got a string"):
        _load(path, metadata_key="meta")


def test_bad_eval_dataset_names_the_set_and_fails_when_loaded_at_start_up(tmp_path, tiny_qwen2):
    from types import SimpleNamespace

    from lean_rl.rollout.config import SamplingConfig
    from lean_rl.rollout.eval_config import EvalSet
    from lean_rl.rollout.evaluation import load_eval_datasets

    good = _write_jsonl(tmp_path / "good.jsonl", [{"prompt": "a", "label": 1}, {"prompt": "b", "label": 2}])
    cases = {
        "missing_label": (_write_jsonl(tmp_path / "e1.jsonl", [{"prompt": "a"}]), r"e1\.jsonl:1: missing key 'label'"),
        "not_object": (_write_jsonl(tmp_path / "e2.jsonl", ["[1]"]), r"e2\.jsonl:1: expected a JSON object, got a list"),
        "empty": (_write_jsonl(tmp_path / "e3.jsonl", []), r"e3\.jsonl: no usable prompts"),
    }
    (tmp_path / "e4.jsonl").write_bytes(b"\xff\xfe{}\n")
    cases["utf16"] = (tmp_path / "e4.jsonl", r"e4\.jsonl:1: not UTF-8 text")
    for name, (path, message) in cases.items():
        cfg = SimpleNamespace(data=DataConfig(prompt_data=str(good)), engines=SimpleNamespace(model_path=str(tiny_qwen2)),
                              eval=SimpleNamespace(sets=(EvalSet("heldout", str(good), 1, SamplingConfig()),
                                                         EvalSet(name, str(path), 1, SamplingConfig()))))
        with pytest.raises(ValueError, match=rf"^--eval-prompt-data {name}: .*{message}"):
            load_eval_datasets(cfg)
    cfg = SimpleNamespace(data=DataConfig(prompt_data=str(good)), engines=SimpleNamespace(model_path=str(tiny_qwen2)),
                          eval=SimpleNamespace(sets=(EvalSet("heldout", str(good), 1, SamplingConfig()),)))
    assert load_eval_datasets(cfg) == {"heldout": 2}


def test_a_scalar_prompt_loads_as_it_is_without_tokens(tmp_path):
    """slime's tau-bench passes a task index as the prompt (--input-key index): it loads as the value
    itself, for the generate function to read; it has no tokens of its own."""
    path = _write_jsonl(tmp_path / "p.jsonl", [{"index": 3, "label": ""}, {"index": 1.5, "label": ""}])
    records, skipped = _load(path, input_key="index")
    assert [(r.prompt, r.tokens) for r in records] == [(3, ()), (1.5, ())] and not skipped
    with pytest.raises(BadRowError, match=r"pass --apply-chat-template|must be text"):
        _load(_write_jsonl(tmp_path / "q.jsonl", [{"prompt": [{"role": "user", "content": "x"}], "label": ""}]))
