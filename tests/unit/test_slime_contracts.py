"""slime's contracts served by lean_rl beyond the rollout's hooks: a slime data source class as
--data-source-path (slime.rollout.data_source), and the trainer-side advantage and TIS contracts
(lean_rl/algorithms/slime_contracts.py) on lean_rl's [B, T] tensors. Pure logic: no engine, no trainer
(tests/e2e/test_slime_compat_run.py runs them in a real run)."""

import json
import sys
import types

import pytest
import torch

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.hooks import AdvantageInputs, compute_custom_or_builtin_advantages
from lean_rl.algorithms.losses import policy_loss
from lean_rl.algorithms.slime_contracts import custom_tis, per_sample, slime_advantages, trained_lengths
from lean_rl.buffer.data_buffer import create_data_buffer
from lean_rl.config import parse_config
from lean_rl.extensions import load_extensions
from lean_rl.options import build
from lean_rl.slime_compat.run_state import bind_run
from lean_rl.utils.slime_finder import install_slime_finder

install_slime_finder()  # what a run does before it loads its hooks

SLIME_SOURCE = '''
from slime.rollout.data_source import RolloutDataSourceWithBuffer

class DigitsFirst(RolloutDataSourceWithBuffer):
    """A curriculum: the first epoch only the prompts labelled "digits", then all (slime's way: a subclass)."""
    def get_samples(self, num_samples):
        groups = []
        while len(groups) < num_samples:
            group = super().get_samples(1)[0]
            if group[0].label == "digits" or self.epoch_id > 0:
                groups.append(group)
        return groups
'''


@pytest.fixture
def slime_source_cfg(tiny_qwen2, tmp_path, monkeypatch):
    data = tmp_path / "p.jsonl"
    rows = [{"prompt": f"say {kind} {i}", "label": kind} for i, kind in enumerate(["letters", "digits"] * 3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    module = types.ModuleType("slime_style_source")
    monkeypatch.setitem(sys.modules, "slime_style_source", module)

    def make(*extra):
        cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--output-dir",
                            str(tmp_path / "out"), "--n-samples-per-prompt", "2", *extra])
        bind_run(cfg)
        exec(SLIME_SOURCE, module.__dict__)
        return cfg
    return make


def test_a_slime_data_source_subclass_feeds_the_buffer_and_resumes(slime_source_cfg, tmp_path):
    cfg = slime_source_cfg("--data-source-path", "slime_style_source.DigitsFirst", "--save", str(tmp_path / "ckpt"))
    extensions = load_extensions(cfg)
    buffer = create_data_buffer(cfg, extensions.data_source)
    groups = buffer.get_prompt_groups(3)
    assert [g[0].label for g in groups] == ["digits"] * 3  # the subclass's order
    assert [len(g) for g in groups] == [2, 2, 2] and groups[0][0].prompt == "say digits 1"
    assert groups[0][0].tokens[-1] != groups[1][0].tokens[-1]  # tokenized as slime's reader hands the text over
    state = json.loads(json.dumps(buffer.state_dict()))  # saved with a checkpoint

    # a resume: the slime source's own state (its save / load under --save / --load), then the next prompt
    resumed = slime_source_cfg("--data-source-path", "slime_style_source.DigitsFirst", "--load", str(tmp_path / "ckpt"))
    again = create_data_buffer(resumed, load_extensions(resumed).data_source)
    again.load_state_dict(state)
    after = again.get_prompt_groups(4)
    assert [g[0].prompt for g in after][-1] == "say letters 0"  # the first not handed out before the save
    assert [g[0].prompt for g in after][:3] == [g[0].prompt for g in groups]  # in flight at the save: again first


def _inputs(lengths=(3, 2)):
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    return AdvantageInputs(rewards=torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0, 0]), mask=mask,
                           valid=torch.tensor([True, True]), rollout_log_probs=torch.full((2, 3), -1.0),
                           response_lengths=torch.tensor(lengths), total_lengths=torch.tensor([7, 6]))


