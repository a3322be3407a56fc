"""A Tinker-compatible training service on lean_rl (docs/tinker.md):

    TINKER_API_KEY=tml-... python -m lean_rl.serve_tinker --hf-checkpoint DIR --port 8000 --lora-rank 8 [lean_rl flags]

The unmodified `tinker` SDK (0.38) then trains LoRA adapters of DIR against it: ServiceClient(base_url=
"http://127.0.0.1:8000"), create_lora_training_client(base_model=DIR, rank=8). lean_rl's own flags set
the layout and engines as for a training run (no --prompt-data: the client sends the data). The trainer
runs at DP 1 (TP / PP as flagged); the engines serve the base with the adapter loaded apart (--lora-rank
> 0, --lora-sync adapter). The server binds loopback unless --host names this node's address."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import tempfile
from dataclasses import dataclass

from lean_rl.cli import run_command
from lean_rl.config import parse_config
from lean_rl.options import ConfigError, add_options, option, read_options
from lean_rl.runtime import Runtime
from lean_rl.utils.metrics import setup_logging

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TinkerServerOptions:
    """The flags of `python -m lean_rl.serve_tinker` beside a run's own."""

    port: int | None = option(None, metavar="N", help="serve_tinker: the port the Tinker API listens on (required)")
    host: str = option("127.0.0.1", help="serve_tinker: the address to bind (loopback, or this node's own address)")
    future_deadline: float = option(1800.0, help="serve_tinker: seconds a training or sampling call may take "
                                                 "before its future fails")
    max_sampler_adapters: int = option(8, help="serve_tinker: sampler weights (adapters) each engine holds at "
                                               "once; the oldest is unloaded first")
    state_dir: str | None = option(None, metavar="DIR", help="serve_tinker: where save_state writes training "
                                                               "clients' states (default: a new temporary directory)")


def _server_flags(argv: list[str]) -> tuple[TinkerServerOptions, int, list[str]]:
    parser = argparse.ArgumentParser(prog="lean_rl.serve_tinker", add_help=False, allow_abbrev=False)
    own, rest = add_options(parser, TinkerServerOptions).parse_known_args(argv)
    flags = read_options(TinkerServerOptions, own)
    if flags.port is None:
        raise ConfigError("--port N is required (the port the Tinker API listens on)")
    return flags, flags.port, rest


def main(argv: list[str]) -> None:
    setup_logging()
    flags, port, rest = _server_flags(argv)
    api_key = os.environ.get("TINKER_API_KEY", "")
    if not api_key.startswith("tml-"):
        raise ConfigError("TINKER_API_KEY: set it to the key clients will send (it must start with 'tml-')")
    if flags.host == "0.0.0.0":
        raise ConfigError("--host 0.0.0.0: bind loopback or this node's own address")
    cfg = parse_config(rest, serving=True)
    if not cfg.train.lora.enabled or cfg.engines.adapter is None:
        raise ConfigError("lean_rl.serve_tinker trains LoRA training clients: pass --lora-rank N (and keep "
                          "--lora-sync adapter / auto)")
    if flags.max_sampler_adapters < 1:
        raise ConfigError(f"--max-sampler-adapters must be >= 1, got {flags.max_sampler_adapters}")
    # one more place on the engines: the run's own adapter, which the start-up sync loads and probes
    adapter = dataclasses.replace(cfg.engines.adapter, max_loaded=flags.max_sampler_adapters + 1)
    cfg = dataclasses.replace(cfg, engines=dataclasses.replace(cfg.engines, adapter=adapter))
    if cfg.run.colocate:
        raise ConfigError("--colocate: the Tinker client interleaves training and sampling; serve with the "
                          "engines apart from the trainer")
    import uvicorn

    from lean_rl.tinker.server import create_app
    from lean_rl.tinker.service import TinkerService

    runtime = Runtime(cfg).start()
    try:
        if runtime.trainer is None or runtime.trainer.data_parallel_size != 1:
            raise ConfigError("lean_rl.serve_tinker runs the trainer at data parallel size 1: give as many "
                              "trainer ranks as TP x PP")
        state_root = flags.state_dir or tempfile.mkdtemp(prefix="lean_rl_tinker_state_")
        service = TinkerService(runtime, state_root)
        app = create_app(service, api_key, deadline_s=flags.future_deadline)
        logger.info("Tinker server on http://%s:%d (base_model %s, LoRA rank %d, save_state into %s)", flags.host,
                    port, service.base_model, service.lora_rank, service.state_root)
        uvicorn.run(app, host=flags.host, port=port, log_level="warning")
        service.close()
    finally:
        runtime.close()


if __name__ == "__main__":  # the guard matters: Megatron's checkpointing spawns processes that re-import __main__
    sys.exit(run_command("lean_rl.serve_tinker", main, sys.argv[1:]))
