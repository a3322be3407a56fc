"""An LLM judge as a rewarder: a generative model, on engines this run starts (--judge-hf-checkpoint)
or a server of yours (--judge-url), is asked about each finished sample through its chat endpoint
(/v1/chat/completions), and its answer is read into a reward. A --judge-url's key comes from the
environment variable --judge-api-key-env names (utils/env_keys.py), sent as `Authorization: Bearer`.

The question comes from --judge-template and the answer is read by --judge-parser: built-ins of each
name (score_0_10: "rate 0-10", reward = score / 10; a_or_b: "is the response (A) right or (B) wrong",
reward 1 / 0) or dotted paths of the user's functions, resolved once at start-up (`Judge.from_config`).
A judge that cannot be reached, answers 5xx or answers nothing parseable is asked again
(--judge-retries), all within --judge-timeout; after that JudgeError, which rewards.score_group turns
into a FAILED sample (metadata["reward_error"], rollout/reward_failed; rollout/judge_failed counts
these): a fault of the judge is never a reward.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lean_rl.backends.sglang.client_errors import EngineError
from lean_rl.rollout.base import engine_client
from lean_rl.sample import Sample
from lean_rl.utils.env_keys import bearer_header

if TYPE_CHECKING:
    from pathlib import Path

    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.config import Config

JUDGE_ERROR = "judge_error"  # metadata key of a sample the judge could not score (FAILED)

SCORE_TEMPLATE = (
    "Rate how well the response answers the question, from 0 (useless or wrong) to 10 (fully correct).\n\n"
    "Question:\n{prompt}\n\nResponse:\n{response}\n\n{reference}"
    "Reply with the rating alone, as: Rating: N")
A_OR_B_TEMPLATE = (
    "Is the response a correct answer to the question?\n\nQuestion:\n{prompt}\n\nResponse:\n{response}\n\n"
    "{reference}Answer with one letter: A (correct) or B (incorrect).")


class JudgeError(RuntimeError):
    """The judge gave no usable answer for a sample (unreachable, 5xx, nothing parseable, too slow)."""


def _fill(template: str, sample: Sample) -> str:
    reference = f"Reference answer:\n{sample.label}\n\n" if sample.label not in (None, "") else ""
    prompt = sample.prompt if isinstance(sample.prompt, str) else str(sample.prompt)
    return template.format(prompt=prompt, response=sample.response, reference=reference)


def score_0_10_template(sample: Sample) -> str:
    return _fill(SCORE_TEMPLATE, sample)


def a_or_b_template(sample: Sample) -> str:
    return _fill(A_OR_B_TEMPLATE, sample)


def parse_score_0_10(text: str) -> float | None:
    """The last number 0-10 after "Rating:" (else the last number 0-10 in the text) / 10; None if none."""
    rated = re.findall(r"rating\s*[:=]?\s*(\d+(?:\.\d+)?)", text, flags=re.IGNORECASE)
    numbers = rated or re.findall(r"(?<![\d.])(\d+(?:\.\d+)?)(?![\d.])", text)
    for number in reversed(numbers):
        value = float(number)
        if 0 <= value <= 10:
            return value / 10
    return None


def parse_a_or_b(text: str) -> float | None:
    """1.0 for an answer of A, 0.0 for B: the letter after the last "answer (is)", else the one lone
    letter A or B in the text; None if neither, or both without "answer"."""
    stated = re.findall(r"answer(?:\s+is)?\s*[:=]?\s*\(?([AB])\)?(?![A-Za-z])", text, flags=re.IGNORECASE)
    if stated:
        return 1.0 if stated[-1] == "A" else 0.0
    letters = set(re.findall(r"(?<![A-Za-z])\(?([AB])\)?(?![A-Za-z])", text.strip()))
    return (1.0 if letters == {"A"} else 0.0) if len(letters) == 1 else None


BUILTIN_TEMPLATES: dict[str, Callable[[Sample], str]] = {"score_0_10": score_0_10_template,
                                                         "a_or_b": a_or_b_template}
BUILTIN_PARSERS: dict[str, Callable[[str], float | None]] = {"score_0_10": parse_score_0_10, "a_or_b": parse_a_or_b}


def judge_engine_group(cfg: Config, output_dir: Path) -> EngineGroup | None:
    """The judge's engine group when this run serves it (--judge-hf-checkpoint), not yet started."""
    from lean_rl.backends.sglang.engines import EngineGroup

    engines = cfg.reward_serving.judge_engines
    return None if engines is None else EngineGroup(engines, output_dir / "judge_engines", name="judge_engines")


