"""Multi-turn rollouts (lean_rl/rollout/multi_turn.py) against the real engines and router: token in,
token out (each turn's prompt is the earlier ids, as the engine saw them), the loss mask covers exactly
the model's tokens, one trajectory stays on one engine, and a bad environment fails only its sample."""

import asyncio
import dataclasses
import json
import sys
import textwrap

import pytest

from lean_rl.extensions import install as install_hooks
from lean_rl.backends.sglang.client import EngineClient
from lean_rl.buffer.data_buffer import create_data_buffer
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.config import parse_config
from lean_rl.rollout.default import generate_rollout
from lean_rl.sample import NOT_GENERATED, Status

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env_module(tmp_path_factory):
    root = tmp_path_factory.mktemp("envs")
    (root / "turn_envs.py").write_text(textwrap.dedent("""
        import asyncio
        from lean_rl.rollout.environment import Observation, StepResult

        class Feedback:
            '''Three model turns; after each one a tool message (a chat turn), reward 0.25 per turn.'''
            def __init__(self, cfg, sample):
                self.turn, self.actions = 0, []
            async def reset(self, sample):
                return None
            async def step(self, action):
                self.turn += 1
                self.actions.append(action)
                return StepResult(Observation(text=f"feedback {self.turn}: ok", role="tool"), 0.25, self.turn == 3,
                                  {"action_chars": len(action)})

        class StartsWithText(Feedback):
            async def reset(self, sample):
                return Observation(text="the game begins", role="user")

        class Endless(Feedback):
            async def step(self, action):
                return "go on", None, False

        class RaisesOnSecond(Feedback):
            async def step(self, action):
                self.turn += 1
                if self.turn == 2:
                    raise RuntimeError("environment exploded")
                return "fine", 0.0, False

        class Hangs(Feedback):
            async def step(self, action):
                await asyncio.sleep(3600)

        class WrongType(Feedback):
            async def step(self, action):
                return {"observation": "not a tuple"}
    """))
    sys.path.insert(0, str(root))
    yield
    sys.path.remove(str(root))


@pytest.fixture(scope="module")
def chat_prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("mt_data") / "prompts.jsonl"
    words = "the cat dog sat on mat ran fast big small red blue".split()
    path.write_text("".join(json.dumps({"prompt": " ".join(words[i:i + 4]), "label": "x"}) + "\n" for i in range(8)))
    return path


def rollout(engine_group, prompts, env, *flags):
    cfg = parse_config(["--hf-checkpoint", engine_group.config.model_path, "--prompt-data", str(prompts),
                        "--apply-chat-template", "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
                        "--rollout-max-response-len", "96", "--max-tokens-per-turn", "12",
                        "--environment-path", f"turn_envs.{env}", *flags])
    cfg = dataclasses.replace(cfg, engines=engine_group.config)
    install_hooks(cfg)  # what a run does at start-up
    buffer = create_data_buffer(cfg)
    out = asyncio.run(generate_rollout(cfg, 0, buffer))
    return cfg, out, [s for g in buffer.get_train_groups(100) for s in g]


