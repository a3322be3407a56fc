"""`python -m lean_rl.plot RUN_DIR [--out PNG]`: the curves of a run, from RUN_DIR/metrics.jsonl, in one
PNG (default RUN_DIR/curves.png); run_loop.run writes it at the end of every run (write_run_curves).

A panel whose metrics the run never logged is left out. Matplotlib draws without a display (its Agg
canvas, no pyplot: no global state, so a run can call this from any thread)."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from lean_rl.utils.metrics import read_metrics

logger = logging.getLogger(__name__)

# Line panels: (title, ((metric, label), ...)). The mismatch and off-policy metrics get panels of
# their own: their scales (1e-5 log-prob differences, fractions, whole versions) would flatten each other.
LINE_PANELS = (
    ("KL", (("train/ppo_kl", "old vs current policy (ppo_kl)"), ("train/kl_loss", "vs reference (kl_loss)"))),
    ("train-inference mismatch", (("sync/probe_max_abs_diff", "weight-sync probe max |Δ log p|"),
                                  ("train/rollout_logprob_abs_diff", "trained tokens mean |Δ log p|"),
                                  ("train/mismatch_kl", "KL(rollout || train)"))),
    ("off-policy tokens", (("rollout/stale_token_frac", "stale token frac"), ("train/tis_clipfrac", "TIS clip frac"),
                           ("train/rs_masked_frac", "rejected (RS) frac"),
                           ("train/behav_dropped_frac", "behaviour-weight dropped frac"))),
    ("staleness (policy versions)", (("train/staleness_max", "max"), ("train/staleness_mean", "mean"))),
    ("response length (tokens)", (("rollout/response_len_mean", "mean"),)),
    ("turns per trajectory", (("rollout/turns_mean", "mean"), ("rollout/turns_max", "max"))),
    ("episodes that act (a tool call, a search)", (("rollout/multi_turn_fraction", "more than one model turn"),)),
    ("on-policy distillation", (("train/opd_reverse_kl", "KL(student || teacher), k1 on its samples"),)),
)
# time/* keys that are not a phase of the step: the total, idle times (overlap the phases), and the
# probe (timed inside time/sync).
NOT_PHASES = {"time/step", "time/trainer_idle", "time/engine_idle", "time/sync_probe"}


class NoMetricsError(Exception):
    """The run dir has no metrics.jsonl, or nothing in it to plot."""


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that have `key` (eval metrics exist only at eval steps)."""
    pairs = [(row["step"], row[key]) for row in rows if key in row]
    return [s for s, _ in pairs], [v for _, v in pairs]


def phase_keys(rows: list[dict]) -> list[str]:
    """The time/<phase> keys of the step-time breakdown, in the order the run first logged them."""
    return [k for k in dict.fromkeys(k for row in rows for k in row) if k.startswith("time/") and k not in NOT_PHASES]


def _reward(ax, rows: list[dict]) -> None:
    steps, mean = series(rows, "rollout/reward_mean")
    ax.plot(steps, mean, label="mean")
    band = [(row["step"], row["rollout/reward_mean"], row["rollout/reward_std"]) for row in rows
            if "rollout/reward_mean" in row and "rollout/reward_std" in row]
    if band:
        ax.fill_between([s for s, _, _ in band], [m - d for _, m, d in band], [m + d for _, m, d in band],
                        alpha=0.25, label="± std")


def _eval_reward(ax, rows: list[dict], keys: list[str]) -> None:
    for key in keys:
        ax.plot(*series(rows, key), marker="o", label=key.split("/")[1])


def _lines(ax, rows: list[dict], metrics: list[tuple[str, str]]) -> None:
    for key, label in metrics:
        ax.plot(*series(rows, key), label=label)


def _step_time(ax, rows: list[dict], phases: list[str]) -> None:
    """The phases stacked (a phase missing at a step took 0 s there); the step total over them: the gap is
    framework overhead."""
    steps = [row["step"] for row in rows]
    ax.stackplot(steps, *[[row.get(key, 0.0) for row in rows] for key in phases],
                 labels=[key.removeprefix("time/") for key in phases], alpha=0.8)
    if any("time/step" in row for row in rows):
        ax.plot(*series(rows, "time/step"), color="black", linewidth=1.2, label="step total")


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> list[str]:
    """Draw the curves of run_dir into `out` (default run_dir/curves.png); returns the titles of the
    panels drawn. NoMetricsError when there is no metrics.jsonl or nothing in it to plot."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise NoMetricsError(f"{path}: no such file (is {run_dir} the --output-dir of a run?)")
    rows = sorted(read_metrics(run_dir), key=lambda row: row["step"])  # a torn line is skipped
    if not rows:
        raise NoMetricsError(f"{path}: no rows (the run logged no step yet)")
    present = set().union(*rows)
    panels = []  # (title, draw(ax))
    if "rollout/reward_mean" in present:
        panels.append(("reward", lambda ax: _reward(ax, rows)))
    eval_keys = sorted(k for k in present if re.fullmatch(r"eval/[^/]+/reward_mean", k))  # not .../reward/<key>_mean
    if eval_keys:
        panels.append(("eval reward", lambda ax: _eval_reward(ax, rows, eval_keys)))
    for title, metrics in LINE_PANELS:
        drawn = [(key, label) for key, label in metrics if key in present]
        if drawn:
            panels.append((title, lambda ax, drawn=drawn: _lines(ax, rows, drawn)))
    phases = phase_keys(rows)
    if phases:
        panels.append(("step time (s)", lambda ax: _step_time(ax, rows, phases)))
    if not panels:
        raise NoMetricsError(f"{path}: none of the metrics this plots (reward, eval, KL, length, time/...)")

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    ncols = 1 if len(panels) == 1 else 2
    nrows = -(-len(panels) // ncols)
    fig = Figure(figsize=(7 * ncols, 3.4 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(nrows, ncols, squeeze=False).flat)
    for ax, (title, draw) in zip(axes, panels):
        draw(ax)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="best")
    for ax in axes[len(panels):]:  # the spare cell of an odd count: no empty axes
        fig.delaxes(ax)
    fig.suptitle(f"{'/'.join(Path(run_dir).resolve().parts[-2:])}: {len(rows)} steps (last {rows[-1]['step']})")
    out = Path(out) if out is not None else Path(run_dir) / "curves.png"
    fig.savefig(out, dpi=100)
    return [title for title, _ in panels]


def write_run_curves(run_dir: str | Path) -> None:
    """run_dir/curves.png at the end of a run; a failure is a warning, never the run's failure."""
    try:
        plot_run(run_dir)
        logger.info("curves: %s", Path(run_dir) / "curves.png")
    except Exception as err:  # noqa: BLE001 - plotting is a convenience; the run's result stands
        logger.warning("could not write %s: %s", Path(run_dir) / "curves.png", err)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lean_rl.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run's --output-dir (holds metrics.jsonl)")
    parser.add_argument("--out", metavar="PNG", help="where to write the PNG (default RUN_DIR/curves.png)")
    args = parser.parse_args(argv)
    try:
        titles = plot_run(args.run_dir, args.out)
    except NoMetricsError as err:
        print(f"lean_rl.plot: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"{args.out or Path(args.run_dir) / 'curves.png'}: {', '.join(titles)}")


if __name__ == "__main__":
    main()
