"""What the Tinker server's calls do, on a started lean_rl Runtime (Megatron actor with LoRA, SGLang
engines serving the base with the adapter loaded apart, --lora-sync adapter).

Trainer calls (create_model, forward_backward, optim_step, save_weights_for_sampler) run one at a time,
in the order they arrived, on one worker thread: the event loop stays free for polls and heartbeats.
Sampling runs on the loop, concurrently, through the router.

Several training clients at once: each is a LoRA adapter of the one base, trained on the actor in
turn with its own optimizer state (backends/megatron/adapter_slots.py). Sampler weights: each
save_weights_for_sampler loads that client's adapter on every engine under a name of its own
(`a<client>v<version>`), beside the base and the other adapters, and a sampling session is bound to
that name: it keeps sampling its snapshot exactly while its trainer goes on. The engines hold
--max-sampler-adapters of them; the oldest is unloaded first, after which its sessions are refused (a
user error). A session of the base model is served the base (no adapter)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lean_rl.algorithms.tinker_losses import check_loss
from lean_rl.backends.megatron.tinker_rank import RankTinker
from lean_rl.backends.sglang.client import EngineClient
from lean_rl.weight_sync.transports.adapter import adapter_payload
from lean_rl.runtime import Runtime
from lean_rl.tinker.batches import build_micro_batches, per_datum_logprobs
from lean_rl.tinker.checkpoints import StateMeta, check_meta, parse_path, state_dir, tinker_path, write_meta
from lean_rl.tinker.futures import UserError
from lean_rl.tinker.sampling import sample
from lean_rl.tinker.snapshots import SnapshotSlots
from lean_rl.tinker.wire import ForwardBackwardCall, encode_forward_backward_output

if TYPE_CHECKING:
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.sglang.lora import ServedAdapter

BASE = "base"
SESSION_TIMEOUT_S = 120.0  # the client beats every 10 s: a session silent this long has gone
_ADAM_DEFAULTS = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0,
                  "grad_clip_norm": 0.0}


@dataclass
class _Model:
    model_id: str
    session_id: str
    index: int  # names its adapters on the engines
    version: int = 0  # of the sampler weights it last saved
    named: dict[str, str] = field(default_factory=dict)  # sampler_weights name -> engine adapter name


class TinkerService:
    def __init__(self, runtime: Runtime, state_root: str | os.PathLike):
        self.runtime = runtime
        self.state_root = Path(state_root).resolve()  # save_state's directories (checkpoints.py)
        cfg = runtime.cfg
        if runtime.trainer is None or runtime.engines is None or cfg.engines.adapter is None:
            raise RuntimeError("serve_tinker: the runtime started no trainer, no engines or no served adapter")
        self.trainer: MegatronGroup = runtime.trainer
        self.engine_urls = list(runtime.engines.engine_urls)
        self.adapter: ServedAdapter = cfg.engines.adapter
        self.family: str = self.trainer.family or ""
        self.base_model: str = str(cfg.engines.model_path)
        self.lora_rank = cfg.train.lora.lora_rank
        self.rows = cfg.train.batch.micro_batch_size
        self.vocab_size = cfg.megatron.arch.vocab_size
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tinker-trainer")
        self._lock = threading.Lock()
        self.models: dict[str, _Model] = {}
        self._count = 0
        self._last_beat: dict[str, float] = {}  # session id -> monotonic time of its last heartbeat
        self.samplers: dict[str, str] = {}  # sampling session id -> engine adapter name, or BASE
        # engine adapter names; one place stays the run's own adapter's
        self.loaded = SnapshotSlots(cfg.engines.adapter.max_loaded - 1)
        self.router_url, self.timeout_s = runtime.engines.router_url, cfg.engines.request_timeout_s
        self.api_key = cfg.engines.api_key
        self.tp_size = max(1, cfg.engines.gpus_per_engine)  # one payload per engine TP rank (0 on CPU)
        self.trainer.attach(RankTinker)

    def client(self, adapter: str | None) -> EngineClient:
        return EngineClient(self.router_url, timeout_s=self.timeout_s, api_key=self.api_key, adapter=adapter)

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

    def beat(self, session_id: str) -> None:
        self._last_beat[session_id] = time.monotonic()

    def _drop_silent_sessions(self) -> None:
        """The adapters of clients that died without closing their session leave the actor."""
        now = time.monotonic()
        with self._lock:
            silent = {m.session_id for m in self.models.values()
                      if now - self._last_beat.get(m.session_id, now) > SESSION_TIMEOUT_S}
            gone = [m.model_id for m in self.models.values() if m.session_id in silent]
            for model_id in gone:
                del self.models[model_id]
            for session_id in silent:
                self._last_beat.pop(session_id, None)
        for model_id in gone:
            self.trainer.call_all(RankTinker.drop, model_id)

    def create_model(self, session_id: str, model_id: str, base_model: str, lora: dict | None) -> dict:
        self.check_base(base_model)
        if lora is None:
            raise UserError("create_model: full fine-tuning is not supported; create a LoRA training client")
        if int(lora.get("rank", 0)) != self.lora_rank:
            raise UserError(f"lora_config.rank {lora.get('rank')}: this server trains rank {self.lora_rank} "
                            "adapters (--lora-rank)")
        self._drop_silent_sessions()  # on the trainer's thread, as every call that touches the actor
        with self._lock:
            if model_id not in self.models:
                self._count += 1
                self.models[model_id] = _Model(model_id, session_id, self._count)
        return {"model_id": model_id}

    def model(self, model_id: str) -> _Model:
        found = self.models.get(model_id)
        if found is None:
            raise UserError(f"model_id {model_id!r}: no such training client on this server")
        return found

    def drop_session(self, session_id: str) -> None:
        """The session finished: its training clients' adapters leave the actor (their sampler weights
        stay on the engines until pushed out)."""
        with self._lock:
            gone = [m.model_id for m in self.models.values() if m.session_id == session_id]
            for model_id in gone:
                del self.models[model_id]
        for model_id in gone:
            self._worker.submit(self.trainer.call_all, RankTinker.drop, model_id)

    def info(self, model_id: str) -> dict:
        self.model(model_id)
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": self.lora_rank,
                "model_data": {"model_name": self.base_model, "tokenizer_id": self.base_model, "arch": "lean_rl"}}

    # -- training ---------------------------------------------------------------------------------
    def forward_backward(self, call: ForwardBackwardCall) -> bytes:
        self.model(call.model_id)
        names = set(call.data[0].inputs) - {"target_tokens"}
        try:
            check_loss(call.loss_fn, names, call.loss_config)
            with_loss = True
        except ValueError as err:
            if not call.forward_only:
                raise UserError(str(err)) from None
            with_loss = False  # forward(): log-probs without the loss's inputs; loss:sum 0
        batches = build_micro_batches(call.data, self.rows, self.vocab_size)
        results = self.trainer.call_all(RankTinker.forward_backward, call.model_id, batches,
                                                call.loss_fn if with_loss else None, call.loss_config,
                                                call.forward_only)
        logprobs, loss = next(r for r in results if r is not None)
        return encode_forward_backward_output(per_datum_logprobs(logprobs, call.data, self.rows),
                                              {"loss:sum": loss})

    def optim_step(self, model_id: str, adam: dict[str, Any] | None) -> dict:
        self.model(model_id)
        params = {**_ADAM_DEFAULTS, **{k: float(v) for k, v in (adam or {}).items() if k in _ADAM_DEFAULTS}}
        results = self.trainer.call_all(RankTinker.optim_step, model_id, params)
        metrics = next(r for r in results if r is not None)
        return {"metrics": {f"{k}:mean": v for k, v in metrics.items()}}

    def save_for_sampler(self, model_id: str, name: str | None, session_key: str | None) -> dict:
        """Load the client's adapter as it is now on every engine, under a new name; a named save
        becomes a tinker:// path, an unnamed one (save_weights_and_get_sampling_client) a session."""
        model = self.model(model_id)
        if name is not None and not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise UserError(f"path {name!r}: a sampler weights name is letters, digits, '-', '_', '.'")
        model.version += 1
        adapter = f"a{model.index}v{model.version}"
        tensors: dict = {}
        for part in self.trainer.call_all(RankTinker.adapter_tensors, model_id, self.family):
            tensors.update(part)
        asyncio.run(self._load_on_engines(adapter, adapter_payload(tensors)))
        if name is not None:
            model.named[name] = adapter
            return {"path": f"tinker://{model_id}/sampler_weights/{name}"}
        self.samplers[session_key or adapter] = adapter
        return {"sampling_session_id": session_key or adapter}

    # -- training state: save_state / load_state (checkpoints.py) ---------------------------------
    def _meta(self) -> StateMeta:
        return StateMeta(self.base_model, self.lora_rank, self.trainer.world_size)

    def save_state(self, model_id: str, name: str, overwrite: bool) -> dict:
        self.model(model_id)
        directory = state_dir(self.state_root, model_id, name)
        if directory.exists():
            if not overwrite:
                raise UserError(f"save_state {name!r}: {tinker_path(model_id, name)} exists (overwrite=True replaces it)")
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        self.trainer.call_all(RankTinker.save_state, model_id, str(directory))
        write_meta(directory, self._meta())  # last: a state without it is incomplete, never loaded
        return {"path": tinker_path(model_id, name), "type": "save_weights"}

    def load_state(self, model_id: str, path: str, optimizer: bool, session_id: str | None,
                   base_model: str | None) -> dict:
        """Into the training client `model_id`; one not yet created (create_training_client_from_state)
        is created in `session_id` first."""
        directory = parse_path(self.state_root, path)
        check_meta(directory, path, self._meta())
        if model_id not in self.models:
            if session_id is None:
                raise UserError(f"model_id {model_id!r}: no such training client on this server")
            self.create_model(session_id, model_id, base_model or self.base_model, {"rank": self.lora_rank})
        self.trainer.call_all(RankTinker.load_state, model_id, str(directory), optimizer)
        return {"path": path, "model_id": model_id, "type": "load_weights"}

    async def _load_on_engines(self, adapter: str, payload: str) -> None:
        engines = [EngineClient(url, timeout_s=self.timeout_s, api_key=self.api_key)
                   for url in self.engine_urls]
        for unused in self.loaded.make_room():
            for engine in engines:
                await engine.request("POST", "/unload_lora_adapter", {"lora_name": unused})
        body = {"lora_name": adapter, "config_dict": self.adapter.peft_config(),
                "serialized_named_tensors": [payload] * self.tp_size}
        await asyncio.gather(*(e.request("POST", "/load_lora_adapter_from_tensors", body) for e in engines))
        self.loaded.add(adapter)
        for engine in engines:
            await engine.aclose()

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
        if bound != BASE and bound not in self.loaded:
            raise UserError(f"this sampling client's sampler weights ({bound}) were unloaded: the engines keep the "
                            f"{self.adapter.max_loaded - 1} most recently sampled (--max-sampler-adapters); "
                            "create a new sampling client")
        if bound != BASE:
            self.loaded.touch(bound)
        client = self.client(None if bound == BASE else bound)
        try:
            return await sample(client, request)
        finally:
            await client.aclose()
