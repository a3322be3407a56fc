"""A custom rollout written for slime (its API as slime's docs and multi-agent example use it), run by
lean_rl with this file unchanged: tests/e2e/test_slime_compat_run.py. Nothing here imports lean_rl.

generate_rollout takes its prompt groups from slime's data source and fans each sample out to two
agents: a solver answers the prompt, a reviewer continues the solver's answer; both are trained. The
solver's reward is set here; the reviewer's is left unset, for the run's --custom-rm-path. The
advantage function and the TIS function use slime's trainer-side contracts."""

import copy

import torch

from slime.rollout.base_types import RolloutFnTrainOutput
from slime.rollout.sglang_rollout import GenerateState, generate
from slime.utils.async_utils import run
from slime.utils.types import Sample

REVIEWER_OFFSET = 1_000_000  # the reviewer's sample index: the solver's plus this
REVIEW_PROMPT = "\nAgain:"


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    assert not evaluation, "this rollout function does not evaluate"
    return run(generate_rollout_async(args, rollout_id, data_source))


async def generate_rollout_async(args, rollout_id, data_source):
    state = GenerateState(args)
    groups = data_source.get_samples(args.rollout_batch_size)
    params = dict(state.sampling_params, max_new_tokens=args.agent_tokens)
    done = []
    for group in groups:
        agents = []
        for sample in group:
            solver = await generate(args, sample, params)
            solver.reward = solver_reward(state, solver)
            reviewer = Sample(index=solver.index + REVIEWER_OFFSET, group_index=solver.group_index,
                              prompt=solver.prompt + solver.response + REVIEW_PROMPT, label=solver.label,
                              metadata=copy.deepcopy(solver.metadata))
            reviewer.tokens = state.tokenizer(reviewer.prompt, add_special_tokens=False)["input_ids"]
            reviewer = await generate(args, reviewer, params)
            agents += [solver, reviewer]  # the reviewer's reward: the run's reward function
        done.append(agents)
    return RolloutFnTrainOutput(samples=done, metrics={"multi_agent/agents_per_sample": 2.0})


def solver_reward(state, sample: Sample) -> float:
    """The fraction of the answer's tokens of the kind the label asks for (the toy task)."""
    ids = sample.tokens[len(sample.tokens) - sample.response_length:]
    texts = [state.tokenizer.decode([t]).strip() for t in ids if t not in state.tokenizer.all_special_ids]
    wanted = str.isdigit if sample.label == "digits" else str.isalpha
    return sum(bool(t) and wanted(t) for t in texts) / len(texts) if texts else 0.0


def advantages(args, rollout_data):
    """Reward minus the rollout's mean reward, on every response token (a REINFORCE baseline)."""
    rewards = torch.tensor(rollout_data["rewards"], dtype=torch.float32)
    centred = rewards - rewards.mean()
    rollout_data["advantages"] = [torch.full((n,), float(a)) * mask
                                  for a, n, mask in zip(centred, rollout_data["response_lengths"],
                                                        rollout_data["loss_masks"])]
    rollout_data["returns"] = [a.clone() for a in rollout_data["advantages"]]


def tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
    """Token-level truncated importance sampling, as slime's vanilla TIS."""
    ratio = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs))
    weights = ratio.clamp(min=args.tis_clip_low, max=args.tis_clip)
    return pg_loss * weights, loss_masks, {"slime_tis_ratio": ratio.detach()}
