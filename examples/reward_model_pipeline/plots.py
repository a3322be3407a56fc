"""The example's plots and its summary, from what run.sh wrote under OUT:

    python examples/reward_model_pipeline/plots.py OUT

OUT/rm.png (the first reward model's Bradley-Terry loss and pair accuracy per step, the held-out accuracy
of each round's reward model), OUT/grpo.png (GRPO against the reward model: the rule reward it never saw
and the reward model's score, per step, the rounds at which the reward model was refitted, the main job's
rule reward beside them), OUT/dpo.png (DPO's loss and accuracy per step, and
the rule reward of its checkpoints); the summary (markdown) on stdout."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lean_rl.utils.metrics import read_metrics


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pairs = [(row["step"], row[key]) for row in rows if key in row]
    return [s for s, _ in pairs], [v for _, v in pairs]


def tail_mean(rows: list[dict], key: str, n: int = 5, head: bool = False) -> float:
    """The mean of the first (head) or last n values of `key`."""
    values = series(rows, key)[1]
    values = values[:n] if head else values[-n:]
    return sum(values) / len(values) if values else float("nan")


def figure(ncols: int) -> Figure:
    fig = Figure(figsize=(5.2 * ncols, 3.4), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def results(out: Path) -> tuple[list[dict], list[dict], dict[str, float]]:
    """From results.jsonl: (each round's reward model on the held-out pairs, each round's reward model on
    the policy's pairs of the GRPO round it served, {model dir: rule reward})."""
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    accuracy = [r for r in rows if "accuracy" in r]
    heldout = [r for r in accuracy if r.get("pairs_file", "").endswith("heldout_pairs.jsonl")]
    onpolicy = [r for r in accuracy if "/onpolicy_" in r.get("pairs_file", "")]
    return heldout, onpolicy, {r["model"]: r["rule_reward"] for r in rows if "rule_reward" in r}


def round_of(path: str) -> int:
    """3 for .../round_3 or .../round_3/hf"""
    return int(next(part for part in Path(path).parts if part.startswith("round_")).split("_")[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    out = parser.parse_args().out
    rm, grpo, dpo, main_job = (read_metrics(out / name / "run") for name in ("rm/round_0", "grpo", "dpo", "main"))
    heldout, onpolicy, rule = results(out)
    grpo_rounds = sorted((round_of(m), r) for m, r in rule.items() if "/grpo/hf/round_" in m)
    steps_per_round = max((int(m["step"]) for m in grpo), default=0) + 1
    steps_per_round //= max(len(grpo_rounds), 1)

    fig = figure(2)
    loss, acc = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    loss.plot(*series(rm, "train/rm_loss"))
    loss.set(title="reward model: Bradley-Terry loss", xlabel="step (32 pairs)")
    acc.plot(*series(rm, "train/rm_accuracy"), label="training pairs of the step")
    for line in heldout:
        k = round_of(line["model"])
        acc.axhline(line["accuracy"], color=f"C{1 + k}", ls="--", lw=1,
                    label=f"held-out pairs, reward model of round {k}: {line['accuracy']:.2f}")
    acc.axhline(0.5, color="grey", lw=0.8, label="chance")
    acc.set(title="reward model: pair accuracy", xlabel="step (32 pairs)", ylim=(0, 1.02))
    acc.legend(fontsize=8)
    fig.savefig(out / "rm.png", dpi=80)

    fig = figure(2)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    left.plot(*series(grpo, "rollout/reward/rule_mean"), label="GRPO on the reward model: rule reward (hidden)")
    left.plot(*series(grpo, "eval/toy/reward/rule_mean"), "o", color="C0", label="  the same, eval prompts")
    if main_job:
        left.plot(*series(main_job, "rollout/reward_mean"), color="C2", label="main job (trained on the rule)")
    for k in range(1, len(grpo_rounds)):
        for axes in (left, right):
            axes.axvline(k * steps_per_round - 0.5, color="grey", lw=0.8, ls=":")
    left.set(title="rule reward (dotted: reward model refitted)", xlabel="step (8 prompts x 8)", ylim=(0, 1.02))
    left.legend(fontsize=8)
    right.plot(*series(grpo, "rollout/reward/rm_mean"), color="C3")
    right.set(title="GRPO: the reward model's score (trained on)", xlabel="step (8 prompts x 8)")
    fig.savefig(out / "grpo.png", dpi=80)

    dpo_points = sorted((int(Path(m).name.split("_")[1]), r) for m, r in rule.items() if "/dpo/hf/step_" in m)
    fig = figure(2)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    left.plot(*series(dpo, "train/dpo_loss"), label="loss")
    left.plot(*series(dpo, "train/dpo_accuracy"), label="pair accuracy (margin > 0)")
    left.set(title="DPO (beta 0.1) on the pairs", xlabel="step (32 pairs)")
    left.legend(fontsize=8)
    start = rule.get(str(out / "model"))
    right.plot([0, *(s for s, _ in dpo_points)], [start, *(r for _, r in dpo_points)], "o-")
    right.set(title="DPO checkpoints: rule reward (eval prompts)", xlabel="step", ylim=(0, 1.02))
    fig.savefig(out / "dpo.png", dpi=80)

    grpo_rule = grpo_rounds[-1][1]
    main_rule = rule.get(str(out / "main" / "hf"))
    print("| policy | rule reward, eval prompts (4 samples each, T=1) |\n|---|---|")
    print(f"| the tiny model at the start | {start:.3f} |")
    if main_rule is not None:
        print(f"| main job: GRPO on the rule reward | {main_rule:.3f} |")
    for k, value in grpo_rounds:
        print(f"| GRPO on the reward model (rule never trained on), after round {k} "
              f"(step {k * steps_per_round}) | {value:.3f} |")
    for step, value in dpo_points:
        print(f"| DPO, step {step} | {value:.3f} |")
    print(f"\nreward model of round 0: last training steps' accuracy {tail_mean(rm, 'train/rm_accuracy'):.3f}, "
          f"loss {tail_mean(rm, 'train/rm_loss'):.3f}")
    for line in heldout:
        print(f"reward model of round {round_of(line['model'])}: held-out pair accuracy {line['accuracy']:.3f} over "
              f"{line['pairs']} pairs (mean margin {line['mean_margin']:.2f})")
    for line in onpolicy:
        print(f"reward model of round {round_of(line['model'])} on the policy's pairs of the GRPO round it served: "
              f"accuracy {line['accuracy']:.3f} over {line['pairs']} pairs (mean margin {line['mean_margin']:.2f})")
    print(f"GRPO on the reward model, last 5 steps: rule reward {tail_mean(grpo, 'rollout/reward/rule_mean'):.3f} "
          f"(first 5: {tail_mean(grpo, 'rollout/reward/rule_mean', head=True):.3f})")
    if main_rule is not None:
        print(f"GRPO on the reward model / main job (rule reward, eval): {grpo_rule / main_rule:.2f} (goal >= 0.8)")


if __name__ == "__main__":
    main()
