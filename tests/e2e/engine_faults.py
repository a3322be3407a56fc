"""Faults injected from inside a run, at a chosen moment: a reward function (--custom-rm-path
engine_faults.toy_reward_killing_an_engine, with tests/e2e on PYTHONPATH) that scores like the toy
task's and, at its Nth call, kills -9 the SGLang server of one engine, found by the port it listens on.
Test code only: the moment comes from the environment (LEAN_RL_TEST_KILL_AT="N[,N...]", the engine
index from LEAN_RL_TEST_KILL_ENGINE, default 1)."""

from __future__ import annotations

import os
import signal
import sys
import urllib.parse

import psutil

from lean_rl.testing.toy_task import kind_fraction_reward

KILL_AT = {int(n) for n in os.environ.get("LEAN_RL_TEST_KILL_AT", "").split(",") if n}
KILL_ENGINE = int(os.environ.get("LEAN_RL_TEST_KILL_ENGINE", "1"))
_calls = 0


async def toy_reward_killing_an_engine(cfg, sample) -> float:
    global _calls
    _calls += 1
    if _calls in KILL_AT:
        kill_engine_server(cfg.engines.engine_urls[KILL_ENGINE])
    return await kind_fraction_reward(cfg, sample)


def kill_engine_server(url: str) -> None:
    port = urllib.parse.urlsplit(url).port
    pids = {c.pid for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    print(f"engine_faults: call {_calls}: killed {url} (pids {sorted(pids)})", file=sys.stderr, flush=True)
