"""The option builder (lean_rl/options.py) and the rule it exists for: each flag of a run is declared
once, on the config field that holds it."""

from __future__ import annotations

import argparse
import ast
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lean_rl.options import ConfigError, add_options, flag_of, group, option, options_of, read_options


@dataclass(frozen=True)
class _Inner:
    temperature: float = option(1.0, flag="--inner-temperature", at_least=0)
    stop: tuple[str, ...] = option(())


@dataclass(frozen=True)
class _Outer:
    count: int = option(3, positive=True, help="how many")
    name: str | None = option(None, choices=("a", "b"))
    verbose: bool = option(False)
    tensorboard: bool = option(True, flag="--no-tensorboard")
    pairs: tuple[tuple[str, str], ...] = option((), nargs=2, action="append", metavar=("K", "V"))
    label: str | None = option("x", convert=lambda v: v or None)
    inner: _Inner = group(_Inner, "inner things")
    derived: int = field(default=0)


def _parse(argv: list[str]) -> _Outer:
    parser = add_options(argparse.ArgumentParser(), _Outer, "outer")
    return read_options(_Outer, parser.parse_args(argv), derived=7)


def test_defaults_types_switches_and_groups():
    cfg = _parse([])
    assert cfg == _Outer(derived=7)
    cfg = _parse(["--count", "5", "--name", "b", "--verbose", "--no-tensorboard", "--pairs", "k", "v",
                  "--label", "", "--inner-temperature", "0.5", "--stop", "x", "y"])
    assert (cfg.count, cfg.name, cfg.verbose, cfg.tensorboard) == (5, "b", True, False)
    assert cfg.pairs == (("k", "v"),) and cfg.label is None and cfg.derived == 7
    assert cfg.inner == _Inner(temperature=0.5, stop=("x", "y"))


def test_ranges_and_choices_name_the_flag():
    with pytest.raises(ConfigError, match="--count must be > 0, got 0"):
        _parse(["--count", "0"])
    with pytest.raises(ConfigError, match="--inner-temperature must be >= 0, got -1"):
        _parse(["--inner-temperature", "-1"])
    with pytest.raises(SystemExit):
        _parse(["--name", "c"])


def test_help_groups_and_flag_lookup():
    parser = add_options(argparse.ArgumentParser(), _Outer, "outer")
    titles = [g.title for g in parser._action_groups]
    assert "outer" in titles and "inner things" in titles
    assert flag_of(_Outer, "tensorboard") == "--no-tensorboard" and flag_of(_Outer, "count") == "--count"


def test_a_flag_declared_twice_is_an_error():
    @dataclass(frozen=True)
    class Twice:
        count: int = option(1)

    parser = add_options(argparse.ArgumentParser(), _Outer)
    with pytest.raises(argparse.ArgumentError):
        add_options(parser, Twice)


def _config_classes(cls, seen=None) -> list[type]:
    seen = [] if seen is None else seen
    if cls not in seen:
        seen.append(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(f.type if isinstance(f.type, type) else None):
                _config_classes(f.type, seen)
        for _, meta, _ in options_of(cls):
            if meta["kind"] == "group":
                _config_classes(meta["cls"], seen)
    return seen


def test_every_run_flag_comes_from_exactly_one_option_field():
    from lean_rl.config import build_parser

    parser = build_parser()
    flags = [s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")]
    assert len(flags) == len(set(flags))
    import lean_rl.config as config_module

    roots = [config_module.RunConfig, config_module.EngineConfig, config_module.DataConfig,
             config_module.RolloutConfig, config_module.RewardConfig, config_module.EvalConfig,
             config_module.ModelFlags, config_module.ParallelConfig, config_module.PrecisionFlags,
             config_module.TrainConfig,
             config_module.AlgorithmConfig, config_module.WeightSyncConfig, config_module.DistillationConfig,
             config_module.RewardServingConfig]
    declared = []
    for root in roots:
        for cls in _config_classes(root):
            declared += [flag_of(cls, f.name) for f, meta, _ in options_of(cls) if meta["kind"] == "option"]
    assert sorted(declared) == sorted(flags)


def test_no_add_argument_in_the_run_config_modules():
    """The run's flags are added by options.add_options only (standalone tools keep their own parsers)."""
    root = Path(__file__).resolve().parents[2] / "lean_rl"
    standalone = {"options.py", "parity.py", "plot.py", "convert/cli.py", "testing/tiny_model.py", "testing/toy_task.py",
                  "testing/gpu_smoke.py", "testing/gpu_smoke_trainer.py",
                  "slime_namespace.py"}  # slime's parser, rebuilt from its table for the `args` of slime functions
    offenders = []
    for path in root.rglob("*.py"):
        if str(path.relative_to(root)) in standalone:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("add_argument", "add_argument_group"):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, offenders
