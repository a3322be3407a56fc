"""CaptureSession: one rollout sample served to an unmodified OpenAI-client agent, every call recorded
token-exact, and the trajectory turned into Samples.

    async def generate(cfg, sample, sampling_params):          # --custom-generate-function-path
        async with CaptureSession(cfg, sample, sampling_params) as session:
            client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key)
            answer = await my_agent(client, sample.prompt)
            session.set_reward(...)   # optional: or the agent POSTs /v1/reward, or --rm-type scores later
        return session.samples()

The endpoint runs on the event loop of the code that opened the session: an agent written with the
blocking `openai.OpenAI` client must run in a thread (`await run_blocking(cfg, agent, ...)`, rollout/blocking.py: the
run's bounded daemon threads, which a hung agent cannot take from a train step nor the exit), or its
first call would block the loop that has to answer it.

One chat completion: the messages (and tools) are rendered with the model's chat template
(tool_calls.render_chat) and tokenized; the router's /generate samples from those ids with the
session's sampling params (the run's, with the request's temperature / top_p / max_tokens / stop on
top) and the session id as routing key; the answer goes back in the chat.completion format, tool calls
parsed out. The prompt ids, the sampled ids (output_ids, never re-tokenized), their log-probs and weight
versions are recorded (trajectory.CallRecord).

Keeping the trajectory one Sample: an agent sends its history back as text, and re-tokenizing the
model's own output rarely reproduces the ids it sampled (a random or RL-trained policy does not write
canonical BPE). So (1) an assistant message this session answered (the same content and tool-call ids)
is rendered from the exact text of the sampled ids, not re-formatted from its parsed tool calls; and
(2) when the rendered prompt text starts with the text of an earlier call's prompt + output, the new
prompt ids are that call's ids followed by the tokenized rest. The engine is then given exactly the
ids that are recorded and trained on. Where neither applies (the template drops earlier reasoning, the
agent trimmed or edited its history), the call starts a new Sample of the group (trajectory.py).

Budget: sampling_params["max_new_tokens"] (--rollout-max-response-len) bounds the response of each
Sample (model output and the context between calls together); a call that finds it used up is answered
with an empty `length` completion and its Sample ends TRUNCATED.

Ends: the engine aborted a call (weights update, surplus): that call and every later one get 503, an
exception the agent raises for it is swallowed by the `async with`, and samples() returns the samples
ABORTED (the rollout hands the prompt out again; a capture trajectory restarts from the prompt). An
agent that raises for any other reason fails its sample (the rollout marks it FAILED). No call at all:
samples() returns the sample FAILED with metadata["capture_error"].
"""

from __future__ import annotations

import hmac
import itertools
import math
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lean_rl.backends.sglang.client_errors import EngineError, EngineHTTPError
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.rollout.base import stopping_event
from lean_rl.rollout.generate import generate_with_retries, token_versions
from lean_rl.rollout.openai_capture.chat import (Completion, RequestError, chat_completion_body, completion_from_output,
                                                 error_body, parse_chat_request)
from lean_rl.rollout.openai_capture.messages import (anthropic_error, chat_body_of_messages_request,
                                                     message_body)
from lean_rl.rollout.openai_capture.responses import chat_body_of_response_request, response_body
from lean_rl.rollout.openai_capture.server import CaptureServer, capture_server
from lean_rl.rollout.openai_capture.session_tokens import SessionTokens, call_sampling_params
from lean_rl.rollout.openai_capture.trajectory import CallRecord, TrajectoryAssembler
from lean_rl.sample import Sample, Status
from lean_rl.utils.token_text import decode_ids

if TYPE_CHECKING:
    from lean_rl.config import Config

# metadata keys this module writes on a sample (cleared when a sample is captured again)
_METADATA_KEYS = ("capture_session", "capture_calls", "capture_errors", "capture_error", "trajectory_parts",
                  "agent_reward", "reward_parts", "capture_late_calls")
_ABORTED_MESSAGE = ("generation was aborted by the trainer (a weight update or a finished batch); "
                    "this rollout sample will be generated again")


@dataclass(frozen=True)
class Served:
    """A call the engine answered: the completion in chat terms and its token counts."""

    number: int  # the call's number in this session
    completion: Completion
    prompt_tokens: int
    completion_tokens: int


