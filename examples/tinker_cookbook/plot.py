"""The curves of run_recipes.py's runs, per step, from each run's metrics.jsonl (LOG/<recipe>/metrics.jsonl,
or LOG/<recipe>_metrics.jsonl as results/ keeps them): sl_basic's train and test NLL per token; rl_basic's,
rl_basic_kl's (with its KL to the base) and rl_loop's mean reward; DPO's loss, accuracy and margin. One
PNG and the same numbers as markdown tables; a recipe without a metrics file is left out.

    python examples/tinker_cookbook/plot.py --log-dir /tmp/cookbook --out examples/tinker_cookbook/results
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (recipe, metric keys, y label) per panel
PANELS = [("sl_basic", ("train_mean_nll", "test/nll"), "NLL per token (nats)"),
          ("rl_basic", ("env/all/reward/total",), "mean reward"),
          ("rl_basic_kl", ("env/all/reward/total", "kl_policy_base"), "mean reward / KL to the base (nats)"),
          ("rl_loop", ("reward/total",), "mean reward"),
          ("dpo", ("dpo_loss", "accuracy"), "DPO loss / pair accuracy"),
          ("dpo", ("margin", "chosen_reward", "rejected_reward"), "implicit reward (beta x log-ratio)")]


def metrics_file(log_dir: Path, recipe: str) -> Path | None:
    for path in (log_dir / recipe / "metrics.jsonl", log_dir / f"{recipe}_metrics.jsonl"):
        if path.exists():
            return path
    return None


def read(path: Path, keys: tuple[str, ...]) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list[tuple[int, float]]] = {k: [] for k in keys}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        for key in keys:
            if row.get(key) is not None:
                found[key].append((int(row["step"]), float(row[key])))
    return found


def table(series: dict[str, list[tuple[int, float]]]) -> str:
    steps = sorted({s for points in series.values() for s, _ in points})
    lines = ["| step | " + " | ".join(str(s) for s in steps) + " |", "|---" * (len(steps) + 1) + "|"]
    for key, points in series.items():
        at = dict(points)
        lines.append(f"| {key} | " + " | ".join(f"{at[s]:.2f}" if s in at else "" for s in steps) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    panels = [(recipe, keys, label, path) for recipe, keys, label in PANELS
              if (path := metrics_file(args.log_dir, recipe)) is not None]
    if not panels:
        parser.error(f"--log-dir {args.log_dir}: no metrics.jsonl of {sorted({p[0] for p in PANELS})}")
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    tables = []
    for ax, (recipe, keys, label, path) in zip(axes.flat, panels):
        series = read(path, keys)
        for key, points in series.items():
            ax.plot([s for s, _ in points], [v for _, v in points], marker="o", markersize=3, label=key)
        ax.set_title(f"tinker-cookbook {recipe} on lean_rl.serve_tinker", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        tables.append(f"{recipe}\n\n{table(series)}\n")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    figure.tight_layout()
    figure.savefig(args.out / "curves.png", dpi=100)
    (args.out / "curves.md").write_text("\n".join(tables))
    print("\n".join(tables))


if __name__ == "__main__":
    main()