def test_slime_advantages_see_per_sample_lists_and_fill_both_outputs():
    seen = {}

    def adv(args, rollout_data):
        seen.update(rollout_data, gamma=args.gamma)
        rollout_data["advantages"] = [torch.full((n,), r) for r, n in zip(rollout_data["rewards"],
                                                                          rollout_data["response_lengths"])]
        rollout_data["returns"] = [a * 2 for a in rollout_data["advantages"]]

    algo = build(AlgorithmConfig, gamma=0.9)
    advantages, returns = slime_advantages(adv, algo, _inputs(), "--custom-advantage-function-path x")
    assert seen["response_lengths"] == [3, 2] and seen["total_lengths"] == [7, 6] and seen["gamma"] == 0.9
    assert [m.tolist() for m in seen["loss_masks"]] == [[1.0, 0.0, 1.0], [1.0, 1.0]]
    assert [k.tolist() for k in seen["kl"]] == [[0.0] * 3, [0.0] * 2]  # no KL in the reward: zeros, as slime's
    assert advantages.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]] and returns[0, 0] == 2.0


def test_a_slime_advantage_function_that_sets_nothing_is_named():
    def lazy(args, rollout_data):
        return None

    with pytest.raises(Exception, match="rollout_data\\['advantages'\\]"):
        slime_advantages(lazy, build(AlgorithmConfig), _inputs(), "--custom-advantage-function-path x")


def test_a_slime_style_module_is_called_with_slimes_contract(monkeypatch):
    module = types.ModuleType("slime_style_adv")
    exec("import slime.utils.types\nimport torch\n"
         "def adv(args, data):\n"
         "    data['advantages'] = [torch.ones(n) for n in data['response_lengths']]\n"
         "    data['returns'] = list(data['advantages'])\n", module.__dict__)
    monkeypatch.setitem(sys.modules, "slime_style_adv", module)
    algo = build(AlgorithmConfig, custom_advantage_function_path="slime_style_adv.adv")
    advantages, _ = compute_custom_or_builtin_advantages(algo, _inputs())
    assert advantages.tolist() == [[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]  # masked where nothing is trained


def test_trained_lengths_and_cuts():
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    assert trained_lengths(mask) == [3, 0, 2]
    assert [p.tolist() for p in per_sample(mask, [3, 0, 2])] == [[1.0, 0.0, 1.0], [], [1.0, 1.0]]


def vanilla_tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
    ratio = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs))
    weights = ratio.clamp(min=args.tis_clip_low, max=args.tis_clip)
    return pg_loss * weights, loss_masks, {"tis_ratio": ratio}


def drop_second_sample(args, *, pg_loss, loss_masks, **kwargs):
    return pg_loss, [loss_masks[0], loss_masks[1] * 0], {}


