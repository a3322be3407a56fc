"""--ci-test: checks for the CI of a recipe, after each training step (slime has a flag of the name).

At step 0 the trainer and the engine hold the same weights, so the trainer's log-probs of the rollout
must equal the engine's up to numerics (mean |Δ log p| and KL(rollout || train) within
--ci-test-max-mismatch), and the reference model's must equal the trainer's exactly up to float32
rounding (≤ 1e-6, when a reference is loaded). Every later step of a synchronous run must keep the
mismatch within the bound (in the async modes a later step's mismatch includes the policy lag, so only
step 0 is checked). A failed check stops the run, naming the metric, its value and the bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lean_rl.config import Config

OLD_VS_REFERENCE_BOUND = 1e-6  # float32: the same weights through the same forward


class CITestFailed(AssertionError):
    """A --ci-test check failed."""


def check_step(cfg: Config, step: int, metrics: dict[str, float]) -> None:
    bound = cfg.run.ci_test_max_mismatch
    failures = []
    if step == 0 or cfg.run.async_mode == "off":
        for key in ("train/rollout_logprob_abs_diff", "train/mismatch_kl"):
            if key not in metrics:
                failures.append(f"{key} was not logged")
            elif not abs(metrics[key]) <= bound:  # `not <=`: NaN fails too
                failures.append(f"{key} = {metrics[key]:.3g} > --ci-test-max-mismatch {bound:g}")
    old_ref = metrics.get("train/old_ref_max_abs_diff")
    if step == 0 and old_ref is not None and not old_ref <= OLD_VS_REFERENCE_BOUND:
        failures.append(f"train/old_ref_max_abs_diff = {old_ref:.3g} > {OLD_VS_REFERENCE_BOUND:g}: the reference "
                        "model differs from the actor before any update (wrong --ref-load?)")
    if failures:
        raise CITestFailed(f"--ci-test: step {step}: " + "; ".join(failures))
