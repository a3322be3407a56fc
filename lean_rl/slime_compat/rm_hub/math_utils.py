"""slime.rollout.rm_hub.math_utils: the boxed answer of a response, and answer grading (by math-verify,
lean_rl's grader, in this thread: the async rewards of rm_hub grade in lean_rl's worker process)."""

from __future__ import annotations

from lean_rl.rollout.rewards import last_boxed


def extract_answer(text: str) -> str | None:
    """The content of the last \\boxed{...} of `text` (None when there is none)."""
    return last_boxed(text) if text else None


def grade_answer_verl(response: str, label) -> bool:
    """Whether the boxed answer of `response` equals `label` mathematically."""
    answer = extract_answer(response)
    return answer is not None and grade(answer, str(label))


def grade(answer: str, label: str) -> bool:
    from math_verify import parse, verify

    def as_math(text: str) -> str:
        return text if "$" in text or "\\" in text else f"${text}$"

    # no timeouts: math-verify bounds them with signal.alarm, which works on the main thread only
    # parsing_timeout=None is math-verify's documented "no timeout", though annotated int
    gold = parse(as_math(label), parsing_timeout=None)  # type: ignore[arg-type]
    guess = parse(as_math(answer), parsing_timeout=None)  # type: ignore[arg-type]
    return bool(gold) and bool(guess) and bool(verify(gold, guess, timeout_seconds=None))


grade_answer_mathd = grade
grade_answer_sympy = grade
