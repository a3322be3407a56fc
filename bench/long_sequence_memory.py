"""Peak memory of the logits side of one training micro-batch, full float32 logits vs --logits-chunk-size:

    python bench/long_sequence_memory.py [--tokens 8192] [--vocab 49152] [--hidden 576] [--chunk 1024]
                                         [--limit-gib 16] [--probe-gib 6]

What is measured: the trainer's own code from the last hidden states on, as a micro-batch of `--tokens`
tokens goes through it: forward_only.log_probs_from_output (the log-probs and the entropy with its
gradient), losses.policy_loss (PPO with entropy and low_var_kl terms), and the backward into the
hidden states and the [vocab x hidden] output weight (SmolLM2-135M's shapes by default). The trunk
(attention, MLPs) is left out: it is the same in both modes, and only the logits path changes.

How: each measurement runs in a fresh process (multiprocessing spawn). The process builds its inputs,
resets the kernel's resident-set high-water mark (/proc/self/clear_refs: 5), runs the step, and reports
VmHWM minus the RSS just before the step: the bytes the step itself needed at its peak. No tracemalloc
(torch's allocations do not go through Python's allocator).

The longest micro-batch whose logits path fits in --limit-gib: from --tokens, the token count is doubled
in fresh processes while the measured peak stays under --probe-gib (what this machine can spare) and the
count under --max-probe-tokens; the
peak is then extrapolated linearly to --limit-gib from the last two measurements (memory of this path is
affine in the token count: a fixed part, the weight, its gradient and one chunk's logits, plus so many
bytes per token)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time

from bench_common import NO_GOAL, at_least, bench_parser, command_line, parse_bench_args, row, run_bench, write_rows
from lean_rl.options import build

GIB = 1024 ** 3
QUICK = {"tokens": 2048, "vocab": 8192, "probe_gib": 1}


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(chunk: int, tokens: int, vocab: int, hidden: int) -> dict:
    """In a fresh process: peak bytes of one micro-batch's logits path (chunk 0: the full logits)."""
    import tempfile

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    from lean_rl.algorithms.config import AlgorithmConfig
    from lean_rl.algorithms.losses import aggregation_weights, policy_loss
    from lean_rl.backends.megatron.compat import apply_compat
    from lean_rl.backends.megatron.compat_cpu import megatron_thread_mode
    from lean_rl.backends.megatron.forward_only import StepContext, log_probs_from_output

    torch.set_num_threads(1)
    device = torch.device("cpu")
    apply_compat(device)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), 1), rank=0, world_size=1)
        try:
            with megatron_thread_mode(device):
                parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
                algo = build(AlgorithmConfig, entropy_coef=0.01, kl_loss_coef=0.01, kl_loss_type="low_var_kl")
                ctx = StepContext(role="actor", algorithm=algo, vocab_size=vocab, temperature=1.0, device=device,
                                  logits_chunk_size=chunk)
                generator = torch.Generator().manual_seed(0)
                weight = (torch.randn(vocab, hidden, generator=generator) * 0.02).requires_grad_()
                hidden_states = torch.randn(1, tokens, hidden, generator=generator).requires_grad_()
                targets = torch.randint(0, vocab, (1, tokens), generator=generator)
                mask = torch.ones(1, tokens)
                advantages = torch.randn(1, tokens, generator=generator)
                old = -torch.rand(1, tokens, generator=generator) * 5
                weights = aggregation_weights(mask, algo.aggregation)
                before = _rss_bytes("VmRSS")
                with open("/proc/self/clear_refs", "w") as clear:
                    clear.write("5")  # VmHWM := VmRSS
                start = time.perf_counter()
                if chunk:
                    log_probs, entropy = log_probs_from_output(hidden_states, targets, ctx, True, weight)
                else:
                    log_probs, entropy = log_probs_from_output(hidden_states @ weight.t(), targets, ctx, True)
                loss, _ = policy_loss(algo, log_probs=log_probs, advantages=advantages, mask=mask, weights=weights,
                                      metric_weights=weights, old_log_probs=old, ref_log_probs=old,
                                      entropy=entropy)
                loss.backward()
                seconds = time.perf_counter() - start
                peak = _rss_bytes("VmHWM")
                return {"step_bytes": peak - before, "seconds": seconds, "loss": float(loss),
                        "weight_grad_norm": float(weight.grad.norm())}
        finally:
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()


def in_fresh_process(chunk: int, tokens: int, vocab: int, hidden: int) -> dict:
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(measure, chunk, tokens, vocab, hidden).result()


