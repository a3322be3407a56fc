"""Blocking environment and agent code (rollout/blocking.py, utils/threads.py DaemonThreadPool): a
bounded pool of daemon threads of its own. Hung environment calls, as the multi-turn generate makes
them, take no thread from the loop's default executor (a train step, a weight sync and a save run
there), and do not hold the process at exit. The environment is a real user module; its reset hangs."""

import asyncio
import concurrent.futures
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from lean_rl.config import parse_config
from lean_rl.rollout.multi_turn import generate
from lean_rl.sample import Sample, Status
from lean_rl.utils.threads import DaemonThreadPool

REPO = Path(__file__).resolve().parents[2]

HUNG_ENV = '''
import threading
RELEASE = threading.Event()  # the in-process test lets its hung threads go at its end

class HungEnv:
    def reset(self, sample):  # a plain def: run on the pool of threads for blocking code
        RELEASE.wait()

    def step(self, action):
        return "", 0.0, True

def make_env(cfg, sample):
    return HungEnv()
'''


@pytest.fixture
def hung_env_flags(tiny_qwen2, tmp_path, monkeypatch):
    (tmp_path / "hung_env.py").write_text(HUNG_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "label": "x"}) + "\n")
    return ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--output-dir", str(tmp_path / "out"),
            "--environment-path", "hung_env.make_env", "--environment-timeout", "1"]


def test_the_pool_runs_at_most_size_calls_at_once_on_reused_threads():
    pool = DaemonThreadPool(2, "test")
    running, peak, lock = [0], [0], threading.Lock()

    def work(x):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        return x * 2

    async def main():
        assert await asyncio.gather(*(pool.run(work, i) for i in range(6))) == [0, 2, 4, 6, 8, 10]
        assert await pool.run(work, 7) == 14
        with pytest.raises(ZeroDivisionError):
            await pool.run(lambda: 1 / 0)

    asyncio.run(main())
    assert peak[0] == 2 and pool.threads == 2


def test_six_hung_environment_calls_delay_no_train_step_or_sync(hung_env_flags):
    import hung_env

    cfg = parse_config(hung_env_flags)

    def train_step():  # what the loops run with asyncio.to_thread: a train step, then a weight sync
        return "trained"

    async def main():
        # the smallest default executor a loop can have: one hung call on it would stall everything
        asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(1))
        samples = [Sample(i, i, "hi", [1, 2, 3]) for i in range(6)]
        rollouts = [asyncio.create_task(generate(cfg, s, {"max_new_tokens": 8})) for s in samples]
        await asyncio.sleep(0.3)  # every reset has started and hangs
        started = time.monotonic()
        assert await asyncio.to_thread(train_step) == "trained"
        assert await asyncio.to_thread(train_step) == "trained"
        took = time.monotonic() - started
        done = await asyncio.gather(*rollouts)
        return took, done

    try:
        took, done = asyncio.run(main())
    finally:
        hung_env.RELEASE.set()
    assert took < 0.5, f"{took:.2f} s"
    assert [s.status for s in done] == [Status.FAILED] * 6
    assert all("environment reset took longer than --environment-timeout 1 s" in s.metadata["environment_error"]
               for s in done)


def test_a_process_whose_environment_call_hangs_exits_promptly(hung_env_flags, tmp_path):
    code = textwrap.dedent(f"""
        import asyncio, time
        from lean_rl.config import parse_config
        from lean_rl.rollout.multi_turn import generate
        from lean_rl.sample import Sample
        cfg = parse_config({hung_env_flags!r})
        sample = asyncio.run(generate(cfg, Sample(0, 0, "hi", [1, 2, 3]), {{"max_new_tokens": 8}}))
        print(sample.status.value, time.time(), flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    exited = time.time()
    assert out.returncode == 0 and out.stdout.split()[0] == "failed", out.stderr[-3000:]
    # from the rollout's end to the process's: the reset never returns (asyncio.to_thread's executor
    # would be joined forever at exit)
    took = exited - float(out.stdout.split()[1])
    assert took < 60, f"{took:.1f} s"  # a hang never exits (300 s timeout); 60: slack for a loaded machine