class CaptureSession:
    def __init__(self, cfg: Config, sample: Sample, sampling_params: dict, *, session_id: str | None = None):
        if "max_new_tokens" not in sampling_params:
            raise ValueError("CaptureSession: sampling_params needs max_new_tokens (the response budget)")
        self.cfg, self.sample = cfg, sample
        self.sampling_params = dict(sampling_params)
        self.budget = int(sampling_params["max_new_tokens"])
        self.id = session_id or f"s{sample.index}-{secrets.token_hex(8)}"
        self.api_key = f"lean-rl-session-{secrets.token_urlsafe(24)}"
        self.model = str(cfg.engines.model_path)
        self.tokenizer = load_tokenizer(str(cfg.engines.model_path))  # cached per path
        self.tokens = SessionTokens(self.tokenizer, self.model)  # what it sampled and saw, to keep trajectories whole
        self.reward: float | None = None
        self.aborted = False
        self.closed = False
        self._rollout_stopping = stopping_event()  # set when the rollout wants no more of this sample
        self._reward_detail: Any = None
        self._assembler: TrajectoryAssembler | None = None
        self._server: CaptureServer | None = None
        self._numbers = itertools.count()
        self._errors: list[dict] = []
        self._late_calls = 0
        self.responses: dict[str, list[dict]] = {}  # Responses API: response id -> its chat history

    @property
    def base_url(self) -> str:
        """What an OpenAI client takes as base_url: http://host:port/sessions/<id>/v1"""
        if self._server is None:
            raise RuntimeError("CaptureSession.base_url: enter the session first (async with)")
        return f"{self._server.url}/sessions/{self.id}/v1"

    async def __aenter__(self) -> CaptureSession:
        if self.sample.response_length:  # an aborted trajectory: an agent cannot be resumed mid-way
            self.sample.reset_response()
        for key in _METADATA_KEYS:
            self.sample.metadata.pop(key, None)
        self.sample.loss_weight = 1.0  # samples() sets the trajectory's share
        self._assembler = TrajectoryAssembler(self.sample)
        self._server = await capture_server(self.cfg)
        self._server.register(self)
        return self

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        self.close()
        # the agent failed because we aborted its generation: the samples say ABORTED, not FAILED
        return self.aborted and exc is not None and isinstance(exc, Exception)

    def close(self) -> None:
        """No more calls (409 from now on); calls still running are answered but not recorded."""
        self.closed = True
        if self._server is not None:
            self._server.unregister(self.id)

    def accepts_key(self, key: str) -> bool:
        run_key = self.cfg.engines.api_key
        return hmac.compare_digest(key.encode(), self.api_key.encode()) or bool(
            run_key and hmac.compare_digest(key.encode(), run_key.encode()))

    # ------------------------------------------------------------ reward
    def set_reward(self, value: Any) -> None:
        """The trajectory's reward, set on each of its samples: a number, or named numbers (their sum is
        the reward, the parts go to metadata["reward_parts"]). A --rm-type / --custom-rm-path given to
        the run scores the samples afterwards and replaces it."""
        if isinstance(value, dict):
            if not value or not all(isinstance(k, str) and _is_number(v) for k, v in value.items()):
                raise ValueError(f"reward: expected a number or {{name: number}}, got {str(value)[:200]}")
            total = sum(float(v) for v in value.values())
        elif _is_number(value):
            total = float(value)
        else:
            raise ValueError(f"reward: expected a number or {{name: number}}, got {str(value)[:200]}")
        if not math.isfinite(total):
            raise ValueError(f"reward: {total} is not a finite number")
        self.reward, self._reward_detail = total, value

    # ------------------------------------------------------------ the result
    def samples(self) -> list[Sample]:
        """The Samples of the trajectory (one, or more where the exact-prefix property broke), finished."""
        if self._assembler is None:
            raise RuntimeError("CaptureSession.samples: the session was never entered")
        if len(self._assembler) == 0:
            sample = self.sample
            sample.status = Status.ABORTED if self.aborted else Status.FAILED
            sample.metadata["capture_error"] = ("the generation was aborted" if self.aborted else
                                                "the agent made no successful chat completion call")
            self._annotate(sample)
            return [sample]
        samples = self._assembler.samples(reward=self.reward)
        for sample in samples:
            if self.aborted:
                sample.status = Status.ABORTED
            sample.response = decode_ids(self.tokenizer, sample.response_tokens)
            self.tokens.images.fill_train_inputs(sample)  # as engine_prompt does for a data row's images
            sample.check()
            self._annotate(sample)
        return samples

    def _annotate(self, sample: Sample) -> None:
        sample.metadata["capture_session"] = self.id
        if self._errors:
            sample.metadata["capture_errors"] = list(self._errors)
        if isinstance(self._reward_detail, dict):
            sample.metadata["reward_parts"] = dict(self._reward_detail)
        if self.reward is not None:
            sample.metadata["agent_reward"] = self.reward
        if self._late_calls:
            sample.metadata["capture_late_calls"] = self._late_calls

    # ------------------------------------------------------------ one chat completion (server.py calls it)
    def refuse(self, message: str, param: str | None = None, status: int = 400) -> tuple[int, dict]:
        """Answer an error and record it in the session (it ends up in the samples' metadata)."""
        self._errors.append({"status": status, "message": message[:1000], "param": param})
        return status, error_body(message, param, status)

    async def chat_completion(self, body: Any) -> tuple[int, dict]:
        """One POST /v1/chat/completions: (HTTP status, OpenAI body)."""
        served = await self.complete(body)
        if isinstance(served, tuple):
            return served
        return 200, chat_completion_body(f"chatcmpl-{self.id}-{served.number}", self.model, served.completion,
                                         served.prompt_tokens, served.completion_tokens)

    async def response(self, body: Any) -> tuple[int, dict]:
        """One POST /v1/responses (the OpenAI Responses API, responses.py): (HTTP status, body)."""
        try:
            chat, history = chat_body_of_response_request(body, self.responses)
        except RequestError as err:
            return self.refuse(str(err), err.param, err.status)
        served = await self.complete(chat)
        if isinstance(served, tuple):
            return served
        response_id = f"resp_{self.id}_{served.number}"
        self.responses[response_id] = history + [served.completion.message]
        return 200, response_body(response_id, self.model, served.completion, served.prompt_tokens,
                                  served.completion_tokens)

    async def message(self, body: Any) -> tuple[int, dict]:
        """One POST /v1/messages (the Anthropic Messages API, messages.py): (HTTP status, body)."""
        try:
            chat = chat_body_of_messages_request(body)
        except RequestError as err:
            status, answer = self.refuse(str(err), err.param, err.status)
            return status, anthropic_error(answer, status)
        served = await self.complete(chat)
        if isinstance(served, tuple):
            return served[0], anthropic_error(served[1], served[0])
        return 200, message_body(f"msg_{self.id}_{served.number}", self.model, served.completion,
                                 served.prompt_tokens, served.completion_tokens, chat.get("stop", []))

    async def complete(self, body: Any) -> Served | tuple[int, dict]:
        """One generation for a chat-completions request body (the Responses and Messages endpoints
        translate theirs into one, agent_apis.py): what was answered, or (HTTP status, OpenAI error
        body) for a refused call. Every served call is recorded."""
        number = next(self._numbers)
        entered = time.monotonic()
        if self._rollout_stopping is not None and self._rollout_stopping.is_set():
            self.aborted = True  # surplus, or weights are changing: the agent's next call is not served
        if self.aborted:
            return 503, error_body(_ABORTED_MESSAGE, None, 503)
        try:
            request = parse_chat_request(body)
            chat = self.tokens.render(request)  # images: loaded, one pad each in the text
            prompt_ids = self.tokens.prompt_ids(chat)  # images: the processor's expansion
            prompt = self.tokens.engine_prompt(prompt_ids, chat)
        except RequestError as err:
            return self.refuse(str(err), err.param, err.status)
        left = self.budget - self._assembler.response_length_after_prompt(prompt_ids, chat.image_keys)
        if left <= 0:
            self._assembler.mark_truncated(prompt_ids, chat.image_keys)
            return Served(number, completion_from_output("", "length", None, False), len(prompt_ids), 0)
        params = call_sampling_params(self.sampling_params, request, left)
        started = time.monotonic()
        try:
            result = await generate_with_retries(self.cfg, prompt, params, rid=f"capture-{self.id}-{number}",
                                                 routing_key=self.id)
        except EngineError as err:
            client_fault = isinstance(err, EngineHTTPError) and 400 <= err.status_code < 500
            return self.refuse(f"generation failed: {err}", None, 400 if client_fault else 502)
        if result.aborted:
            self.aborted = True
            return self.refuse(_ABORTED_MESSAGE, None, 503)
        seconds = time.monotonic() - started
        eos = result.finish_reason == "stop" and isinstance(result.finish_detail, int) \
            and result.output_ids[-1:] == [result.finish_detail]
        spoken_ids = result.output_ids[:-1] if eos else result.output_ids
        history_text = self.tokens.text_after(prompt_ids, spoken_ids)
        completion = completion_from_output(history_text, result.finish_reason, result.finish_detail,
                                            request.parse_tools)
        if self.closed:
            self._late_calls += 1
        else:
            call = CallRecord(prompt_ids, result.output_ids, result.output_log_probs, token_versions(result),
                              result.finish_reason, info={
                                  "call": number, "engine_prompt_tokens": result.prompt_tokens,
                                  "cached_tokens": result.cached_tokens, "engine_seconds": round(seconds, 4),
                                  # rendering, tokenizing, decoding, parsing: what the endpoint adds
                                  "capture_seconds": round(time.monotonic() - entered - seconds, 5),
                                  "temperature": params["temperature"], "top_p": params["top_p"],
                                  "max_new_tokens": params["max_new_tokens"],
                                  "tool_calls": len(completion.message.get("tool_calls") or ()),
                                  **({"tool_call_errors": list(completion.tool_call_errors)}
                                     if completion.tool_call_errors else {})},
                              routed_experts=result.routed_experts, images=chat.image_refs, image_keys=chat.image_keys)
            self._assembler.add(call)
            self.tokens.remember(prompt, prompt_ids, result.output_ids, completion.message, history_text, chat)
        return Served(number, completion, len(prompt_ids), len(result.output_ids))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