def test_turns_extend_each_other_token_exactly(engine_group, chat_prompts, env_module):
    cfg, out, samples = rollout(engine_group, chat_prompts, "Feedback", "--rollout-temperature", "1.0")
    assert len(samples) == 8 and out.metrics["rollout/samples"] == 8
    tokenizer = load_tokenizer(cfg.engines.model_path)
    client = EngineClient(cfg.engines.engine_urls[0], api_key=cfg.engines.api_key)

    async def engine_log_probs(tokens):
        return (await client.score(tokens)).log_probs

    for s in samples:
        s.check()
        assert s.status is Status.COMPLETED and s.metadata["stop_reason"] == "done"
        assert s.reward == pytest.approx(0.75)
        turns = s.metadata["turns"]
        assert len(turns) == 3
        # the ids of turn k+1's prompt are turn k's prompt + its output + the observation, and the
        # engine counted exactly the ids we sent
        position = s.prompt_length
        for k, turn in enumerate(turns):
            assert turn["input_tokens"] == turn["engine_prompt_tokens"] == position
            generated = s.tokens[position:position + turn["output_tokens"]]
            assert s.loss_mask[position - s.prompt_length:][:turn["output_tokens"]] == [1] * turn["output_tokens"]
            position += turn["output_tokens"]
            if k + 1 < len(turns):
                observation = s.tokens[position:turns[k + 1]["input_tokens"]]
                text = tokenizer.decode(observation)
                assert f"feedback {k + 1}: ok" in text and "<|im_start|>tool" in text and text.endswith("assistant\n")
                if generated[-1] == tokenizer.eos_token_id:  # the model closed its turn: not closed twice
                    assert not text.startswith("<|im_end|>")
                position = turns[k + 1]["input_tokens"]
            # one trajectory, one engine: later turns find the earlier ones in that engine's prefix cache
            if k > 0:
                assert turn["cached_tokens"] >= turns[k - 1]["input_tokens"], turns
        assert position == len(s.tokens)
        # the loss mask covers exactly the model's tokens (the per-turn outputs), nothing else
        assert sum(s.loss_mask) == sum(t["output_tokens"] for t in turns)
        masked = [i for i, m in enumerate(s.loss_mask) if m == 0]
        assert masked and all(s.weight_versions[i] == NOT_GENERATED and s.rollout_log_probs[i] == 0 for i in masked)
        # the engine's own view: scoring the whole trajectory gives the log-probs recorded at sampling
        scored = asyncio.run(engine_log_probs(s.tokens))[s.prompt_length - 1:]
        for i, m in enumerate(s.loss_mask):
            if m:
                assert scored[i] == pytest.approx(s.rollout_log_probs[i], abs=2e-3), (s.index, i)


def test_reset_observation_joins_the_prompt_as_a_message(engine_group, chat_prompts, env_module):
    cfg, _, samples = rollout(engine_group, chat_prompts, "StartsWithText", "--rollout-batch-size", "1")
    tokenizer = load_tokenizer(cfg.engines.model_path)
    for s in samples:
        assert s.status is Status.COMPLETED and s.metadata["prompt_length_before_reset"] < s.prompt_length
        prompt = tokenizer.decode(s.tokens[:s.prompt_length])
        assert prompt.endswith("<|im_end|>\n<|im_start|>user\nthe game begins<|im_end|>\n<|im_start|>assistant\n")
        assert prompt.count("<|im_start|>assistant") == 1  # no empty assistant turn before it
        assert s.metadata["turns"][0]["input_tokens"] == s.metadata["turns"][0]["engine_prompt_tokens"] == s.prompt_length


@pytest.mark.parametrize("env, flags, reason, error", [
    ("Endless", (), "max_turns", None),
    ("Endless", ("--rollout-max-response-len", "30"), "response_budget", None),
    ("RaisesOnSecond", (), None, "environment step raised RuntimeError: environment exploded"),
    ("Hangs", (), None, "environment step took longer than --environment-timeout 1 s"),
    ("WrongType", (), None, "step returned dict"),
])
def test_a_bad_environment_fails_only_its_sample(engine_group, chat_prompts, env_module, env, flags, reason, error):
    cfg, out, samples = rollout(engine_group, chat_prompts, env, "--max-turns", "3", "--environment-timeout", "1",
                                "--rollout-batch-size", "1", "--max-failed-fraction", "1.0",
                                "--rm-type", "f1", *flags)
    assert len(samples) == 2
    for s in samples:
        s.check()
        if reason:
            assert s.status is Status.TRUNCATED and s.metadata["stop_reason"] == reason
            turns = len(s.metadata["turns"])
            assert turns == 3 if reason == "max_turns" else 1 <= turns <= 3
            assert s.response_length <= cfg.rollout.sampling.max_response_len
        else:
            assert s.status is Status.FAILED and error in s.metadata["environment_error"]
    if error:
        assert out.metrics["rollout/environment_failed"] == 2
