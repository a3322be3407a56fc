"""backends/megatron/adapter_slots.py on a plain torch model and Adam: two adapters trained with their
steps and gradient accumulations interleaved end exactly where each ends trained alone."""

import types

import torch

from lean_rl.backends.megatron.adapter_slots import AdapterSlots


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    model[0].weight.requires_grad_(False)  # the frozen base
    for p in model.parameters():
        if p.requires_grad:
            p.main_grad = torch.zeros_like(p)  # as Megatron's DDP gives each trained parameter
    optimizer = types.SimpleNamespace(optimizer=torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                                                   lr=0.1, betas=(0.9, 0.99)))
    return model, optimizer


def _accumulate(model, x):
    model.zero_grad()
    model(x).pow(2).sum().backward()
    for p in model.parameters():
        if p.requires_grad:
            p.main_grad += p.grad


def _step(model, optimizer):
    for p in model.parameters():
        if p.requires_grad:
            p.grad = p.main_grad.clone()
    optimizer.optimizer.step()
    for p in model.parameters():
        if p.requires_grad:
            p.main_grad.zero_()


def _trained(model):
    return [p.detach().clone() for p in model.parameters() if p.requires_grad]


def test_interleaved_adapters_match_each_trained_alone():
    xa, xb = torch.randn(5, 4), torch.randn(5, 4) * 3
    alone = {}
    for name, x in (("a", xa), ("b", xb)):
        model, optimizer = _setup()
        for _ in range(3):
            _accumulate(model, x[:2])
            _accumulate(model, x[2:])
            _step(model, optimizer)
        alone[name] = _trained(model)
    model, optimizer = _setup()
    slots = AdapterSlots(model, optimizer)
    for _ in range(3):
        slots.use("a"); _accumulate(model, xa[:2])
        slots.use("b"); _accumulate(model, xb[:2])
        slots.use("a"); _accumulate(model, xa[2:])
        slots.use("b"); _accumulate(model, xb[2:]); _step(model, optimizer)
        slots.use("a"); _step(model, optimizer)
    for name in ("a", "b"):
        slots.use(name)
        assert all(torch.equal(p, q) for p, q in zip(_trained(model), alone[name])), name
    slots.drop("a")
    slots.use("a")  # a dropped adapter comes back fresh
    fresh, _ = _setup()
    assert all(torch.equal(p, q) for p, q in zip(_trained(model), _trained(fresh)))


def test_a_restored_checkpoint_resumes_exactly_with_its_optimizer_state():
    x = torch.randn(5, 4)
    model, optimizer = _setup()
    slots = AdapterSlots(model, optimizer)
    slots.use("a")
    for _ in range(2):
        _accumulate(model, x); _step(model, optimizer)
    saved = torch.load(_roundtrip(slots.checkpoint("a")), weights_only=True)  # as save_state writes it
    for _ in range(2):
        _accumulate(model, x); _step(model, optimizer)
    uninterrupted = _trained(model)
    # another client resumes from the state (create_training_client_from_state_with_optimizer) while "a"
    # has gradients pending: the resumed one starts with none
    _accumulate(model, x)
    slots.restore("resumed", saved, optimizer=True)
    for _ in range(2):
        _accumulate(model, x); _step(model, optimizer)
    assert all(torch.equal(p, q) for p, q in zip(_trained(model), uninterrupted))
    # weights only: Adam starts afresh, so the first step differs from the uninterrupted one
    slots.restore("weights_only", saved, optimizer=False)
    assert all(not optimizer.optimizer.state.get(p) for p in slots.main)
    _accumulate(model, x); _step(model, optimizer)
    _accumulate(model, x); _step(model, optimizer)
    assert not all(torch.equal(p, q) for p, q in zip(_trained(model), uninterrupted))


def test_a_checkpoint_of_another_shape_is_refused():
    model, optimizer = _setup()
    slots = AdapterSlots(model, optimizer)
    saved = slots.checkpoint("a")
    saved["params"] = [p[..., :1] for p in saved["params"]]
    try:
        slots.restore("b", saved, optimizer=True)
    except ValueError as err:
        assert "do not fit this model's adapter" in str(err)
    else:
        raise AssertionError("a mismatched checkpoint was restored")


def _roundtrip(state):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer
