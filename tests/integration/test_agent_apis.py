"""The Responses and Messages APIs on the capture endpoint (lean_rl/rollout/openai_capture/responses.py,
messages.py) against the real engines and router, with the real `openai` and `anthropic` clients: each
call is recorded token-exact in the same session as chat completions (the usage the client reads is the
prompt the engine saw), answers sent back continue their sample with the context masked, streamed
calls give the same answer as events, bad requests get each API's error shape."""

import asyncio

import anthropic
import openai
import pytest
from test_openai_capture import make_cfg, new_sample, prompts  # noqa: F401 - prompts is a fixture

from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.rollout.openai_capture import CaptureSession, stop_capture_servers

pytestmark = pytest.mark.integration

WEATHER = {"type": "function", "name": "get_weather", "description": "the weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
WEATHER_ANTHROPIC = {"name": "get_weather", "description": "the weather in a city",
                     "input_schema": WEATHER["parameters"]}


def run(coro):
    async def with_cleanup():
        try:
            return await coro
        finally:
            await stop_capture_servers()
    return asyncio.run(with_cleanup())


def clients(session):
    root = session.base_url.removesuffix("/v1")  # the anthropic client appends /v1/messages itself
    return (openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0),
            anthropic.AsyncAnthropic(base_url=root, api_key=session.api_key, max_retries=0))


def test_responses_messages_and_chat_in_one_session_are_recorded_token_exact(engine_group, prompts):
    cfg = make_cfg(engine_group, prompts, "--rollout-max-response-len", "256")  # room for the tool rounds
    tokenizer = load_tokenizer(cfg.engines.model_path)

    async def scenario():
        async with CaptureSession(cfg, new_sample(), cfg.rollout.sampling.to_sglang()) as session:
            oa, an = clients(session)
            seen = []  # (api, usage prompt tokens, usage completion tokens) in call order
            # Responses: plain with tools, then chained by previous_response_id with a tool round trip
            r1 = await oa.responses.create(model="p", instructions="you answer with a tool call",
                                           input="the weather in paris", tools=[WEATHER], max_output_tokens=8)
            seen.append(("responses", r1.usage.input_tokens, r1.usage.output_tokens))
            # instructions are not carried over by previous_response_id (the API's rule): sent again
            r2 = await oa.responses.create(model="p", previous_response_id=r1.id, tools=[WEATHER],
                                           instructions="you answer with a tool call",
                                           max_output_tokens=8, input=[
                {"type": "function_call", "call_id": "call_mine", "name": "get_weather",
                 "arguments": '{"city": "rome"}'},
                {"type": "function_call_output", "call_id": "call_mine", "output": "sunny"}])
            seen.append(("responses chained", r2.usage.input_tokens, r2.usage.output_tokens))
            streamed = [event async for event in await oa.responses.create(
                model="p", input="count to three", max_output_tokens=6, stream=True)]
            done = streamed[-1].response
            deltas = "".join(e.delta for e in streamed if e.type == "response.output_text.delta")
            seen.append(("responses stream", done.usage.input_tokens, done.usage.output_tokens))
            # Messages: plain, then the answer sent back with a tool_use / tool_result round trip
            m1 = await an.messages.create(model="p", max_tokens=8, system="you answer briefly",
                                          tools=[WEATHER_ANTHROPIC],
                                          messages=[{"role": "user", "content": "the weather in oslo"}])
            seen.append(("messages", m1.usage.input_tokens, m1.usage.output_tokens))
            history = [{"role": "user", "content": "the weather in oslo"},
                       {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m1.content]
                        + [{"type": "tool_use", "id": "toolu_mine", "name": "get_weather", "input": {"city": "oslo"}}]},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_mine",
                                                     "content": "snow"}]}]
            m2 = await an.messages.create(model="p", max_tokens=8, system="you answer briefly",
                                          tools=[WEATHER_ANTHROPIC], messages=history)
            seen.append(("messages tool round trip", m2.usage.input_tokens, m2.usage.output_tokens))
            events = [e async for e in await an.messages.create(
                model="p", max_tokens=6, messages=[{"role": "user", "content": "say hi"}], stream=True)]
            stream_text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
            usage_out = [e for e in events if e.type == "message_delta"][0].usage.output_tokens
            start = events[0].message
            seen.append(("messages stream", start.usage.input_tokens, usage_out))
            # chat completions, same session
            c = await oa.chat.completions.create(model="p", messages=[{"role": "user", "content": "hello"}],
                                                 max_tokens=6)
            seen.append(("chat", c.usage.prompt_tokens, c.usage.completion_tokens))
            session.set_reward(1.0)
        return session, seen, r1, r2, done, deltas, m1, m2, stream_text, events

    session, seen, r1, r2, done, deltas, m1, m2, stream_text, events = run(scenario())
    samples = session.samples()
    calls = sorted((c for s in samples for c in s.metadata["capture_calls"]), key=lambda c: c["node"])
    print("\napi | prompt tokens (client usage = engine) | completion tokens | node | parent")
    for (api, prompt_tokens, completion_tokens), c in zip(seen, calls):
        print(f"{api} | {prompt_tokens} = {c['engine_prompt_tokens']} | {completion_tokens} | {c['node']} | "
              f"{c['parent_node']}")
    assert len(calls) == len(seen) == 7
    # what each client was told is what the engine saw and sampled
    assert [s[1] for s in seen] == [c["prompt_tokens"] for c in calls] == [c["engine_prompt_tokens"] for c in calls]
    assert [s[2] for s in seen] == [c["completion_tokens"] for c in calls]
    # chained responses and the sent-back message continue their call's path: context masked, one sample
    assert [c["parent_node"] for c in calls] == [None, 0, None, None, 3, None, None]
    [first] = [s for s in samples if s.metadata["capture_calls"][0]["node"] == 0]
    n1, ctx, n2 = calls[0]["completion_tokens"], calls[1]["context_tokens"], calls[1]["completion_tokens"]
    assert first.loss_mask == [1] * n1 + [0] * ctx + [1] * n2
    text = tokenizer.decode(first.tokens)
    assert "you answer with a tool call" in text and "get_weather" in text and "sunny" in text
    [messages_sample] = [s for s in samples if s.metadata["capture_calls"][0]["node"] == 3]
    assert "snow" in tokenizer.decode(messages_sample.tokens) and "oslo" in tokenizer.decode(messages_sample.tokens)
    assert all(s.loss_weight == pytest.approx(1 / len(samples)) and s.reward == 1.0 for s in samples)
    # answers: text as sampled, streamed as events
    assert r1.status in ("completed", "incomplete") and r1.id != r2.id
    assert done.output_text == deltas and done.status in ("completed", "incomplete")
    assert m1.role == "assistant" and m1.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert [e.type for e in events][:1] == ["message_start"] and events[-1].type == "message_stop"
    assert all(e.content_block.text == "" for e in events if e.type == "content_block_start"
               and e.content_block.type == "text")  # the text comes in the deltas


