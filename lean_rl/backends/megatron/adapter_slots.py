"""Several LoRA adapters on one actor, one trained at a time (multi-LoRA for lean_rl.serve_tinker).

The model holds one set of adapter parameters and the optimizer one state for them; a slot holds, in
host memory, everything of one adapter that a step changes: the adapter parameters (and the
optimizer's float32 main copies where they differ: 16-bit training), their accumulated gradients
(DDP's main_grad) and the optimizer state (Adam's moments and step). `use(name)` parks the adapter in
place into its slot and brings `name`'s in, so gradients accumulated for one adapter never reach
another, and each keeps its own Adam state. A new adapter starts as the model did: the adapters' A
of --seed, B = 0 (the base model), no gradients, no optimizer state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


def _inner_optimizers(optimizer) -> list[Any]:
    return [inner.optimizer for inner in getattr(optimizer, "chained_optimizers", [optimizer])]


@dataclass
class _Slot:
    params: list[torch.Tensor]
    main: list[torch.Tensor]
    grads: list[torch.Tensor | None]
    state: list[dict] = field(default_factory=list)


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


class AdapterSlots:
    def __init__(self, model: torch.nn.Module, optimizer):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizers: list[Any] = _inner_optimizers(optimizer)
        self.main = [p for opt in self.optimizers for group in opt.param_groups for p in group["params"]]
        self.fresh = self._save(with_state=False)
        self.fresh.grads = [None] * len(self.params)
        self.fresh.state = [{} for _ in self.main]
        self.slots: dict[str, _Slot] = {}
        self.active: str | None = None

    def _save(self, with_state: bool = True) -> _Slot:
        grads = [_host(g) if (g := getattr(p, "main_grad", None)) is not None else None for p in self.params]
        state = []
        if with_state:
            for opt in self.optimizers:
                for group in opt.param_groups:
                    for p in group["params"]:
                        held: dict[str, Any] = dict(opt.state.get(p) or {})
                        state.append({k: _host(v) if torch.is_tensor(v) else v for k, v in held.items()})
        return _Slot([_host(p) for p in self.params], [_host(p) for p in self.main], grads, state)

    def _load(self, slot: _Slot) -> None:
        with torch.no_grad():
            for p, saved in zip(self.params, slot.params):
                p.copy_(saved)
            for p, saved in zip(self.main, slot.main):
                p.copy_(saved)
            for p, g in zip(self.params, slot.grads):
                main_grad = getattr(p, "main_grad", None)
                if main_grad is not None:
                    main_grad.copy_(g) if g is not None else main_grad.zero_()
        index = 0
        for opt in self.optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    kept = slot.state[index]
                    index += 1
                    if kept:
                        opt.state[p] = {k: v.to(p.device, copy=True) if torch.is_tensor(v) else v
                                        for k, v in kept.items()}
                    else:
                        opt.state.pop(p, None)

    def use(self, name: str) -> None:
        """Make `name`'s adapter the model's (a new name: a fresh adapter)."""
        if self.active == name:
            return
        if self.active is not None:
            self.slots[self.active] = self._save()
        self._load(self.slots.pop(name, self.fresh))
        self.active = name

    def checkpoint(self, name: str) -> dict[str, list]:
        """`name`'s adapter parameters, main copies and optimizer state (not its accumulated gradients):
        what save_state keeps, on host memory."""
        self.use(name)
        slot = self._save()
        return {"params": slot.params, "main": slot.main, "state": slot.state}

    def restore(self, name: str, saved: dict[str, list], optimizer: bool) -> None:
        """Make `saved` (a checkpoint()) `name`'s adapter, its gradients zero; its optimizer state too if
        `optimizer`, else none (Adam starts afresh)."""
        shapes = [tuple(t.shape) for t in saved["params"]]
        if shapes != [tuple(p.shape) for p in self.params] or len(saved["main"]) != len(self.main):
            raise ValueError(f"the saved adapter's tensors {shapes} do not fit this model's adapter "
                             f"{[tuple(p.shape) for p in self.params]} (another rank, targets or model?)")
        self.use(name)
        state = saved["state"] if optimizer else [{} for _ in self.main]
        self._load(_Slot(saved["params"], saved["main"], [None] * len(self.params), state))

    def drop(self, name: str) -> None:
        """Forget `name` (its training client is gone); the model keeps its weights until the next use."""
        self.slots.pop(name, None)
        if self.active == name:
            self.active = None

    @property
    def names(self) -> list[str]:
        return sorted(set(self.slots) | ({self.active} if self.active else set()))