def test_a_slime_tis_function_weights_the_loss_as_the_built_in_token_tis(monkeypatch):
    module = types.ModuleType("slime_style_tis")
    module.vanilla_tis, module.drop_second_sample = vanilla_tis, drop_second_sample
    monkeypatch.setitem(sys.modules, "slime_style_tis", module)
    torch.manual_seed(0)
    log_probs = torch.randn(2, 4, requires_grad=True)
    old = log_probs.detach() + 0.3 * torch.randn(2, 4)
    rollout = old + 0.5 * torch.randn(2, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 1.0]])
    inputs = dict(log_probs=log_probs, advantages=torch.randn(2, 4), mask=mask, weights=mask / mask.sum(),
                  metric_weights=mask / mask.sum(), old_log_probs=old, rollout_log_probs=rollout)
    built_in = policy_loss(build(AlgorithmConfig, use_tis=True, tis_clip=1.5, tis_clip_low=0.5), **inputs)
    custom = policy_loss(build(AlgorithmConfig, use_tis=True, tis_clip=1.5, tis_clip_low=0.5,
                               custom_tis_function_path="slime_style_tis.vanilla_tis"), **inputs)
    assert torch.allclose(built_in[0], custom[0])
    assert "tis_ratio" in custom[1]

    pg = torch.ones(2, 4)
    _, kept, _ = custom_tis(build(AlgorithmConfig, use_tis=True,
                                  custom_tis_function_path="slime_style_tis.drop_second_sample"), pg, old, rollout, mask)
    assert kept.tolist() == [[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]


def test_custom_tis_needs_use_tis():
    with pytest.raises(Exception, match="--custom-tis-function-path .* needs --use-tis"):
        build(AlgorithmConfig, custom_tis_function_path="x.y")


SLIME_LOSS = '''
import torch
from slime.backends.megatron_utils.loss import get_log_probs_and_entropy
from slime.utils.ppo_utils import compute_approx_kl, compute_policy_loss

def ppo_loss(args, batch, logits, sum_of_sample_mean):
    out = get_log_probs_and_entropy(logits, args=args, unconcat_tokens=batch["unconcat_tokens"],
                                    total_lengths=batch["total_lengths"], response_lengths=batch["response_lengths"],
                                    with_entropy=True)
    log_probs = torch.cat(out["log_probs"])
    ppo_kl = torch.cat(batch["log_probs"]) - log_probs
    pg, clipfrac = compute_policy_loss(ppo_kl, torch.cat(batch["advantages"]), args.eps_clip, args.eps_clip_high)
    kl = compute_approx_kl(log_probs, torch.cat(batch["ref_log_probs"]), args.kl_loss_type)
    loss = sum_of_sample_mean(pg) + args.kl_loss_coef * sum_of_sample_mean(kl)
    return loss, {"pg_loss": sum_of_sample_mean(pg), "pg_clipfrac": sum_of_sample_mean(clipfrac),
                  "entropy": sum_of_sample_mean(torch.cat(out["entropy"]))}
'''


def test_a_slime_ppo_loss_gives_the_built_in_loss_and_gradient(monkeypatch):
    from lean_rl.algorithms.hooks import loss_function

    module = types.ModuleType("slime_style_ppo")
    exec(SLIME_LOSS, module.__dict__)
    monkeypatch.setitem(sys.modules, "slime_style_ppo", module)
    torch.manual_seed(1)
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    weights = mask / mask.sum()

    def run(algo):
        log_probs = torch.randn(2, 4, generator=torch.Generator().manual_seed(2)).requires_grad_()
        inputs = dict(advantages=torch.tensor([[1.0] * 4, [-0.5] * 4]), mask=mask, weights=weights,
                      metric_weights=weights, old_log_probs=log_probs.detach() + 0.4 * torch.randn(2, 4),
                      ref_log_probs=log_probs.detach() - 0.2, entropy=torch.rand(2, 4))
        loss, metrics = loss_function(algo)(algo, log_probs=log_probs, **inputs)
        loss.backward()
        return loss, metrics, log_probs.grad

    built_in = run(build(AlgorithmConfig, eps_clip=0.2, kl_loss_coef=0.1, kl_loss_type="k3"))
    torch.manual_seed(1)
    slime = run(build(AlgorithmConfig, eps_clip=0.2, kl_loss_coef=0.1, kl_loss_type="k3",
                      custom_loss_function_path="slime_style_ppo.ppo_loss"))
    assert torch.allclose(built_in[0], slime[0]) and torch.allclose(built_in[2], slime[2])
    for name in ("pg_loss", "pg_clipfrac", "entropy"):
        assert torch.allclose(built_in[1][name], slime[1][name]), name


def test_slimes_reader_without_prompt_data_hands_out_blank_groups(slime_source_cfg):
    """slime's RolloutDataSource without --prompt-data: blank samples (a rollout function makes its own
    prompts), numbered as slime numbers them."""
    from lean_rl.slime_compat.args import build_args
    from lean_rl.slime_compat.data_source import RolloutDataSource

    args = build_args(slime_source_cfg())
    args.prompt_data = None
    source = RolloutDataSource(args)
    groups = source.get_samples(2)
    assert len(source) == 0 and (source.epoch_id, source.sample_offset) == (0, 0)
    assert [[(s.group_index, s.index, s.prompt) for s in g] for g in groups] == [[(0, 0, ""), (0, 1, "")],
                                                                                 [(1, 2, ""), (1, 3, "")]]
