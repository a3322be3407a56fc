"""The example's figure, from the run's metrics.jsonl:

    python examples/vlm_shapes/plots.py RUN_DIR OUT.png [--greedy RESULTS.jsonl]

Left: the training reward per GRPO step (mean over the step's 64 samples at temperature 1, with the
mean of the last 5 steps) and the held-out evaluations in the loop, on the true images and on shuffled
ones (each question with another row's picture). Right (--greedy): warm_start.py --evaluate lines
(greedy answers of the warm start and of the trained model, true vs shuffled images), as bars.
"""

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--greedy", type=Path, help="warm_start.py --evaluate lines, one JSON object each")
    args = parser.parse_args(argv)
    rows = read_metrics(args.run)
    greedy = ([json.loads(line) for line in args.greedy.read_text().splitlines() if line.strip()]
              if args.greedy else [])
    fig = Figure(figsize=(11 if greedy else 6, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 2 if greedy else 1, 1)
    steps, reward = series(rows, "rollout/reward_mean")
    ax.plot(steps, reward, color="C0", alpha=0.5, label="training reward (T=1)")
    smooth = [sum(reward[max(0, i - 4):i + 1]) / len(reward[max(0, i - 4):i + 1]) for i in range(len(reward))]
    ax.plot(steps, smooth, color="C0", label="training reward, mean of last 5")
    for name, colour, label in (("shapes", "C2", "held-out, true images"), ("shuffled", "C3", "held-out, shuffled images")):
        s, v = series(rows, f"eval/{name}/reward_mean")
        if s:
            ax.plot(s, v, "o--", color=colour, label=label)
    ax.set(title="vlm_shapes: GRPO on the warm-started tiny VLM", xlabel="step (8 prompts x 8 samples)",
           ylabel="graded reward (1 exact, 0.5 one off)", ylim=(0, 1))
    ax.legend(fontsize=8)
    if greedy:
        bars = fig.add_subplot(1, 2, 2)
        labels = [f"{g['checkpoint']}\n"
                  f"{'shuffled' if g['shuffled_images'] else 'true'}" for g in greedy]
        values = [g["reward"] for g in greedy]
        bars.bar(range(len(values)), values, color=["C3" if g["shuffled_images"] else "C2" for g in greedy])
        for i, v in enumerate(values):
            bars.text(i, v + 0.02, f"{v:.2f}", ha="center", fontsize=8)
        bars.set_xticks(range(len(values)), labels, fontsize=7)
        bars.set(title="greedy, held-out rows (transformers)", ylabel="graded reward", ylim=(0, 1.1))
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
