"""Engine/trainer log-prob parity: the check that the whole stack computes the same policy.

    python -m lean_rl.parity --hf-checkpoint DIR [--layouts tp1 tp2 pp2] [--num-prompts 16]

SGLang serves the checkpoint and samples responses (returning a log-prob per sampled token); Megatron
loads the same checkpoint at each parallel layout and scores the same tokens; transformers (float32)
scores them as a third opinion. RL's importance ratios are only as good as this agreement, so the
script fails (exit 1) when SGLang and Megatron differ by more than --max-tol (max |Δ|) or --mean-tol.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from lean_rl.cli import DEBUG_HELP, ArgumentParser, run_command
from lean_rl.preflight import check_model_dir
from lean_rl.backends.sglang.client import EngineClient

LAYOUTS = {  # name -> (tensor, pipeline, expert) parallel sizes
    "tp1": (1, 1, 1),
    "tp2": (2, 1, 1),
    "pp2": (1, 2, 1),
    "ep2": (1, 1, 2),
    "tp2pp2": (2, 2, 1),
}


@dataclass(frozen=True)
class SampledSequence:
    prompt_ids: list[int]
    output_ids: list[int]
    engine_log_probs: list[float]  # SGLang's log-prob of each output token

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids


@dataclass(frozen=True)
class Diff:
    max_abs: float
    mean_abs: float
    num_tokens: int


def diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> Diff:
    delta = torch.cat([(x.double() - y.double()).abs().flatten() for x, y in zip(a, b, strict=True)])
    return Diff(float(delta.max()), float(delta.mean()), int(delta.numel()))


def random_prompts(num: int, vocab_size: int, seed: int, special_ids: set[int]) -> list[list[int]]:
    rng = random.Random(seed)
    ordinary = [t for t in range(vocab_size) if t not in special_ids]
    return [[rng.choice(ordinary) for _ in range(rng.randint(4, 16))] for _ in range(num)]


async def sample_with_engine(client: EngineClient, prompts: list[list[int]], max_new_tokens: int,
                             seed: int) -> list[SampledSequence]:
    """Temperature-1 samples with their log-probs, all requests in flight at once."""
    params = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}

    async def one(i: int, prompt: list[int]) -> SampledSequence:
        result = await client.generate(prompt, params, return_logprob=True)
        return SampledSequence(prompt, result.output_ids, result.output_log_probs)

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def transformers_log_probs(checkpoint: str | Path, sequences: list[SampledSequence]) -> list[torch.Tensor]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for seq in sequences:
            log_softmax = torch.log_softmax(model(torch.tensor([seq.tokens])).logits[0].float(), dim=-1)
            start = len(seq.prompt_ids)
            positions = torch.arange(start - 1, len(seq.tokens) - 1)
            out.append(log_softmax[positions, torch.tensor(seq.output_ids)])
    return out


def megatron_log_probs(checkpoint: str | Path, layout: str, sequences: list[SampledSequence]) -> tuple[list[torch.Tensor], float]:
    """Scores at one layout; returns (log-probs, seconds to start the group and load the weights)."""
    from lean_rl.backends.megatron.config import ParallelConfig
    from lean_rl.backends.megatron.group import MegatronGroup

    tp, pp, ep = LAYOUTS[layout]
    parallel = ParallelConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                              expert_model_parallel_size=ep, sequence_parallel=tp > 1 and ep > 1)
    started = time.monotonic()
    with MegatronGroup.from_hf_checkpoint(checkpoint, parallel) as group:
        start_s = time.monotonic() - started
        out = group.compute_log_probs([s.tokens for s in sequences], [len(s.prompt_ids) for s in sequences])
    return out.log_probs, start_s


def run(args: argparse.Namespace) -> dict:
    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.testing.sglang_engines import engine_config_for_tests
    from lean_rl.utils.ray_utils import init_ray

    checkpoint = Path(args.hf_checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    report: dict = {"checkpoint": str(checkpoint), "layouts": {}}
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="lean_rl_parity_"))
    # Ray before the engine group: its engine is a Ray actor, the Megatron ranks after it too
    init_ray(num_cpus=max(2, max(LAYOUTS[name][0] * LAYOUTS[name][1] * LAYOUTS[name][2] for name in args.layouts)))
    with EngineGroup(engine_config_for_tests(checkpoint, "--rollout-num-engines", "1"), run_dir / "engines") as engines:
        report["engine_start_s"] = engines.timings["total"]
        special = {config.get("bos_token_id"), config.get("eos_token_id"), config.get("pad_token_id")}
        prompts = random_prompts(args.num_prompts, config["vocab_size"], args.seed, special)
        client = EngineClient(engines.router_url, timeout_s=300, api_key=engines.config.api_key,
                              adapter=engines.config.adapter_name)
        sequences = asyncio.run(sample_with_engine(client, prompts, args.max_new_tokens, args.seed))
    engine_lp = [torch.tensor(s.engine_log_probs) for s in sequences]
    hf_lp = transformers_log_probs(checkpoint, sequences)
    report["num_tokens"] = sum(len(s.output_ids) for s in sequences)
    report["sglang_vs_transformers"] = asdict(diff(engine_lp, hf_lp))
    for layout in args.layouts:
        mg_lp, start_s = megatron_log_probs(checkpoint, layout, sequences)
        report["layouts"][layout] = {
            "sglang_vs_megatron": asdict(diff(engine_lp, mg_lp)),
            "megatron_vs_transformers": asdict(diff(mg_lp, hf_lp)),
            "megatron_start_s": start_s,
        }
    report["passed"] = all(
        r["sglang_vs_megatron"]["max_abs"] <= args.max_tol and r["sglang_vs_megatron"]["mean_abs"] <= args.mean_tol
        for r in report["layouts"].values()
    )
    return report


def print_report(report: dict, max_tol: float, mean_tol: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"log-prob parity on {report['num_tokens']} sampled tokens ({report['checkpoint']})")
    for column in ("layout", "SGLang vs Megatron max|Δ|", "mean|Δ|", "Megatron vs transformers max|Δ|", "start s"):
        table.add_column(column, justify="right")
    for layout, r in report["layouts"].items():
        sm, mt = r["sglang_vs_megatron"], r["megatron_vs_transformers"]
        table.add_row(layout, f"{sm['max_abs']:.2e}", f"{sm['mean_abs']:.2e}", f"{mt['max_abs']:.2e}", f"{r['megatron_start_s']:.1f}")
    console = Console()
    console.print(table)
    st = report["sglang_vs_transformers"]
    console.print(f"SGLang vs transformers: max|Δ| {st['max_abs']:.2e}, mean|Δ| {st['mean_abs']:.2e}; "
                  f"SGLang engine + router start: {report['engine_start_s']:.1f} s")
    verdict = "[green]PASS[/green]" if report["passed"] else "[red]FAIL[/red]"
    console.print(f"{verdict} (tolerance: max {max_tol:g}, mean {mean_tol:g})")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m lean_rl.parity", description=__doc__.split("\n")[0], epilog=DEBUG_HELP)
    parser.add_argument("--hf-checkpoint", required=True, help="HF checkpoint directory (float32 recommended)")
    parser.add_argument("--layouts", nargs="+", default=["tp1", "tp2", "pp2"], choices=sorted(LAYOUTS))
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tol", type=float, default=1e-4)
    parser.add_argument("--mean-tol", type=float, default=1e-5)
    parser.add_argument("--run-dir", default=None, help="where engine logs go (default: a temporary directory)")
    parser.add_argument("--json", default=None, help="also write the report here")
    args = parser.parse_args(argv)
    check_model_dir(args.hf_checkpoint, "--hf-checkpoint")  # config, tokenizer, weights: a ConfigError
    report = run(args)
    print_report(report, args.max_tol, args.mean_tol)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(run_command("lean_rl.parity", main, sys.argv[1:]))  # a user error: one line, exit 2
