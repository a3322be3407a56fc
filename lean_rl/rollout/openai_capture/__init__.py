"""An OpenAI-compatible capture endpoint: an unmodified agent written with the `openai` client
(base_url + api_key) becomes a lean_rl rollout, every call recorded token-exact.

    from lean_rl.rollout.openai_capture import CaptureSession

    async def generate(cfg, sample, sampling_params):          # --custom-generate-function-path
        async with CaptureSession(cfg, sample, sampling_params) as session:
            client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key)
            await my_agent(client, sample.prompt)
        return session.samples()

The same session also serves the OpenAI Responses API (POST /v1/responses, `client.responses.create`)
and the Anthropic Messages API (POST /v1/messages, `anthropic.AsyncAnthropic(base_url=session.base_url
minus "/v1", api_key=session.api_key)`), each translated to a chat request and recorded the same way.

session.py: the session (rendering, the engine call, what is recorded); server.py: the HTTP endpoint;
chat.py: the OpenAI chat wire format; responses.py, messages.py: the Responses and Messages formats;
trajectory.py: calls -> a call tree -> Samples (one per path, each with loss_weight 1/n);
image_parts.py, image_tokens.py: image_url parts for a vision-language model (docs/vlm.md).
"""

from lean_rl.rollout.openai_capture.server import capture_server, stop_capture_servers
from lean_rl.rollout.openai_capture.session import CaptureSession
from lean_rl.rollout.openai_capture.trajectory import CallRecord, TrajectoryAssembler, fanout_index

__all__ = ["CaptureSession", "CallRecord", "TrajectoryAssembler", "capture_server", "fanout_index",
           "stop_capture_servers"]
