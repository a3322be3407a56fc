"""The OpenAI capture endpoint (lean_rl/rollout/openai_capture) against the real engines and router, with
the real `openai` package as the agent's client: what the agent is answered is what the engine sampled,
the recorded ids are the ids the engine saw (re-scored log-probs match), multi-call conversations
become one Sample with the context masked, a broken prefix becomes a second Sample of the group, bad
requests get OpenAI-style errors and the rollout goes on."""

import asyncio
import dataclasses
import json
import sys
import textwrap

import httpx
import openai
import pytest

from lean_rl.extensions import install as install_hooks
from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.live_endpoints import LiveEndpoints
from lean_rl.buffer.data_buffer import create_data_buffer
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.config import parse_config
from lean_rl.rollout.default import generate_rollout
from lean_rl.rollout.openai_capture import CaptureSession, stop_capture_servers
from lean_rl.rollout.tool_calls import render_chat, tools_system_prompt
from lean_rl.sample import NOT_GENERATED, Sample, Status
from lean_rl.utils.net import find_free_port

pytestmark = pytest.mark.integration

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SYSTEM = {"role": "system", "content": "you answer with a tool call"}


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("capture_data") / "prompts.jsonl"
    words = "the cat dog sat on mat ran fast big small red blue".split()
    path.write_text("".join(json.dumps({"prompt": " ".join(words[i:i + 4]), "label": "x"}) + "\n" for i in range(8)))
    return path


def make_cfg(engine_group, prompts, *flags):
    cfg = parse_config(["--hf-checkpoint", engine_group.config.model_path, "--prompt-data", str(prompts),
                        "--rollout-max-response-len", "64", "--rollout-temperature", "1.0", *flags])
    cfg = dataclasses.replace(cfg, engines=engine_group.config)
    install_hooks(cfg)  # what a run does at start-up
    return cfg


def new_sample(index=0, group_index=0) -> Sample:
    return Sample(index=index, group_index=group_index, prompt="the cat sat", tokens=[1, 2], label="x")


def run(coro):
    async def with_cleanup():
        try:
            return await coro
        finally:
            await stop_capture_servers()
    return asyncio.run(with_cleanup())


def agent_client(session) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)


