"""The curves of run_recipes.py's runs: sl_basic's train and test NLL per token, rl_basic's mean reward,
per step, from each run's metrics.jsonl; one PNG and the same numbers as markdown tables.

    python examples/tinker_cookbook/plot.py --log-dir /tmp/cookbook --out examples/tinker_cookbook/results
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = {"sl_basic": ("train_mean_nll", "test/nll"), "rl_basic": ("env/all/reward/total",)}


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
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    tables = []
    for ax, (recipe, keys) in zip(axes, SERIES.items()):
        series = read(args.log_dir / recipe / "metrics.jsonl", keys)
        for key, points in series.items():
            ax.plot([s for s, _ in points], [v for _, v in points], marker="o", markersize=3, label=key)
        ax.set_title(f"tinker-cookbook {recipe} on lean_rl.serve_tinker")
        ax.set_xlabel("step")
        ax.legend()
        ax.grid(alpha=0.3)
        tables.append(f"{recipe}\n\n{table(series)}\n")
    axes[0].set_ylabel("NLL per token (nats)")
    axes[1].set_ylabel("mean reward")
    figure.tight_layout()
    figure.savefig(args.out / "curves.png", dpi=100)
    (args.out / "curves.md").write_text("\n".join(tables))
    print("\n".join(tables))


if __name__ == "__main__":
    main()
