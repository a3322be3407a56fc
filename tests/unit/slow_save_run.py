"""A run whose checkpoint save takes --save-seconds (test_stop_during_save.py drives it in a subprocess).

Everything but the trainer is lean_rl's own: run_loop.run (signal watcher, save off the event loop,
close, exit status) and a loop that saves at every step boundary as train.py does. The trainer is a
stand-in whose save_checkpoint sleeps, so the save's length is known exactly; the test is about the
loop around a save, not about Megatron's checkpoint writer (tested in
tests/integration/test_megatron_checkpoint.py).

Writes, one line at a time: `saving STEP` / `saved STEP` around each save, and `tick` every 0.1 s from a task on
the event loop, so the test sees whether the loop ran while a save was being written.
"""

import asyncio
import sys
import time
from pathlib import Path

from lean_rl.config import parse_config
from lean_rl.run_loop import run
from lean_rl.runtime import Runtime


def say(line: str) -> None:
    """One line in one write: print() writes the text and the newline apart, so lines printed by the
    loop and by the saving thread at once could run into each other."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class SlowSavingTrainer:
    def __init__(self, seconds: float):
        self.seconds = seconds

    def save_checkpoint(self, root: str, step: int, extra_state: dict) -> None:
        say(f"saving {step}")
        time.sleep(self.seconds)
        Path(root).mkdir(parents=True, exist_ok=True)
        (Path(root) / f"step_{step}").write_text("done")
        say(f"saved {step}")

    def shutdown(self) -> None:
        pass


class SlowSaveRuntime(Runtime):
    save_seconds = 0.0

    def start(self) -> "SlowSaveRuntime":
        self.trainers.actor = SlowSavingTrainer(self.save_seconds)
        return self


async def saving_loop(rt: Runtime) -> None:
    async def tick():
        while True:
            say("tick")
            await asyncio.sleep(0.1)

    ticker = asyncio.create_task(tick())
    try:
        for step in range(rt.start_step, rt.cfg.run.num_rollout):
            await asyncio.sleep(0.2)  # the step's work
            await rt.maybe_save(step + 1)
            rt.stop.check(step + 1)
    finally:
        ticker.cancel()


if __name__ == "__main__":
    SlowSaveRuntime.save_seconds = float(sys.argv[1])
    run(parse_config(sys.argv[2:]), saving_loop, SlowSaveRuntime)
