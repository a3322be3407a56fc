"""docs/flags.md is what tools/gen_flags_doc.py writes from the option declarations: a flag added,
renamed or re-documented in the code is in the reference in the same commit."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_flags_doc", REPO / "tools" / "gen_flags_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_flags_reference_is_the_generators_output():
    gen = _generator()
    assert gen.OUT.read_text() == gen.generated(), "docs/flags.md is out of date: run python tools/gen_flags_doc.py"


def test_the_reference_lists_every_declared_flag_with_its_help():
    from lean_rl.config import build_parser

    text = _generator().generated()
    flags = [s for a in build_parser()._actions for s in a.option_strings if s not in ("-h", "--help")]
    assert len(flags) > 200 and [f for f in flags if f"`{f}`" not in text] == []
    assert "- `--num-rollout` NUM_ROLLOUT (default `10`): rollout + train steps of the run" in text


def test_the_renderer_shows_choices_defaults_switches_and_lists():
    import argparse

    parser = argparse.ArgumentParser()
    group = parser.add_argument_group("g")
    group.add_argument("--mode", choices=["a", "b"], default="a", help="which (default %(default)s)")
    group.add_argument("--on", action="store_true", help="turn it on")
    group.add_argument("--paths", nargs="*", default=[], metavar="PATH")
    lines = _generator().render(parser).splitlines()
    assert lines[lines.index("## g") + 2:] == ["- `--mode` {a, b} (default `a`): which (default a)",
                                               "- `--on`: turn it on", "- `--paths` PATH ..."]
