"""Real SGLang servers + sglang-router on the tiny Qwen2 (one shared EngineGroup, see conftest.py).
Tests that change server state restore it in `finally`."""

import asyncio
import pickle
import time
from pathlib import Path
from datetime import timedelta

import pybase64
import pytest
import torch
from safetensors.torch import load_file

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.blocking_client import BlockingEngineClient
from lean_rl.backends.sglang.client_errors import EngineHTTPError

pytestmark = pytest.mark.integration

GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
LONG = {"temperature": 1.0, "max_new_tokens": 3000, "ignore_eos": True}  # runs long enough to be interrupted


@pytest.fixture(scope="module")
def prompts(tiny_qwen2):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen2)
    texts = ["the cat sat on the mat", "3 + 4 = 7", "hello world what is the answer", "red blue green"]
    return [tokenizer(text)["input_ids"] for text in texts]


def transformers_output_log_probs(model_path, prompt, output_ids):
    """log p(output_ids[i] | prompt + output_ids[:i]) from a plain transformers float32 forward."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + output_ids])
    with torch.no_grad():
        log_probs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(output_ids))
    return log_probs[positions, torch.tensor(output_ids)]


async def wait_until_running(client: EngineClient, count: int = 1, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(load["num_running_reqs"] for load in await client.loads()) < count:
        assert time.monotonic() < deadline, f"{count} request(s) never started running on {client.base_url}"
        await asyncio.sleep(0.05)


def generate_count(group, index) -> int:
    return group.engine_log_path(index).read_text(errors="replace").count('"POST /generate HTTP/1.1" 200')


def test_generate_through_router_with_log_probs_matching_transformers(engine_group, prompts, tiny_qwen2):
    async def generate_all():
        async with engine_group.router_client() as client:
            sampling = {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True}
            return await asyncio.gather(*(client.generate(p, sampling, return_logprob=True) for p in prompts))

    results = asyncio.run(generate_all())
    worst = 0.0
    for prompt, result in zip(prompts, results):
        assert len(result.output_ids) == len(result.output_log_probs) == result.completion_tokens == 16
        assert result.finish_reason == "length" and result.prompt_tokens == len(prompt)
        assert result.weight_version is not None
        reference = transformers_output_log_probs(tiny_qwen2, prompt, result.output_ids)
        worst = max(worst, (torch.tensor(result.output_log_probs) - reference).abs().max().item())
    assert worst <= 1e-4, f"SGLang vs transformers log-probs differ by up to {worst}"
    assert len({tuple(r.output_log_probs) for r in results}) == len(results)  # not one constant answer


def test_abort_by_rid_hits_only_that_request_and_abort_all_hits_every_one(engine_group, prompts):
    async def scenario():
        async with engine_group.engine_clients()[0] as client:
            task = asyncio.create_task(client.generate(prompts[0], LONG, rid="lean-rl-abort-me", return_logprob=True))
            await wait_until_running(client)
            await client.abort_request("some-other-rid")
            await asyncio.sleep(0.5)
            assert not task.done(), "aborting another rid stopped this request"
            await client.abort_request("lean-rl-abort-me")
            aborted = await asyncio.wait_for(task, 60)

            tasks = [asyncio.create_task(client.generate(p, LONG)) for p in prompts[:2]]
            await wait_until_running(client, 2)
            await client.abort_request(abort_all=True)
            return aborted, await asyncio.wait_for(asyncio.gather(*tasks), 60)

    aborted, all_aborted = asyncio.run(scenario())
    assert aborted.aborted and 0 < aborted.completion_tokens < LONG["max_new_tokens"]
    assert len(aborted.output_ids) == len(aborted.output_log_probs) == aborted.completion_tokens  # partial kept
    assert all(r.aborted and r.completion_tokens < LONG["max_new_tokens"] for r in all_aborted)


def test_pause_in_place_holds_requests_and_continue_finishes_them(engine_group, prompts):
    sampling = {"temperature": 1.0, "max_new_tokens": 400, "ignore_eos": True}

    async def scenario():
        async with EngineClient(engine_group.engine_urls[0], api_key=engine_group.config.api_key) as client:
            try:
                task = asyncio.create_task(client.generate(prompts[1], sampling))
                await wait_until_running(client)
                await client.pause_generation("in_place")
                await asyncio.sleep(1.0)
                held = not task.done()
                await client.continue_generation()
                finished = await asyncio.wait_for(task, 120)

                task = asyncio.create_task(client.generate(prompts[2], LONG))
                await wait_until_running(client)
                await client.pause_generation("abort")
                aborted = await asyncio.wait_for(task, 60)
                queued = asyncio.create_task(client.generate(prompts[3], GREEDY))
                await asyncio.sleep(1.0)
                queued_while_paused = not queued.done()
            finally:
                await client.continue_generation()
            return held, finished, aborted, queued_while_paused, await asyncio.wait_for(queued, 60)

    held, finished, aborted, queued_while_paused, after_continue = asyncio.run(scenario())
    assert held, "the request finished although generation was paused"
    assert finished.finish_reason == "length" and finished.completion_tokens == 400
    assert aborted.aborted
    assert queued_while_paused, "a new request ran although generation was paused"
    assert after_continue.finish_reason == "length" and after_continue.completion_tokens == GREEDY["max_new_tokens"]


def test_flush_cache_empties_the_prefix_cache(engine_group, prompts):
    prompt = prompts[0] * 6
    one_token = {"temperature": 0.0, "max_new_tokens": 1}
    with BlockingEngineClient(engine_group.engine_urls[1], api_key=engine_group.config.api_key) as client:
        client.flush_cache()
        assert client.generate(prompt, one_token).cached_tokens == 0
        assert client.generate(prompt, one_token).cached_tokens >= len(prompt) - 1
        client.flush_cache()
        assert client.generate(prompt, one_token).cached_tokens == 0


def test_update_weights_from_disk_changes_greedy_output_and_restoring_restores_it(
    engine_group, prompts, tiny_qwen2, tiny_model_factory
):
    other_model = tiny_model_factory("qwen2", seed=1)
    clients = [BlockingEngineClient(url, api_key=engine_group.config.api_key) for url in engine_group.engine_urls]
    router = BlockingEngineClient(engine_group.router_url, api_key=engine_group.config.api_key)
    try:
        before = router.generate(prompts[0], GREEDY, return_logprob=True)
        for client in clients:
            reply = client.update_weights_from_disk(str(other_model), weight_version="disk-v1")
            assert reply["success"]
        assert [c.weight_version() for c in clients] == ["disk-v1", "disk-v1"]
        updated = [router.generate(prompts[0], GREEDY, return_logprob=True) for _ in clients]  # both engines
        for result in updated:
            assert result.output_ids != before.output_ids
            assert result.weight_version == "disk-v1"
            assert [(s.version, s.start, s.end) for s in result.weight_version_spans] == [("disk-v1", 0, 12)]
        reference = transformers_output_log_probs(other_model, prompts[0], updated[0].output_ids)
        assert (torch.tensor(updated[0].output_log_probs) - reference).abs().max().item() <= 1e-4
        with pytest.raises(EngineHTTPError, match="update_weights_from_disk: HTTP 400"):
            clients[0].update_weights_from_disk(str(other_model / "missing"))
    finally:
        for client in clients:
            client.update_weights_from_disk(str(tiny_qwen2), weight_version="restored")
    after = [router.generate(prompts[0], GREEDY, return_logprob=True) for _ in clients]
    for result in after:
        assert result.output_ids == before.output_ids and result.weight_version == "restored"
    for client in [*clients, router]:
        client.close()


def join_weight_update_group(port: int, world_size: int, group_name: str):
    """The trainer's side of /init_weights_update_group as rank 0 (sglang's init_custom_process_group
    recipe: a group that is not the default one, over gloo on CPU)."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

    timeout = timedelta(seconds=60)
    store, rank, world_size = next(rendezvous(f"tcp://127.0.0.1:{port}", 0, world_size, timeout=timeout))
    store = PrefixStore(group_name, store)
    group, _ = _new_process_group_helper(world_size, rank, [], Backend("gloo"), store, group_name=group_name,
                                         timeout=timeout)
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def test_tensor_and_distributed_updates_load_the_same_weights_as_disk(engine_group, prompts, tiny_qwen2,
                                                                      tiny_model_factory):
    import torch.distributed as dist

    from lean_rl.utils.net import find_free_port

    other_model = tiny_model_factory("qwen2", seed=2)
    state = load_file(str(other_model / "model.safetensors"))
    engine0, engine1 = (BlockingEngineClient(url, api_key=engine_group.config.api_key)
                        for url in engine_group.engine_urls)
    try:
        before = engine0.generate(prompts[1], GREEDY, return_logprob=True)
        engine1.update_weights_from_disk(str(other_model), weight_version="disk-v2")
        by_disk = engine1.generate(prompts[1], GREEDY, return_logprob=True)
        assert by_disk.output_ids != before.output_ids

        # Tensor: an inline pickled payload (SGLang's default fd-passing serializer crashes a CPU server).
        payload = pybase64.b64encode(pickle.dumps(list(state.items()))).decode()
        engine0.update_weights_from_tensor([payload], weight_version="tensor-v2")
        by_tensor = engine0.generate(prompts[1], GREEDY, return_logprob=True)
        assert by_tensor.output_ids == by_disk.output_ids and by_tensor.weight_version == "tensor-v2"
        assert max(abs(a - b) for a, b in zip(by_tensor.output_log_probs, by_disk.output_log_probs)) <= 1e-5

        # Distributed: restore engine 0 by broadcasting the original weights over gloo while the call runs.
        original = load_file(str(tiny_qwen2 / "model.safetensors"))
        port, group_name = find_free_port(), "lean_rl_test_group"
        joined = engine0.submit(EngineClient.init_weights_update_group, "127.0.0.1", port, 1, 2, group_name=group_name,
                                backend="gloo")
        group = join_weight_update_group(port, 2, group_name)
        joined.result(timeout=60)
        names = list(original)
        update = engine0.submit(EngineClient.update_weights_from_distributed, names, [original[n].dtype for n in names],
                                [list(original[n].shape) for n in names], group_name=group_name,
                                weight_version="dist-v2")
        for name in names:
            dist.broadcast(original[name].contiguous(), src=0, group=group)
        assert update.result(timeout=60)["success"]
        engine0.destroy_weights_update_group(group_name)
        dist.destroy_process_group(group)
        by_distributed = engine0.generate(prompts[1], GREEDY, return_logprob=True)
        assert by_distributed.output_ids == before.output_ids and by_distributed.weight_version == "dist-v2"
    finally:
        for client in (engine0, engine1):
            client.update_weights_from_disk(str(tiny_qwen2), weight_version="restored")
            client.close()


