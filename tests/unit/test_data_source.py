"""--data-source-path: a user's prompt source in place of the --prompt-data reader, through the run's
start-up path (parse_config, create_data_buffer) with a real hook module: the buffer hands out its
prompts, its cursor is saved and restored with the buffer's state (a resume neither repeats nor skips
a prompt), and a source that answers wrongly stops the run naming the flag."""

import json
import sys
import textwrap

import pytest

from lean_rl.buffer.data_buffer import create_data_buffer
from lean_rl.config import parse_config
from lean_rl.utils.plugins import HookReturnError, PluginError

SOURCES = textwrap.dedent("""
    from lean_rl.buffer.prompt_source import PromptRecord, PromptSource, load_tokenizer, render_prompt

    def additions(cfg):
        '''Built-in PromptSource over generated records: shuffling, epochs and the checkpointed cursor for free.'''
        tokenizer = load_tokenizer(cfg.engines.model_path)
        records = [PromptRecord(row=i, prompt=f"{i} + {i} =", tokens=tuple(render_prompt(f"{i} + {i} =", cfg.data, tokenizer)),
                                label=str(2 * i), metadata={"kind": "addition"}) for i in range(5)]
        return PromptSource(records, shuffle=cfg.data.rollout_shuffle, seed=cfg.data.seed, num_epochs=cfg.data.num_epochs)

    class Countdown:
        '''A source of its own: an endless stream with its own cursor.'''
        def __init__(self, cfg):
            self.position = 0
        def next(self):
            self.position += 1
            return 0, PromptRecord(row=self.position, prompt=str(self.position), tokens=(1, self.position + 2))
        def state_dict(self):
            return {"position": self.position}
        def load_state_dict(self, state):
            self.position = state["position"]

    class NoCursor:
        def __init__(self, cfg):
            pass
        def next(self):
            return None

    class BadRecords(Countdown):
        def next(self):
            self.position += 1
            return [None, (0, "a prompt"), (0, PromptRecord(row=1, prompt="p", tokens=())),
                    (0, PromptRecord(row=2, prompt={"question": "q"}, tokens=(1, 2))),
                    (0, PromptRecord(row=3, prompt="p", tokens=(1, 2), label={1, 2}))][self.position - 1]

    class UnsavableCursor(Countdown):
        def state_dict(self):
            return {"opened": open}
""")


@pytest.fixture
def sources(tmp_path, monkeypatch):
    (tmp_path / "my_sources.py").write_text(SOURCES)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_sources", None)


def _buffer(tiny_qwen2, name, *flags):
    cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--data-source-path", f"my_sources.{name}",
                        "--n-samples-per-prompt", "2", *flags])
    return create_data_buffer(cfg)


def _labels(groups):
    return [g[0].label for g in groups]


def test_a_built_in_source_over_generated_records_resumes_where_it_stopped(sources, tiny_qwen2):
    buffer = _buffer(tiny_qwen2, "additions", "--rollout-shuffle", "--num-epochs", "2")
    first = buffer.get_prompt_groups(3)
    assert all(len(g) == 2 and g[0].metadata["kind"] == "addition" for g in first)
    buffer.put_finished_groups(first[:2])
    buffer.get_train_groups(2)
    buffer.put_partial_groups(first[2:])
    state = json.loads(json.dumps(buffer.state_dict()))  # what a checkpoint holds
    rest = _labels(buffer.get_prompt_groups(20))
    resumed = _buffer(tiny_qwen2, "additions", "--rollout-shuffle", "--num-epochs", "2")
    resumed.load_state_dict(state)
    assert _labels(resumed.get_prompt_groups(20)) == rest  # the pending group first, then the same order
    assert len(rest) == 10 - 2  # two epochs of 5 prompts, two trained before the save


def test_a_source_of_its_own_keeps_its_cursor_in_the_checkpoint(sources, tiny_qwen2):
    buffer = _buffer(tiny_qwen2, "Countdown")
    assert [g[0].prompt for g in buffer.get_prompt_groups(2)] == ["1", "2"]
    state = json.loads(json.dumps(buffer.state_dict()))
    assert state["source"] == {"position": 2}
    resumed = _buffer(tiny_qwen2, "Countdown")
    resumed.load_state_dict(state)
    groups = resumed.get_prompt_groups(3)  # the two in flight at the save come back first
    assert [g[0].prompt for g in groups] == ["1", "2", "3"]
    assert groups[2][0].metadata["prompt_row"] == 3 and groups[2][0].tokens == [1, 5]


def test_a_source_without_the_cursor_methods_fails_when_the_buffer_is_built(sources, tiny_qwen2):
    with pytest.raises(PluginError, match=r"^--data-source-path 'my_sources.NoCursor': my_sources.NoCursor\(cfg\) "
                                          r"returned NoCursor .*which has no state_dict\(\), load_state_dict\(\)"):
        _buffer(tiny_qwen2, "NoCursor")


def test_a_source_answering_wrongly_stops_the_run_naming_the_flag(sources, tiny_qwen2):
    buffer = _buffer(tiny_qwen2, "BadRecords")
    assert buffer.get_prompt_groups(1) == []  # None: the data is used up
    with pytest.raises(HookReturnError, match=r"^--data-source-path my_sources.BadRecords next\(\) \(.*\) returned "
                                              r"tuple \(0, 'a prompt'\); it must return None \(no prompt left\) or a pair"):
        buffer.get_prompt_groups(1)
    with pytest.raises(HookReturnError, match=r"its tokens must be a non-empty list of token ids"):
        buffer.get_prompt_groups(1)
    # what a checkpoint could not hold (a resume would fail on it) is refused when it comes, not at resume
    with pytest.raises(HookReturnError, match=r"its prompt must be text or a list of chat messages, got dict"):
        buffer.get_prompt_groups(1)
    with pytest.raises(HookReturnError, match=r"must be JSON-serialisable \(Object of type set"):
        buffer.get_prompt_groups(1)
    unsavable = _buffer(tiny_qwen2, "UnsavableCursor")
    with pytest.raises(HookReturnError, match=r"^--data-source-path my_sources.UnsavableCursor state_dict\(\) .*"
                                              r"it must return a JSON-serialisable dict"):
        unsavable.state_dict()


def test_a_checkpoint_resumes_only_with_the_same_kind_of_source(sources, tiny_qwen2, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi", "label": "x"}\n')
    from_file = create_data_buffer(parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data)]))
    with pytest.raises(ValueError, match="prompts came from --prompt-data, this run's from --data-source-path"):
        _buffer(tiny_qwen2, "Countdown").load_state_dict(json.loads(json.dumps(from_file.state_dict())))
    with pytest.raises(ValueError, match="prompts came from --data-source-path, this run's from --prompt-data"):
        from_file.load_state_dict(json.loads(json.dumps(_buffer(tiny_qwen2, "Countdown").state_dict())))
