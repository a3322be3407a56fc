"""Frozen configs are never assigned after construction: a value that depends on other flags is
computed by the class's derive step (`derive_fields`, run by options.build / read_options), and
`__post_init__` only checks (issue 24, section 5)."""

import ast
from pathlib import Path

import pytest

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.backends.megatron.lora_config import LoraConfig
from lean_rl.options import build, rebuild

PACKAGE = Path(__file__).resolve().parents[2] / "lean_rl"


def _frozen(cls: ast.ClassDef) -> bool:
    return any(isinstance(d, ast.Call) and any(k.arg == "frozen" and getattr(k.value, "value", False) for k in d.keywords)
               for d in cls.decorator_list)


def assignments_in_post_init(source: str) -> list[int]:
    """Line numbers where the `__post_init__` of a frozen dataclass assigns: `object.__setattr__(...)`
    or `self.x = ...` (a mutable dataclass, e.g. a client, may normalise its own fields)."""
    found = []
    for cls in ast.walk(ast.parse(source)):
        if not (isinstance(cls, ast.ClassDef) and _frozen(cls)):
            continue
        node = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__post_init__"), None)
        if node is None:
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and \
                    inner.func.attr == "__setattr__":
                found.append(inner.lineno)
            targets = inner.targets if isinstance(inner, ast.Assign) else \
                [inner.target] if isinstance(inner, (ast.AugAssign, ast.AnnAssign)) else []
            found += [t.lineno for t in targets
                      if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"]
    return found


def test_no_post_init_in_lean_rl_assigns():
    offenders = {str(path.relative_to(PACKAGE.parent)): lines for path in sorted(PACKAGE.rglob("*.py"))
                 if (lines := assignments_in_post_init(path.read_text()))}
    assert offenders == {}, f"derive these in the class's derive_fields instead: {offenders}"


def test_the_checker_finds_both_kinds_of_assignment():
    source = '''
@dataclass(frozen=True)
class A:
    def __post_init__(self):
        object.__setattr__(self, "x", 1)
        self.y = 2
    def other(self):
        self.z = 3
@dataclass
class Mutable:
    def __post_init__(self):
        self.w = 4
'''
    assert sorted(assignments_in_post_init(source)) == [5, 6]


def test_build_derives_and_rebuild_derives_again():
    algo = build(AlgorithmConfig, advantage_estimator="gspo", eps_clip=0.3, max_response_len=16)
    assert (algo.policy_loss, algo.eps_clip_high, algo.loss_norm_length, algo.aggregation) == \
        ("gspo", 0.3, 16, "seq-mean-token-mean")
    lora = build(LoraConfig, lora_rank=4, lora_target_modules=("linear_qkv,linear_proj", "linear_fc1"))
    assert lora.lora_target_modules == ("linear_qkv", "linear_proj", "linear_fc1")
    again = rebuild(algo, loss_agg_mode="token-mean")
    assert again.aggregation == "token-mean" and again.policy_loss == "gspo"


def test_a_config_built_without_its_derive_step_is_refused_by_its_checks():
    with pytest.raises(Exception, match="--loss-type"):
        AlgorithmConfig()
