"""What the Tinker server's calls do, on a started lean_rl Runtime (Megatron actor with LoRA, SGLang
engines serving the base with the adapter loaded apart, --lora-sync adapter).

Trainer calls (create_model, forward_backward, optim_step, save_weights_for_sampler) run one at a time,
in the order they arrived, on one worker thread: the event loop stays free for polls and heartbeats.
Sampling runs on the loop, concurrently, through the router.

Sampler weights: each save_weights_for_sampler bumps the version and syncs the adapter to the engines
(the sync's probe checks them against the trainer). A sampling session is bound to the version it was
made for; the engines hold one adapter, so a session of an older version is refused (a user error),
never served the newer weights. A session of the base model is served the base (no adapter).

One training client at a time: a second create_model while one is live is refused (docs/tinker.md)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from lean_rl.algorithms.tinker_losses import check_loss
from lean_rl.backends.megatron.tinker_rank import RankTinker
from lean_rl.backends.sglang.client import EngineClient
from lean_rl.runtime import Runtime
from lean_rl.tinker.batches import build_micro_batches, per_datum_logprobs
from lean_rl.tinker.futures import UserError
from lean_rl.tinker.sampling import sample
from lean_rl.tinker.wire import ForwardBackwardCall, encode_forward_backward_output

BASE = "base"
_ADAM_DEFAULTS = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0,
                  "grad_clip_norm": 0.0}


@dataclass
class _Model:
    model_id: str
    session_id: str
    version: int = 0  # of the sampler weights it last saved
    named: dict[str, int] = field(default_factory=dict)  # sampler_weights name -> version


class TinkerService:
    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        cfg = runtime.cfg
        if runtime.trainer is None or runtime.engines is None:
            raise RuntimeError("serve_tinker: the runtime started no trainer or no engines")
        self.base_model = cfg.engines.model_path
        self.lora_rank = cfg.train.lora.lora_rank
        self.rows = cfg.train.batch.micro_batch_size
        self.vocab_size = cfg.megatron.arch.vocab_size
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tinker-trainer")
        self._lock = threading.Lock()
        self.models: dict[str, _Model] = {}
        self.version = runtime.start_step  # what the engines' adapter is
        self.samplers: dict[str, int | str] = {}  # sampling session id -> version, or BASE
        self.policy = runtime.engines.router_client()  # names the run's adapter
        self.base = EngineClient(self.policy.base_url, timeout_s=self.policy.timeout_s, api_key=cfg.engines.api_key)
        runtime.trainer.attach(RankTinker)

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

    def on_trainer(self, fn, *args) -> asyncio.Future:
        """Run fn(*args) on the trainer's worker thread, after every call submitted before it."""
        return asyncio.wrap_future(self._worker.submit(fn, *args))

    # -- models -----------------------------------------------------------------------------------
    def check_base(self, base_model: str) -> None:
        if base_model != self.base_model and os.path.realpath(base_model) != os.path.realpath(self.base_model):
            raise UserError(f"base_model {base_model!r}: this server serves {self.base_model!r} only "
                            "(--hf-checkpoint)")

    def create_model(self, session_id: str, model_id: str, base_model: str, lora: dict | None) -> dict:
        self.check_base(base_model)
        if lora is None:
            raise UserError("create_model: full fine-tuning is not supported; create a LoRA training client")
        if int(lora.get("rank", 0)) != self.lora_rank:
            raise UserError(f"lora_config.rank {lora.get('rank')}: this server trains rank {self.lora_rank} "
                            "adapters (--lora-rank)")
        with self._lock:
            if self.models and model_id not in self.models:
                raise UserError(f"a training client ({next(iter(self.models))}) is live: this server trains one "
                                "LoRA training client at a time (docs/tinker.md)")
            self.models[model_id] = _Model(model_id, session_id)
        self.runtime.trainer.call_all(RankTinker.reset)
        return {"model_id": model_id}

    def model(self, model_id: str) -> _Model:
        found = self.models.get(model_id)
        if found is None:
            raise UserError(f"model_id {model_id!r}: no such training client on this server")
        return found

    def drop_session(self, session_id: str) -> None:
        with self._lock:
            for model_id in [m.model_id for m in self.models.values() if m.session_id == session_id]:
                del self.models[model_id]

    def info(self, model_id: str) -> dict:
        self.model(model_id)
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": self.lora_rank,
                "model_data": {"model_name": self.base_model, "tokenizer_id": self.base_model, "arch": "lean_rl"}}

    # -- training ---------------------------------------------------------------------------------
    def forward_backward(self, call: ForwardBackwardCall) -> bytes:
        self.model(call.model_id)
        names = set(call.data[0].inputs) - {"target_tokens"}
        try:
            check_loss(call.loss_fn, names if not call.forward_only else names | {"weights", "logprobs", "advantages"},
                       {} if call.forward_only else call.loss_config)
        except ValueError as err:
            raise UserError(str(err)) from None
        batches = build_micro_batches(call.data, self.rows, self.vocab_size)
        results = self.runtime.trainer.call_all(RankTinker.forward_backward, batches, call.loss_fn,
                                                call.loss_config, call.forward_only)
        logprobs, loss = next(r for r in results if r is not None)
        return encode_forward_backward_output(per_datum_logprobs(logprobs, call.data, self.rows),
                                              {"loss:sum": loss})

    def optim_step(self, model_id: str, adam: dict[str, Any] | None) -> dict:
        self.model(model_id)
        params = {**_ADAM_DEFAULTS, **{k: float(v) for k, v in (adam or {}).items() if k in _ADAM_DEFAULTS}}
        results = self.runtime.trainer.call_all(RankTinker.optim_step, params)
        metrics = next(r for r in results if r is not None)
        return {"metrics": {f"{k}:mean": v for k, v in metrics.items()}}

    def save_for_sampler(self, model_id: str, name: str | None, session_key: str | None) -> dict:
        """Sync the adapter to the engines as a new version; a named save becomes a tinker:// path, an
        unnamed one (save_weights_and_get_sampling_client) a sampling session."""
        model = self.model(model_id)
        version = self.version + 1
        self.runtime.sync_weights(version)  # with the probe: the engines now serve what the trainer holds
        self.version = model.version = version
        if name is not None:
            if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
                raise UserError(f"path {name!r}: a sampler weights name is letters, digits, '-', '_', '.'")
            model.named[name] = version
            return {"path": f"tinker://{model_id}/sampler_weights/{name}"}
        self.samplers[session_key or f"{model_id}:v{version}"] = version
        return {"sampling_session_id": session_key or f"{model_id}:v{version}"}

    # -- sampling ---------------------------------------------------------------------------------
    def open_sampler(self, session_key: str, base_model: str | None, model_path: str | None) -> str:
        if model_path:
            prefix, _, rest = model_path.partition("tinker://")
            model_id, _, name = rest.rpartition("/sampler_weights/")
            if prefix or not name or model_id not in self.models or name not in self.models[model_id].named:
                raise UserError(f"model_path {model_path!r}: no such sampler weights on this server")
            self.samplers[session_key] = self.models[model_id].named[name]
        else:
            self.check_base(base_model or "")
            self.samplers[session_key] = BASE
        return session_key

    def sampler_info(self, session_id: str) -> dict:
        if session_id not in self.samplers:
            raise UserError(f"sampling session {session_id!r}: unknown")
        return {"sampler_id": session_id, "base_model": self.base_model, "model_path": None}

    async def sample(self, session_id: str, request: dict) -> bytes:
        bound = self.samplers.get(session_id)
        if bound is None:
            raise UserError(f"sampling_session_id {session_id!r}: unknown (create a sampling client first)")
        if bound != BASE and bound != self.version:
            raise UserError(f"this sampling client holds sampler weights version {bound}; the engines serve "
                            f"version {self.version} now and keep one version (docs/tinker.md): create a new "
                            "sampling client")
        client = self.base if bound == BASE else self.policy
        return await sample(client, request, None if bound == BASE else str(bound))