def test_bad_requests_get_each_apis_error_shape(engine_group, prompts):
    cfg = make_cfg(engine_group, prompts)
    too_long = "cat " * 40000  # past the tiny model's context

    async def scenario():
        async with CaptureSession(cfg, new_sample(), cfg.rollout.sampling.to_sglang()) as session:
            oa, an = clients(session)
            errors = {}
            for name, call in {
                "responses: no input": oa.responses.create(model="p"),
                "responses: unknown previous": oa.responses.create(model="p", input="x", previous_response_id="resp_no"),
                "responses: too long": oa.responses.create(model="p", input=too_long, max_output_tokens=4),
                "messages: bad block": an.messages.create(model="p", max_tokens=4, messages=[
                    {"role": "user", "content": [{"type": "image", "source": {}}]}]),
                "messages: too long": an.messages.create(model="p", max_tokens=4,
                                                         messages=[{"role": "user", "content": too_long}]),
            }.items():
                with pytest.raises((openai.APIStatusError, anthropic.APIStatusError)) as info:
                    await call
                errors[name] = info.value
            ok = await an.messages.create(model="p", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        return errors, ok

    errors, ok = run(scenario())
    status = {name: e.status_code for name, e in errors.items()}
    assert status == {"responses: no input": 400, "responses: unknown previous": 404, "responses: too long": 400,
                      "messages: bad block": 400, "messages: too long": 400}
    for name, error in errors.items():
        if name.startswith("responses"):
            assert set(error.body) >= {"message", "type", "param"}  # the openai client unwraps "error"
        else:
            assert error.body["type"] == "error" and error.body["error"]["type"] == "invalid_request_error"
    assert errors["responses: no input"].body["param"] == "input"
    assert "messages.0.content.0.type" in errors["messages: bad block"].body["error"]["message"]
    assert ok.type == "message"