def test_two_turns_with_tools_are_one_token_exact_sample(engine_group, prompts):
    cfg = make_cfg(engine_group, prompts)
    tokenizer = load_tokenizer(cfg.engines.model_path)

    async def scenario():
        async with CaptureSession(cfg, new_sample(), cfg.rollout.sampling.to_sglang()) as session:
            assert session.base_url.startswith("http://127.0.0.1:")  # the router's address on one node
            client = agent_client(session)
            assert [m.id for m in (await client.models.list()).data] == [cfg.engines.model_path]
            messages = [SYSTEM, {"role": "user", "content": "the weather in paris"}]
            first = await client.chat.completions.create(model="policy", messages=messages, tools=[WEATHER],
                                                         max_tokens=8)
            first_prompt = render_chat(tokenizer, messages, [WEATHER])
            # the agent keeps the answer object as it came back, then a tool round and a user turn
            messages += [first.choices[0].message, {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
                         {"role": "user", "content": "and in rome"}]
            second = await client.chat.completions.create(model="policy", messages=messages, tools=[WEATHER],
                                                          max_completion_tokens=8)
            await client.post("/reward", body={"reward": {"answer": 0.5, "format": 0.25}}, cast_to=httpx.Response)
        return session, first, second, first_prompt

    session, first, second, first_prompt = run(scenario())
    [sample] = session.samples()
    sample.check()
    calls = sample.metadata["capture_calls"]
    assert len(calls) == 2 and sample.metadata["trajectory_parts"] == 1
    # the tools are in the prompt (the tiny template does not render tools: merged into the system turn)
    assert tools_system_prompt([WEATHER]) in first_prompt
    prompt_ids = tokenizer.encode(first_prompt, add_special_tokens=False)
    assert sample.tokens[:sample.prompt_length] == prompt_ids
    # every call's prompt as the engine counted it, and as the agent was told
    assert [c["engine_prompt_tokens"] for c in calls] == [c["prompt_tokens"] for c in calls]
    assert [first.usage.prompt_tokens, second.usage.prompt_tokens] == [c["prompt_tokens"] for c in calls]
    assert [first.usage.completion_tokens, second.usage.completion_tokens] == [c["completion_tokens"] for c in calls]
    # loss mask: model output, the context between the calls (tool result, user turn), model output
    n1, ctx, n2 = calls[0]["completion_tokens"], calls[1]["context_tokens"], calls[1]["completion_tokens"]
    assert ctx > 0 and sample.loss_mask == [1] * n1 + [0] * ctx + [1] * n2
    assert sample.prompt_length + n1 + ctx == calls[1]["prompt_tokens"]
    assert sample.weight_versions[n1:n1 + ctx] == [NOT_GENERATED] * ctx
    assert all(v >= 0 for v, m in zip(sample.weight_versions, sample.loss_mask) if m)
    # what the agent read is what the engine sampled (the eos, if sampled, is not content)
    out1 = sample.response_tokens[:n1]
    eos = tokenizer.eos_token_id
    assert first.choices[0].message.content == tokenizer.decode(out1[:-1] if out1[-1] == eos else out1)
    assert first.choices[0].finish_reason == ("stop" if out1[-1] == eos else "length")
    # the context between the calls holds the tool result and the user turn, as rendered
    context_text = tokenizer.decode(sample.response_tokens[n1:n1 + ctx])
    assert "sunny" in context_text and "and in rome" in context_text
    # the reward the agent posted, on the sample
    assert sample.reward == pytest.approx(0.75) and sample.metadata["reward_parts"] == {"answer": 0.5, "format": 0.25}
    assert sample.status == (Status.TRUNCATED if second.choices[0].finish_reason == "length" else Status.COMPLETED)

    # the recorded log-probs are the engine's for exactly these ids (temperature 1: the raw distribution)
    async def rescore():
        async with EngineClient(cfg.engines.router_url, api_key=cfg.engines.api_key) as client:
            return (await client.score(sample.tokens)).log_probs

    scored = asyncio.run(rescore())
    start = sample.prompt_length - 1  # scored[j] is log p(tokens[j + 1])
    model_positions = [i for i, m in enumerate(sample.loss_mask) if m]
    assert [scored[start + i] for i in model_positions] == pytest.approx(
        [sample.rollout_log_probs[i] for i in model_positions], abs=1e-4)


def test_an_edited_history_starts_a_second_sample_of_the_group(engine_group, prompts):
    cfg = make_cfg(engine_group, prompts)

    async def scenario():
        async with CaptureSession(cfg, new_sample(index=5, group_index=2), cfg.rollout.sampling.to_sglang()) as session:
            client = agent_client(session)
            messages = [{"role": "user", "content": "the cat sat"}]
            await client.chat.completions.create(model="p", messages=messages, max_tokens=6)
            # the agent rewrites what the model said (a tool call of its own): the prefix breaks
            messages += [{"role": "assistant", "content": "something else entirely", "tool_calls": [
                             {"id": "call_mine", "type": "function",
                              "function": {"name": "get_weather", "arguments": '{"city": "oslo"}'}}]},
                         {"role": "tool", "tool_call_id": "call_mine", "content": "snow"},
                         {"role": "user", "content": "go on"}]
            await client.chat.completions.create(model="p", messages=messages, max_tokens=6)
            session.set_reward(1.0)
        return session

    first, second = run(scenario()).samples()
    assert first.index == 5 and second.index != 5 and first.group_index == second.group_index == 2
    assert second.metadata["parent_index"] == 5 and second.metadata["trajectory_part"] == 1
    assert first.loss_mask == [1] * first.response_length
    assert second.loss_mask == [1] * second.response_length  # its own prompt holds the whole history
    history = load_tokenizer(cfg.engines.model_path).decode(second.tokens[:second.prompt_length])
    # the edited turn, its tool call in the <tool_call> format (the tiny template has no tool support)
    assert ('something else entirely\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "oslo"}}\n'
            '</tool_call><|im_end|>\n<|im_start|>tool\nsnow<|im_end|>') in history
    assert first.reward == second.reward == 1.0


def test_bad_requests_get_openai_errors_and_the_session_goes_on(engine_group, prompts):
    cfg = make_cfg(engine_group, prompts)

    async def scenario():
        async with CaptureSession(cfg, new_sample(), cfg.rollout.sampling.to_sglang()) as session:
            url = f"{session.base_url}/chat/completions"
            headers = {"Authorization": f"Bearer {session.api_key}"}
            good = {"model": "p", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
            async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
                answers = {}
                for name, body in {"no messages": {"model": "p"},
                                   "wrong type": {**good, "temperature": "hot"},
                                   "bad content": {**good, "messages": [{"role": "user", "content": 5}]},
                                   "n": {**good, "n": 2},
                                   "stream": {**good, "stream": True}}.items():
                    answers[name] = await http.post(url, json=body, headers=headers)
                answers["bad json"] = await http.post(url, content=b"{not json", headers=headers)
                answers["wrong key"] = await http.post(url, json=good, headers={"Authorization": "Bearer nope"})
                answers["run key"] = await http.post(url, json=good,
                                                     headers={"Authorization": f"Bearer {cfg.engines.api_key}"})
                answers["unknown session"] = await http.post(url.replace(session.id, "no-such-session"),
                                                             json=good, headers=headers)
                answers["bad reward"] = await http.post(f"{session.base_url}/reward", json={"reward": "high"},
                                                        headers=headers)
            client = agent_client(session)
            ok = await client.chat.completions.create(**good)  # the session goes on
        async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
            answers["closed"] = await http.post(url, json=good, headers=headers)
        with pytest.raises(openai.ConflictError):
            await client.chat.completions.create(**good)
        return session, answers, ok

    session, answers, ok = run(scenario())
    status = {name: r.status_code for name, r in answers.items()}
    assert status == {"no messages": 400, "wrong type": 400, "bad content": 400, "n": 400, "stream": 400,
                      "bad json": 400, "wrong key": 401, "run key": 200, "unknown session": 404,
                      "bad reward": 400, "closed": 409}
    params = {name: answers[name].json()["error"]["param"] for name in
              ("no messages", "wrong type", "bad content", "n", "stream", "bad reward")}
    assert params == {"no messages": "messages", "wrong type": "temperature", "bad content": "messages[0].content",
                      "n": "n", "stream": "stream", "bad reward": "reward"}
    assert "streaming is not supported" in answers["stream"].json()["error"]["message"]
    assert ok.choices[0].message.role == "assistant"
    samples = session.samples()  # the run-key call and the agent's: one prompt sampled twice, two branches
    assert len(samples) == 2
    for sample in samples:
        assert [e["status"] for e in sample.metadata["capture_errors"]] == [400] * 6  # not the 401/404/409s
        assert sample.status in (Status.COMPLETED, Status.TRUNCATED)


def test_a_session_without_calls_fails_its_sample(engine_group, prompts):
    cfg = make_cfg(engine_group, prompts)

    async def scenario():
        async with CaptureSession(cfg, new_sample(), cfg.rollout.sampling.to_sglang()) as session:
            pass
        return session

    [sample] = run(scenario()).samples()
    assert sample.status == Status.FAILED and "no successful chat completion" in sample.metadata["capture_error"]


def test_a_router_failure_is_a_502_naming_it(engine_group, prompts):
    dead = f"http://127.0.0.1:{find_free_port()}"
    cfg = make_cfg(engine_group, prompts, "--rollout-request-retries", "0")
    live = LiveEndpoints()  # not the shared group's own: it serves the other tests
    live.publish(cfg.engines.engine_urls, dead)
    cfg = dataclasses.replace(cfg, engines=dataclasses.replace(cfg.engines, live=live))

    async def scenario():
        async with CaptureSession(cfg, new_sample(), cfg.rollout.sampling.to_sglang()) as session:
            with pytest.raises(openai.APIStatusError) as info:
                await agent_client(session).chat.completions.create(
                    model="p", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        return session, info.value

    session, error = run(scenario())
    assert error.status_code == 502 and dead in error.message
    [sample] = session.samples()
    assert sample.status == Status.FAILED and sample.metadata["capture_errors"][0]["status"] == 502


@pytest.fixture(scope="module")
def agent_module(tmp_path_factory):
    """A user module: an openai-client agent whose second call edits its history (two samples per prompt)."""
    root = tmp_path_factory.mktemp("capture_agent")
    (root / "capture_agent.py").write_text(textwrap.dedent("""
        import openai
        from lean_rl.rollout.openai_capture import CaptureSession

        async def agent(client, prompt):
            messages = [{"role": "user", "content": prompt}]
            answer = await client.chat.completions.create(model="p", messages=messages, max_tokens=5)
            messages += [{"role": "assistant", "content": "[summary]"}, {"role": "user", "content": "again"}]
            await client.chat.completions.create(model="p", messages=messages, max_tokens=5)

        async def generate(cfg, sample, sampling_params):
            async with CaptureSession(cfg, sample, sampling_params) as session:
                await agent(openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key), sample.prompt)
                session.set_reward(0.5)
            return session.samples()
    """))
    sys.path.insert(0, str(root))
    yield
    sys.path.remove(str(root))


def test_a_rollout_of_capture_sessions_fills_the_buffer(engine_group, prompts, agent_module):
    cfg = make_cfg(engine_group, prompts, "--custom-generate-function-path", "capture_agent.generate",
                   "--rollout-batch-size", "2", "--n-samples-per-prompt", "2")
    buffer = create_data_buffer(cfg)
    out = run(generate_rollout(cfg, 0, buffer))
    groups = buffer.get_train_groups(10)
    assert len(groups) == 2 and out.metrics["rollout/samples"] == 8
    for group in groups:
        assert len(group) == 4 and len({s.index for s in group}) == 4
        assert len({s.group_index for s in group}) == 1
        assert all(s.reward == 0.5 and s.status in (Status.COMPLETED, Status.TRUNCATED) for s in group)
        parents = [s for s in group if "parent_index" not in s.metadata]
        assert len(parents) == 2 and all(s.metadata["trajectory_parts"] == 2 for s in group)


def test_a_planner_calling_a_solver_twice_is_a_tree_of_three_weighted_samples(engine_group, prompts):
    """Two agents in one session: the planner asks, a solver (its own system prompt) answers twice, the
    planner reads both answers. Calls: planner -> solver -> solver -> planner; the tree has three roots
    (planner, solver 1, solver 2), the planner's second call the child of its first."""
    cfg = make_cfg(engine_group, prompts)

    async def scenario():
        async with CaptureSession(cfg, new_sample(index=3, group_index=1), cfg.rollout.sampling.to_sglang()) as session:
            client = agent_client(session)
            planner = [{"role": "system", "content": "you plan"}, {"role": "user", "content": "the cat sat"}]
            plan = await client.chat.completions.create(model="p", messages=planner, max_tokens=6)
            answers = []
            for part in ("first step", "second step"):
                solver = [{"role": "system", "content": "you solve"}, {"role": "user", "content": part}]
                answers.append(await client.chat.completions.create(model="p", messages=solver, max_tokens=5))
            planner += [plan.choices[0].message, {"role": "user", "content": " | ".join(
                a.choices[0].message.content for a in answers)}]
            await client.chat.completions.create(model="p", messages=planner, max_tokens=6)
            session.set_reward(0.75)
        return session

    samples = run(scenario()).samples()
    table = [(s.index, [(c["node"], c["parent_node"]) for c in s.metadata["capture_calls"]], s.prompt_length,
              "".join(map(str, s.loss_mask)), s.reward, s.loss_weight) for s in samples]
    print("\nsample index | calls (node, parent) | prompt tokens | loss mask | reward | loss weight")
    for row in table:
        print(" | ".join(map(str, row)))
    planner, solver1, solver2 = samples
    assert [row[1] for row in table] == [[(0, None), (3, 0)], [(1, None)], [(2, None)]]
    assert planner.index == 3 and {solver1.index, solver2.index} == {2**40 + 3, 2 * 2**40 + 3}
    assert all(s.group_index == 1 and s.reward == 0.75 for s in samples)
    assert [s.loss_weight for s in samples] == pytest.approx([1 / 3] * 3)
    n1, ctx, n2 = (planner.metadata["capture_calls"][0]["completion_tokens"],
                   planner.metadata["capture_calls"][1]["context_tokens"],
                   planner.metadata["capture_calls"][1]["completion_tokens"])
    assert ctx > 0 and planner.loss_mask == [1] * n1 + [0] * ctx + [1] * n2
    for solver in (solver1, solver2):
        assert solver.loss_mask == [1] * solver.response_length
        assert solver.metadata["capture_calls"][0]["engine_prompt_tokens"] == solver.prompt_length
    tokenizer = load_tokenizer(cfg.engines.model_path)
    assert "you solve" in tokenizer.decode(solver1.tokens) and "you plan" not in tokenizer.decode(solver1.tokens)
