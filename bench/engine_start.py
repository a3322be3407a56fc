"""CPU engine start: seconds from launching a SGLang server on CPU to its first answer, with its
scheduler and detokenizer forked (lean_rl's CPU launch, backends/sglang/compat.start_children_by_fork)
vs spawned (SGLang's own start method, which imports torch and SGLang again in each child), as a ratio.

    .venv/bin/python bench/engine_start.py [--rounds 3] [--preset tiny]

Both sides are the same launcher (python -m lean_rl.backends.sglang.launch's code) on the same
checkpoint; the spawned side undoes the fork patch before SGLang starts. Rounds alternate the two, so
drift of a shared machine hits both; medians are compared.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVE = "--serve"  # internal: `bench/engine_start.py --serve fork|spawn <SGLang server flags>`

if SERVE in sys.argv:
    # The server side. Spawned children re-import this file as __mp_main__ with the parent's argv: the
    # launcher's import applies the CPU patches (it reads --device cpu from argv) in them too.
    _set_start_method = multiprocessing.set_start_method
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import lean_rl.backends.sglang.launch as launch  # noqa: E402 - the patches must precede SGLang's import

    if __name__ == "__main__":
        mode = sys.argv[sys.argv.index(SERVE) + 1]
        if mode == "spawn":
            multiprocessing.set_start_method = _set_start_method  # SGLang's own: engine.py's "spawn" stays
        launch.main(sys.argv[sys.argv.index(SERVE) + 2:])
        sys.exit(0)

import httpx  # noqa: E402
from bench_common import NO_GOAL, at_least, bench_parser, command_line, parse_bench_args, row, run_bench, write_rows  # noqa: E402

QUICK = {"rounds": 1}
READY_TIMEOUT_S = 300


def time_to_first_answer(mode: str, model: Path, log: Path) -> float:
    """Launch, then POST /generate until it answers; the server's whole process group is ended after."""
    from lean_rl.utils.net import find_free_port

    port = find_free_port("127.0.0.1")
    cmd = [sys.executable, __file__, SERVE, mode, "--model-path", str(model), "--host", "127.0.0.1", "--port",
           str(port), "--device", "cpu", "--dtype", "float32", "--attention-backend", "torch_native",
           "--max-total-tokens", "8192"]
    started = time.perf_counter()
    with open(log, "w") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = started + READY_TIMEOUT_S
        body = {"text": "hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the {mode} server exited with {server.returncode}; its log: {log}")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"the {mode} server did not answer within {READY_TIMEOUT_S} s; its log: {log}")
            try:
                if httpx.post(f"http://127.0.0.1:{port}/generate", json=body, timeout=5.0).status_code == 200:
                    return time.perf_counter() - started
            except httpx.TransportError:
                pass
            time.sleep(0.25)
    finally:
        os.killpg(server.pid, signal.SIGKILL)  # the group this run started: the server and its children
        server.wait()


def main(argv: list[str]) -> int:
    parser = bench_parser("engine_start", __doc__, QUICK)
    parser.add_argument("--rounds", type=at_least(1), default=3, help="launches of each kind (median compared)")
    parser.add_argument("--preset", default="tiny", choices=("tiny", "small", "base100m"),
                        help="size of the randomly initialised Qwen2 the servers load")
    args = parse_bench_args(parser, argv)
    from lean_rl.testing.tiny_model import make_tiny_model

    workdir = Path(tempfile.mkdtemp(prefix="lean_rl_bench_engine_start_"))
    model = make_tiny_model(workdir / "model", arch="qwen2", preset=args.preset, seed=0)
    seconds: dict[str, list[float]] = {"fork": [], "spawn": []}
    for i in range(args.rounds):
        for mode in ("fork", "spawn") if i % 2 == 0 else ("spawn", "fork"):
            seconds[mode].append(time_to_first_answer(mode, model, workdir / f"{mode}-{i}.log"))
            print(f"round {i}: {mode} {seconds[mode][-1]:.1f} s", flush=True)
    fork, spawn = statistics.median(seconds["fork"]), statistics.median(seconds["spawn"])
    print(f"\nlaunch to first answer, median of {args.rounds}: fork {fork:.1f} s, spawn {spawn:.1f} s, "
          f"ratio {fork / spawn:.2f}")
    write_rows(args.json, [row(f"CPU SGLang server, launch to first answer, children forked / spawned "
                               f"(qwen2 {args.preset}, median of {args.rounds})", f"{fork:.1f} s",
                               f"{spawn:.1f} s spawned", fork / spawn, NO_GOAL, command_line("engine_start", argv))])
    return 0


if __name__ == "__main__":
    run_bench("engine_start", main)
