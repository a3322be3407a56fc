"""The example environments' step logic on their own (the calculator's tool runs in the real sandbox):
tool calls, malformed calls, the limits, answers and rewards; searches and answers."""

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from lean_rl.rollout.tool_calls import format_tool_call

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def examples_on_path():
    paths = [str(EXAMPLES / "tool_calling"), str(EXAMPLES / "search_env")]
    sys.path[:0] = paths
    yield
    for p in paths:
        sys.path.remove(p)


def step(env, action):
    return asyncio.run(env.step(action))


def calculator(label="10081"):
    from calculator_env import CalculatorEnv

    return CalculatorEnv(None, SimpleNamespace(label=label))


def test_calculator_runs_the_call_in_the_sandbox(examples_on_path):
    result = step(calculator(), "let me compute " + format_tool_call("python", {"code": "print(347*29+18)"}))
    assert not result.done and result.reward is None
    assert result.observation.role == "tool" and result.observation.text.strip() == "10081"
    assert result.info == {"tools": ["ok"]}


@pytest.mark.parametrize("code, status, text", [
    ("while True: pass", "cpu_limit", "CPU time"),
    ("import time; time.sleep(60)", "timeout", "time"),
    ("import socket; socket.create_connection(('127.0.0.1', 9))", "error", "rror"),
    ("open('/etc/passwd').read()", "error", "rror"),
    ("print('x' * 10**7)", "output_limit", "x"),
])
def test_a_bad_tool_run_becomes_the_tools_answer(examples_on_path, code, status, text):
    from calculator_env import LIMITS

    result = step(calculator(), format_tool_call("python", {"code": code}))
    assert not result.done and result.info == {"tools": [status]}
    assert text in result.observation.text and len(result.observation.text) <= LIMITS.max_output_bytes + 200


def test_malformed_and_wrong_calls_are_error_observations(examples_on_path):
    result = step(calculator(), "<tool_call>{not json</tool_call>")
    assert not result.done and result.observation.text.startswith("error:") and result.info["malformed_calls"] == 1
    result = step(calculator(), format_tool_call("shell", {"cmd": "ls"}))
    assert "call the tool as" in result.observation.text and result.info == {"tools": ["bad_call"]}
    three = "".join(format_tool_call("python", {"code": f"print({i})"}) for i in range(3))
    result = step(calculator(), three)
    assert result.info == {"tools": ["ok", "ok"]} and "at most 2 calls" in result.observation.text


def test_an_answer_without_a_call_ends_the_episode(examples_on_path):
    assert step(calculator(), "The answer is 10081.").reward == 1.0
    wrong = step(calculator(), "I think 10080")
    assert wrong.done and wrong.reward == 0.0 and wrong.observation is None


def test_search_env_searches_then_scores_the_answer(examples_on_path):
    import search_env

    fact = search_env._facts()[0]
    env = search_env.SearchEnv(None, SimpleNamespace(label=fact["capital"]))
    result = step(env, f"<search>capital of {fact['country']}</search>")
    assert not result.done and f"capital is {fact['capital']}" in result.observation.text
    untagged = step(env, "no tags at all")  # neither a search nor an answer: over, unrewarded
    assert untagged.done and untagged.reward == 0.0 and untagged.observation is None
    assert step(env, f"<answer>{fact['capital'].lower()}</answer>").reward == 1.0
    assert step(env, "<answer>Paris</answer>").reward == 0.0


def test_the_calculators_warm_start_episodes_are_what_its_environment_answers(examples_on_path, tmp_path):
    """Each trace's call parses, runs, prints the label, and the final answer scores 1."""
    import json

    from calculator_env import make_traces

    make_traces(tmp_path / "traces.jsonl", 3, seed=2)
    for row in map(json.loads, (tmp_path / "traces.jsonl").read_text().splitlines()):
        system, user, call, tool, answer = row["messages"]
        env = calculator(label=row["label"])
        ran = step(env, call["content"])
        assert ran.observation.role == tool["role"] == "tool" and ran.observation.text.strip() == tool["content"]
        assert step(env, answer["content"]).reward == 1.0


def test_the_search_warm_start_episodes_render_results_as_the_environment_does(examples_on_path, tmp_path):
    """Written for the corpus's own world (seed 0), a trace's results are SearchEnv's for its query; the
    shipped traces use another world (seed 7), so no corpus fact is learned from them."""
    import json

    import search_env

    search_env.write_traces(tmp_path, n=120, seed=0)
    rows = [json.loads(line) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    for row in rows[:9]:
        system, user, query, results, answer = row["messages"]
        env = search_env.SearchEnv(None, SimpleNamespace(label=row["label"]))
        assert step(env, query["content"]).observation.text == results["content"]
        assert step(env, answer["content"]).reward == 1.0
    search_env.write_traces(tmp_path, n=120)
    corpus = {f["country"] for f in search_env._facts()}
    assert not any(country in (tmp_path / "traces.jsonl").read_text() for country in corpus)
