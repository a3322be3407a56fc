"""--save-debug-rollout-data / --load-debug-rollout-data files: the groups a run trained on, one JSON
list of samples (Sample.to_dict) per line, read back with every error naming the file, the line and
the field."""

from __future__ import annotations

import json
from pathlib import Path

from lean_rl.rollout.base import RolloutOutput
from lean_rl.rollout.metrics import rollout_metrics
from lean_rl.sample import Sample

FLAG = "--load-debug-rollout-data"


def load_debug_rollout(template: str, step: int) -> list[list[Sample]]:
    """The groups saved for rollout `step` (`template` with {rollout_id} filled in)."""
    try:
        path = Path(template.format(rollout_id=step))
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"{FLAG} {template!r}: cannot fill in the file name ({err!r}); the only field is "
                         "{rollout_id}") from None
    if not path.is_file():
        raise FileNotFoundError(f"{FLAG}: {path} does not exist (rollout {step})")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{FLAG}: {path}: not UTF-8 text ({err})") from None
    groups = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{FLAG}: {path}:{number}"
        try:
            group = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: invalid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(group, list) or not group:
            raise ValueError(f"{where}: expected a non-empty JSON list of samples (one group), got "
                             f"{type(group).__name__ if group != [] else 'an empty list'}")
        try:
            groups.append([Sample.from_dict(d) for d in group])
        except (ValueError, TypeError) as err:
            raise ValueError(f"{where}: {err}") from None
    if not groups:
        raise ValueError(f"{FLAG}: {path} holds no groups (rollout {step})")
    return groups


def replayed_rollout(template: str, step: int) -> RolloutOutput:
    """--load-debug-rollout-data: the metrics of the saved rollout `step` (its groups are what that
    step trains on: load_debug_rollout)."""
    return RolloutOutput(metrics=rollout_metrics(load_debug_rollout(template, step)))


def record_train_groups(run, step: int, groups: list[list[Sample]]) -> list[list[Sample]]:
    """What the run records of the groups step `step` trains on: --save-debug-rollout-data (the file
    load_debug_rollout reads back) and --dump-samples-interval (utils/metrics.dump_samples). `run` is
    the run's RunConfig."""
    from lean_rl.utils.metrics import dump_samples

    if run.save_debug_rollout_data:
        path = Path(run.save_debug_rollout_data.format(rollout_id=step))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps([s.to_dict() for s in g]) + "\n" for g in groups))
    if run.dump_samples_interval and step % run.dump_samples_interval == 0:
        dump_samples(Path(run.output_dir), step, groups)
    return groups
