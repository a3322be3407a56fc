"""Chunked log-probs and entropy (chunked_logprobs.py) against the full-logits path (logprobs.py) on
real Megatron tensor-parallel groups over gloo, TP=1 and TP=2: the same values and the same gradients
of the hidden states and the output weight shard, to float32 tolerance, with a padded vocabulary, a
sampling temperature, a chunk size that does not divide the token count, and the entropy with and
without a gradient; and on-policy distillation's top-k reverse KL (the student's log-probs of given
token ids, picked on the rank that owns each id). Runs in processes of its own (torch.multiprocessing), not Ray: only the math and
its collectives are under test; test_megatron_training.py runs the same path through the trainer."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.integration

VOCAB, PADDED, HIDDEN = 50, 56, 16  # 6 padded rows: at TP=2 rank 1 owns 22 real columns and 6 padding
BATCH, SEQ, CHUNK = 2, 7, 3  # 14 tokens in chunks of 3 (the last holds 2)
TEMPERATURE = 0.7
TOP_K = 4  # on-policy distillation's teacher top-k


def _full_path(hidden, shard, targets, entropy_grad):
    from lean_rl.backends.megatron.logprobs import _vocab_parallel_entropy, vocab_parallel_log_probs
    from megatron.core import parallel_state

    logits = torch.matmul(hidden, shard.t()).float() / TEMPERATURE
    if entropy_grad:
        return vocab_parallel_log_probs(logits, targets, VOCAB, with_entropy=True)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    valid = max(0, min(logits.shape[-1], VOCAB - tp_rank * logits.shape[-1]))
    with torch.no_grad():
        entropy = _vocab_parallel_entropy(logits.detach()[..., :valid])
    return vocab_parallel_log_probs(logits, targets, VOCAB)[0], entropy


def _rank(rank: int, world_size: int, port: int, results) -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region

    from lean_rl.algorithms.distillation import topk_reverse_kl
    from lean_rl.backends.megatron.chunked_logprobs import chunked_log_probs, chunked_token_statistics
    from lean_rl.backends.megatron.logprobs import vocab_parallel_log_probs_at
    from lean_rl.backends.megatron.compat import apply_compat
    from lean_rl.backends.megatron.compat_cpu import megatron_thread_mode

    device = torch.device("cpu")
    apply_compat(device)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        with megatron_thread_mode(device):
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)
            generator = torch.Generator().manual_seed(7)  # the same full tensors on every rank
            hidden0 = torch.randn(BATCH, SEQ, HIDDEN, generator=generator)
            weight0 = torch.randn(PADDED, HIDDEN, generator=generator) * 0.5
            targets = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
            coef = torch.randn(2, BATCH, SEQ, generator=generator)
            part = PADDED // world_size
            out = {}
            for entropy_grad in (True, False):
                runs = {}
                for name in ("full", "chunked"):
                    hidden = hidden0.clone().requires_grad_()
                    shard = weight0[rank * part:(rank + 1) * part].clone().requires_grad_()
                    tp_hidden = copy_to_tensor_model_parallel_region(hidden)  # as ColumnParallelLinear
                    if name == "full":
                        log_probs, entropy = _full_path(tp_hidden, shard, targets, entropy_grad)
                    else:
                        log_probs, entropy = chunked_log_probs(tp_hidden, shard, targets, VOCAB, CHUNK,
                                                               TEMPERATURE, entropy_grad)
                    assert entropy.requires_grad == entropy_grad
                    loss = (coef[0] * log_probs).sum() + (coef[1] * entropy).sum()
                    loss.backward()
                    runs[name] = [t.detach().clone() for t in (log_probs, entropy, hidden.grad, shard.grad)]
                out[entropy_grad] = runs
            # --opd-estimator topk: the student's log-probs of K given ids and the top-k KL, full vs chunked
            ids = torch.randint(0, VOCAB, (BATCH, SEQ, TOP_K), generator=generator)
            ids[0, 0] = torch.arange(VOCAB - TOP_K, VOCAB)  # ids on the last rank's real columns, next to padding
            teacher = torch.log_softmax(torch.randn(BATCH, SEQ, VOCAB, generator=generator), -1).gather(-1, ids)
            kl_runs = {}
            for name in ("full", "chunked"):
                hidden = hidden0.clone().requires_grad_()
                shard = weight0[rank * part:(rank + 1) * part].clone().requires_grad_()
                tp_hidden = copy_to_tensor_model_parallel_region(hidden)
                if name == "full":
                    logits = torch.matmul(tp_hidden, shard.t()).float() / TEMPERATURE
                    at_ids = vocab_parallel_log_probs_at(logits, ids, VOCAB)
                    kl = topk_reverse_kl(at_ids, teacher)
                else:
                    def statistic(chunk_logits, chunk_ids, chunk_teacher):
                        picked = vocab_parallel_log_probs_at(chunk_logits, chunk_ids, VOCAB)
                        return picked, topk_reverse_kl(picked, chunk_teacher)
                    at_ids, kl = chunked_token_statistics(tp_hidden, shard, statistic, (ids, teacher), CHUNK,
                                                          TEMPERATURE)
                (coef[0] * kl).sum().backward()
                kl_runs[name] = [t.detach().clone() for t in (at_ids, kl, hidden.grad, shard.grad)]
            out["topk"] = kl_runs
            # an independent reference on the whole vocabulary: torch's log_softmax
            logits = (hidden0 @ weight0[:VOCAB].t()) / TEMPERATURE
            log_softmax = torch.log_softmax(logits, -1)
            out["reference"] = (log_softmax.gather(-1, targets.unsqueeze(-1)).squeeze(-1),
                                -(log_softmax.exp() * log_softmax).sum(-1), log_softmax.gather(-1, ids))
            results[rank] = out
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("world_size", [1, 2])
def test_chunked_log_probs_match_the_full_logits_values_and_gradients(world_size):
    results = mp.Manager().dict()
    mp.start_processes(_rank, args=(world_size, _free_port(), results), nprocs=world_size, join=True,
                       start_method="spawn")
    assert sorted(results.keys()) == list(range(world_size))
    for rank in range(world_size):
        out = results[rank]
        reference_log_probs, reference_entropy, reference_at_ids = out["reference"]
        full, chunked = out["topk"]["full"], out["topk"]["chunked"]
        for name, a, b in zip(("log-probs at ids", "top-k KL", "hidden grad", "weight shard grad"), full, chunked):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (name, rank, (a - b).abs().max())
        assert torch.allclose(chunked[0], reference_at_ids, rtol=1e-5, atol=1e-5)
        assert chunked[2].abs().sum() > 0 and chunked[3].abs().sum() > 0
        for entropy_grad in (True, False):
            full, chunked = out[entropy_grad]["full"], out[entropy_grad]["chunked"]
            for name, a, b in zip(("log_probs", "entropy", "hidden grad", "weight shard grad"), full, chunked):
                assert a.shape == b.shape, name
                assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (name, rank, entropy_grad, (a - b).abs().max())
            assert torch.allclose(chunked[0], reference_log_probs, rtol=1e-5, atol=1e-5)
            assert torch.allclose(chunked[1], reference_entropy, rtol=1e-5, atol=1e-5)
            assert chunked[2].abs().sum() > 0 and chunked[3].abs().sum() > 0  # gradients did flow
    if world_size == 2:  # the hidden gradient was summed over the two vocab shards: equal on both ranks
        assert torch.allclose(results[0][True]["chunked"][2], results[1][True]["chunked"][2])
