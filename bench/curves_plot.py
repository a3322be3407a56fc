"""The PNG of bench/curves.py: one panel per curve, ours (solid) beside its floor (dashed)."""

from __future__ import annotations

from pathlib import Path


def plot_curves(curves: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    panels = [name for name in ("size", "engines", "convert", "rollout", "nodes") if curves.get(name)]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, name in zip(axes[0], panels):
        points = curves[name]
        if name == "size":
            mb = [p[1] for p in points]
            ax.loglog(mb, [p[2] for p in points], "o-", label="ours (distributed)")
            ax.loglog(mb, [p[3] for p in points], "s--", label="raw TCP floor")
            for p in points:
                ax.annotate(p[0], (p[1], p[2]), fontsize=7)
            ax.set(title="weight sync vs model size, 1 engine", xlabel="MB synced", ylabel="s per sync")
        elif name == "engines":
            n = [p[0] for p in points]
            ax.plot(n, [p[1] for p in points], "o-", label="ours (distributed)")
            ax.plot(n, [p[2] for p in points], "s--", label="raw TCP floor")
            ax.set(title="weight sync vs engines", xlabel="engines", ylabel="s per sync", xticks=n)
        elif name == "convert":
            mb = [p[1] for p in points]
            for column, floor, label in ((2, 3, "hf->megatron"), (4, 5, "megatron->hf")):
                line = ax.loglog(mb, [p[column] for p in points], "o-", label=label)[0]
                ax.loglog(mb, [p[floor] for p in points], "s--", color=line.get_color(), label=f"{label} floor")
            ax.set(title="conversion vs size", xlabel="MB of weights", ylabel="s")
        elif name == "rollout":
            c = [p[0] for p in points]
            ax.semilogx(c, [p[1] for p in points], "o-", label="ours")
            ax.semilogx(c, [p[2] for p in points], "s--", label="bare /generate")
            ax.set(title="rollout vs concurrency (2 engines)", xlabel="concurrent requests", ylabel="tok/s")
        else:
            n = [p[0] for p in points]
            for column, label in ((1, "step"), (2, "train"), (3, "sync"), (4, "generate")):
                ax.plot(n, [p[column] for p in points], "o-", label=label)
            ax.set(title="step time vs simulated nodes", xlabel="Ray nodes", ylabel="s (median)", xticks=n)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