@dataclass(frozen=True)
class Judge:
    """The judge as a reward function: `await judge(cfg, sample)` -> the parsed reward."""

    template: Callable[[Sample], str]
    parse: Callable[[str], float | None]

    @classmethod
    def from_config(cls, cfg: Config) -> Judge:
        """The template and parser, built-in or imported (once, at start-up; a bad path fails here)."""
        from lean_rl.utils.plugins import load_function

        serving = cfg.reward_serving
        template = BUILTIN_TEMPLATES.get(serving.judge_template) or load_function(
            serving.judge_template, "--judge-template", num_args=1, must_be_sync=True)
        parse = BUILTIN_PARSERS.get(serving.parser_name) or load_function(
            serving.parser_name, "--judge-parser", num_args=1, must_be_sync=True)
        return cls(template, parse)

    async def __call__(self, cfg: Config, sample: Sample) -> float:
        serving = cfg.reward_serving
        try:
            return await asyncio.wait_for(self._ask(cfg, sample), timeout=serving.judge_timeout)
        except asyncio.TimeoutError:
            error = JudgeError(f"no usable answer within --judge-timeout {serving.judge_timeout:g} s")
        except JudgeError as err:
            error = err
        sample.metadata[JUDGE_ERROR] = str(error)[:2000]
        raise error

    async def _ask(self, cfg: Config, sample: Sample) -> float:
        serving = cfg.reward_serving
        question = self.template(sample)
        if not isinstance(question, str):
            raise TypeError(f"--judge-template {serving.judge_template} returned {type(question).__name__}, not str")
        body = {"model": "default", "messages": [{"role": "user", "content": question}],
                "max_tokens": serving.judge_max_new_tokens, "temperature": serving.judge_temperature}
        client = judge_client(cfg)
        last = ""
        for attempt in range(serving.judge_retries + 1):
            if attempt:
                await asyncio.sleep(min(2.0 ** (attempt - 1), 10.0))
            try:
                reply = (await client.request("POST", "/v1/chat/completions", body, headers=judge_headers(cfg))).json()
                answer = reply["choices"][0]["message"]["content"] or ""
            except EngineError as err:
                if getattr(err, "status_code", 500) < 500:  # the judge refuses the request itself: no retry
                    raise JudgeError(f"the judge refused the request: {err}") from None
                last = f"{type(err).__name__}: {err}"
                continue
            except (ValueError, KeyError, IndexError, TypeError):
                last = f"an answer not in the chat-completions form: {str(reply)[:300]}"
                continue
            value = self.parse(answer)
            if value is not None:
                return float(value)
            last = f"nothing parseable by --judge-parser {serving.parser_name}: {answer[:300]!r}"
        raise JudgeError(f"{serving.judge_retries + 1} tries, the last answered {last}")


_prepared: dict[tuple[str, str], Judge] = {}  # (template, parser) -> the Judge resolved at start-up


def prepare_judge(cfg: Config) -> Judge:
    """The run's Judge, its template and parser resolved now (extensions.load calls it at start-up)."""
    serving = cfg.reward_serving
    key = (serving.judge_template, serving.parser_name)
    if key not in _prepared:
        _prepared[key] = Judge.from_config(cfg)
    return _prepared[key]


async def judge_score(cfg: Config, sample: Sample) -> float:
    """The judge's reward for the sample (for a --custom-rm-path that returns it in a dict); JudgeError
    when the judge gives none."""
    serving = cfg.reward_serving
    judge = _prepared.get((serving.judge_template, serving.parser_name))
    if judge is None:
        raise RuntimeError("judge_score needs --judge-hf-checkpoint or --judge-url (no judge was prepared)")
    return await judge(cfg, sample)


def judge_headers(cfg: Config) -> dict[str, str] | None:
    """--judge-url's key (--judge-api-key-env) as a Bearer header; None for a judge this run serves (its
    client sends the run's key, to listeners proven to be the run's)."""
    serving = cfg.reward_serving
    return bearer_header(serving.judge_api_key_env, "--judge-api-key-env") or None


def judge_client(cfg: Config):
    serving = cfg.reward_serving
    if serving.judge_url is not None:
        return engine_client(serving.judge_url, serving.judge_timeout, None)
    engines = serving.judge_engines
    assert engines is not None  # RewardServingConfig: a judge URL or engines
    return engine_client(engines.router_url, engines.request_timeout_s, engines.api_key)
