"""--verifiers-env: an environment of the verifiers library trained as it is (an optional extra:
pip install -r requirements-envs.txt -c requirements.txt; the core install does not carry it).

The environment's own rollout logic (single-turn, multi-turn, tools: `env.rollout(input, client,
model, sampling_args)`) runs with an OpenAI client pointed at a capture session
(lean_rl/rollout/openai_capture): every chat completion it makes is one engine call, recorded
token-exact, and the conversation comes back as lean_rl Samples. The environment's rubric scores the
rollout: its reward is the sample's, the rubric's per-function metrics are kept in
metadata["rewards"] (a --rm-type / --custom-rm-path given to the run scores the samples instead).
Without --prompt-data or --data-source-path the environment's dataset (`env.get_dataset()`) feeds
the buffer, each row's prompt rendered with the served model's chat template (`prompts` below).

    --verifiers-env my_envs.arithmetic.load_environment      # a function returning a vf.Environment
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from lean_rl.buffer.prompt_source import PromptRecord, PromptSource, load_tokenizer, render_prompt
from lean_rl.options import rebuild
from lean_rl.rollout.openai_capture import CaptureSession
from lean_rl.sample import Sample, Status
from lean_rl.utils.plugins import PluginError, import_object

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group
    from lean_rl.config import Config

FLAG = "--verifiers-env"
INPUT_KEY = "verifiers_input"  # sample.metadata: the row's example_id, task and info, as the env reads them


@functools.lru_cache(maxsize=4)
def load_environment(path: str):
    """The vf.Environment `path` names (an Environment, or a function of no arguments returning one)."""
    try:
        import verifiers as vf
    except ImportError as err:
        raise PluginError(f"{FLAG} {path}: the verifiers library is not installed ({err}); install the optional "
                          "extra: pip install -r requirements-envs.txt -c requirements.txt") from None
    found = import_object(path, FLAG)
    env = found if isinstance(found, vf.Environment) else found()
    if not isinstance(env, vf.Environment):
        raise PluginError(f"{FLAG} {path}: expected a verifiers Environment (or a function returning one), "
                          f"got {type(env).__name__}")
    if env.message_type != "chat":
        raise PluginError(f"{FLAG} {path}: message_type {env.message_type!r}: the capture endpoint serves chat "
                          "completions; use a chat environment")
    return env


def prompts(cfg: Config) -> PromptSource:
    """--data-source-path's factory: the environment's dataset as the buffer's prompts (shuffle, seed and
    epochs as for --prompt-data)."""
    env = load_environment(cfg.rollout.multi_turn.verifiers_env)
    dataset = env.get_dataset()
    tokenizer = load_tokenizer(cfg.engines.model_path)
    chat = rebuild(cfg.data, apply_chat_template=True)  # the environment's prompts are chat messages
    records = []
    for row, item in enumerate(dataset, start=1):
        messages = item["prompt"]
        tokens = render_prompt(messages, chat, tokenizer, tools=item.get("info", {}).get("oai_tools") or None)
        records.append(PromptRecord(row=row, prompt=messages, tokens=tuple(tokens),
                                    label=item.get("answer", ""),
                                    metadata={INPUT_KEY: {"example_id": item.get("example_id", row - 1),
                                                          "task": item.get("task", "default"),
                                                          "info": item.get("info") or {}}}))
    if not records:
        raise PluginError(f"{FLAG} {cfg.rollout.multi_turn.verifiers_env}: its dataset is empty")
    return PromptSource(records, shuffle=cfg.data.rollout_shuffle, seed=cfg.data.seed, num_epochs=cfg.data.num_epochs)


def rollout_input(sample: Sample) -> dict[str, Any]:
    row = sample.metadata.get(INPUT_KEY) or {}
    prompt = sample.prompt if isinstance(sample.prompt, list) else [{"role": "user", "content": str(sample.prompt)}]
    return {"prompt": prompt, "answer": "" if sample.label is None else str(sample.label),
            "example_id": row.get("example_id", sample.group_index), "task": row.get("task", "default"),
            "info": row.get("info", {})}


async def generate(cfg: Config, sample: Sample, sampling_params: dict, evaluation: bool = False) -> list[Sample]:
    """--custom-generate-function-path when --verifiers-env is given: one rollout of the environment."""
    import openai

    env = load_environment(cfg.rollout.multi_turn.verifiers_env)
    args = {"temperature": sampling_params.get("temperature"), "top_p": sampling_params.get("top_p"),
            "max_tokens": sampling_params["max_new_tokens"]}
    async with CaptureSession(cfg, sample, sampling_params) as session:
        async with openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0) as client:
            state = await env.rollout(rollout_input(sample), client, session.model, args)
            await env.rubric.score_rollout(state)
        if state.get("reward") is not None:
            session.set_reward(float(state["reward"]))
    samples = session.samples()
    error = state.get("error")
    for out in samples:
        if state.get("metrics"):
            out.metadata["rewards"] = {k: float(v) for k, v in state["metrics"].items()}
        if error is not None and out.status != Status.ABORTED:
            out.status = Status.FAILED
            out.metadata["generate_error"] = f"the environment's rollout failed: {error!r}"[:500]
        if out.status != Status.FAILED and state.get("reward") is not None:
            out.reward = float(state["reward"])
    return samples