def longest_within(chunk: int, args, first: dict) -> tuple[int, list[tuple[int, int]]]:
    """(estimated longest token count within --limit-gib, the (tokens, bytes) measured on the way)."""
    points = [(args.tokens, first["step_bytes"])]
    while points[-1][1] * 2 < args.probe_gib * GIB and points[-1][0] * 2 <= args.max_probe_tokens:
        tokens = points[-1][0] * 2
        points.append((tokens, in_fresh_process(chunk, tokens, args.vocab, args.hidden)["step_bytes"]))
        print(f"  chunk {chunk}: {tokens} tokens -> {points[-1][1] / GIB:.2f} GiB", flush=True)
    if len(points) < 2:  # one point only: memory proportional to tokens
        return int(args.limit_gib * GIB / points[0][1] * points[0][0]), points
    (t0, b0), (t1, b1) = points[-2], points[-1]
    per_token = (b1 - b0) / (t1 - t0)
    fixed = b1 - per_token * t1
    return int((args.limit_gib * GIB - fixed) / per_token), points


def main(argv: list[str]) -> int:
    parser = bench_parser("long_sequence_memory", __doc__, QUICK)
    parser.add_argument("--tokens", type=at_least(1), default=8192, help="tokens in the micro-batch")
    parser.add_argument("--vocab", type=at_least(2), default=49152, help="vocabulary (SmolLM2: 49152)")
    parser.add_argument("--hidden", type=at_least(1), default=576, help="hidden size (SmolLM2-135M: 576)")
    parser.add_argument("--chunk", type=at_least(1), default=1024, help="--logits-chunk-size of the chunked row")
    parser.add_argument("--limit-gib", type=float, default=16.0, help="memory for the longest-sequence estimate")
    parser.add_argument("--max-probe-tokens", type=at_least(1), default=65536, help=(
        "stop doubling past this many tokens even below --probe-gib (the chunked path grows so slowly that "
        "doubling to --probe-gib would take hours on CPU)"))
    parser.add_argument("--probe-gib", type=float, default=6.0,
                        help="largest peak actually run while doubling (what this machine can spare)")
    args = parse_bench_args(parser, argv)
    command = command_line("long_sequence_memory", argv)
    results = {}
    for chunk in (0, args.chunk):
        results[chunk] = in_fresh_process(chunk, args.tokens, args.vocab, args.hidden)
        print(f"chunk {chunk or 'off':>5}: {args.tokens} tokens x {args.vocab} vocab: peak "
              f"{results[chunk]['step_bytes'] / GIB:.2f} GiB, {results[chunk]['seconds']:.1f} s, "
              f"loss {results[chunk]['loss']:.6f}, |grad W| {results[chunk]['weight_grad_norm']:.6f}", flush=True)
    full, chunked = results[0], results[args.chunk]
    ratio = full["step_bytes"] / chunked["step_bytes"]
    longest = {chunk: longest_within(chunk, args, results[chunk])[0] for chunk in (0, args.chunk)}
    print(f"\n{'':28s}{'full logits':>14s}{'chunk ' + str(args.chunk):>14s}{'ratio':>8s}")
    print(f"{'peak GiB, ' + str(args.tokens) + ' tokens':28s}{full['step_bytes'] / GIB:14.2f}"
          f"{chunked['step_bytes'] / GIB:14.2f}{ratio:8.1f}")
    print(f"{'seconds':28s}{full['seconds']:14.1f}{chunked['seconds']:14.1f}"
          f"{full['seconds'] / chunked['seconds']:8.2f}")
    print(f"{'longest within ' + str(args.limit_gib) + ' GiB':28s}{longest[0]:14d}{longest[args.chunk]:14d}"
          f"{longest[args.chunk] / longest[0]:8.1f}")
    shape = f"{args.tokens} tokens × {args.vocab} vocab, hidden {args.hidden}"
    rows = [row(f"logits path of one training micro-batch ({shape}): peak memory, full float32 logits / "
                f"--logits-chunk-size {args.chunk}", f"{chunked['step_bytes'] / GIB:.2f} GiB chunked",
                f"{full['step_bytes'] / GIB:.2f} GiB full logits", ratio, NO_GOAL, command),
            row(f"longest micro-batch whose logits path fits {args.limit_gib:g} GiB (doubling from {args.tokens} "
                f"up to {args.probe_gib:g} GiB measured, then linear), chunked / full",
                f"{longest[args.chunk]} tokens chunked", f"{longest[0]} tokens full logits",
                longest[args.chunk] / longest[0], NO_GOAL, command)]
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    run_bench("long_sequence_memory", main)