def test_router_routes_around_a_removed_engine_and_back_after_readding(engine_group, prompts):
    router = BlockingEngineClient(engine_group.router_url, api_key=engine_group.config.api_key)

    def send_and_count(n):
        counts_before = [generate_count(engine_group, i) for i in range(2)]
        for i in range(n):
            router.generate(prompts[i % len(prompts)], {"temperature": 0.0, "max_new_tokens": 2})
        time.sleep(0.5)  # the access-log line is written just after the response
        return [generate_count(engine_group, i) - counts_before[i] for i in range(2)]

    try:
        engine_group.remove_engine(1)
        assert engine_group.router.worker_urls() == {engine_group.engine_urls[0]}
        assert send_and_count(4) == [4, 0]
    finally:
        engine_group.add_engine(1)
    assert engine_group.router.worker_urls() == set(engine_group.engine_urls)
    assert send_and_count(4) == [2, 2]  # round_robin over both again
    router.close()


# slow (suite time): tests/e2e/test_engine_faults.py restarts a killed engine in the real loop by default
@pytest.mark.slow
def test_restart_engine_brings_it_back_on_the_same_port(engine_group, prompts):
    old_pids = set(engine_group.pids()["engine-1"])
    seconds = engine_group.restart_engine(1)
    print(f"engine restart took {seconds:.1f} s")
    new_pids = set(engine_group.pids()["engine-1"])
    assert new_pids and not (old_pids & new_pids)
    assert engine_group.router.worker_urls() == set(engine_group.engine_urls)
    with BlockingEngineClient(engine_group.engine_urls[1], api_key=engine_group.config.api_key) as client:
        assert client.generate(prompts[0], GREEDY).completion_tokens == GREEDY["max_new_tokens"]


def test_cpu_servers_run_with_their_share_of_the_cores(engine_group):
    expected = f"OMP_NUM_THREADS={engine_group.config.threads_per_cpu_engine}".encode()
    for index in range(engine_group.config.num_engines):
        # the server process; its scheduler and detokenizer inherit its environment (and rename
        # themselves with setproctitle, which overwrites their /proc/PID/environ)
        server_pid = engine_group.pids()[f"engine-{index}"][0]
        assert expected in Path(f"/proc/{server_pid}/environ").read_bytes().split(b"\0"), server_pid
