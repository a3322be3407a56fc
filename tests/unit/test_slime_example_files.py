"""slime's own example files that need no engine, run unchanged through lean_rl's contracts (the files
are vendored from THUDM/slime at 624b824 under tests/e2e/slime_examples/, Apache-2.0): the
train_infer_mismatch_helper's `compute_mis_weights_with_cp` as --custom-tis-function-path with its
mis.yaml as --custom-config-path (it imports slime.backends.megatron_utils.cp_utils, which lean_rl
serves at its one context-parallel rank). Pure logic: the trainer-side contract on [B, T] tensors."""

import math
import sys

import torch

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.slime_contracts import custom_tis
from lean_rl.options import build
from lean_rl.utils.custom_config import load_custom_config
from lean_rl.utils.slime_finder import install_slime_finder

install_slime_finder()

SLIME_ROOT = __import__("pathlib").Path(__file__).parents[1] / "e2e" / "slime_examples" / "slime_root"
MIS = "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"


def test_slimes_mis_example_weights_and_rejects_as_its_yaml_says(monkeypatch):
    monkeypatch.syspath_prepend(str(SLIME_ROOT))
    for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
        monkeypatch.delitem(sys.modules, name)  # lean_rl's own examples/ is a namespace package of that name
    custom = load_custom_config(str(SLIME_ROOT / "examples" / "train_infer_mismatch_helper" / "mis.yaml"))
    assert (custom["tis_mode"], custom["tis_upper_bound"], custom["rs_veto_threshold"]) == ("truncate", 2.0, 1e-4)
    algo = build(AlgorithmConfig, use_tis=True, custom_tis_function_path=MIS, custom=custom)
    # train / rollout probability ratios per token; the mask's 0s are padding (or tool tokens)
    ratios = torch.tensor([[1.0, 1.5, 3.0, 1.0], [0.3, 1.0, 1.2, 1.0], [1.0, 1e-5, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    rollout = torch.full((3, 4), -1.0)
    old = rollout + ratios.log()
    pg = torch.full((3, 4), 2.0)

    weighted, kept, metrics = custom_tis(algo, pg, old, rollout, mask)

    # truncate at tis_upper_bound 2.0, then tis_batch_normalize: divided by their mean over the trained tokens
    truncated = ratios.clamp(max=2.0)
    mean = (truncated * mask).sum() / mask.sum()
    on = mask.bool()
    assert torch.allclose(weighted[on], (pg * truncated / mean)[on])
    # rejection at token level outside [tis_lower_bound 0.5, 2.0]; a token under rs_veto_threshold 1e-4
    # drops its whole sequence
    assert kept.tolist() == [[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]
    assert all(name.startswith("mis_") and value.shape == (3, 4) for name, value in metrics.items())
    assert math.isclose(metrics["mis_batch_norm_factor"][0, 0].item(), mean.item(), rel_tol=1e-6)
