"""EngineClient: the one client for SGLang's native HTTP API (0.5.23).

One implementation, two ways to drive it:
- `EngineClient` is async: the rollout awaits thousands of `generate` calls concurrently on one
  connection pool.
- `BlockingEngineClient` (blocking_client.py) runs the same EngineClient on a private event-loop thread
  (an anyio blocking portal) for ordinary code such as the trainer driver's weight sync. Its `submit(name, ...)` returns
  a concurrent.futures.Future, which is what `update_weights_from_distributed` needs: the HTTP call
  must be in flight while the trainer broadcasts the tensors.

Policy (shared by both, engine_http.py): every call has a timeout; connection failures are retried
with bounded backoff, nothing else is; HTTP errors raise with the server's own message; the run's API
key goes only to a listener that proved to be the run's. Generation goes through the router; weight
updates, abort and pause/continue must go to each engine directly (sglang-router 0.3.2 does not
forward them).
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from lean_rl.backends.sglang.client_errors import EngineError, EngineHTTPError
from lean_rl.backends.sglang.engine_http import EngineHTTP
from lean_rl.backends.sglang.responses import (GenerateResult, ScoreResult, build_generate_payload, build_score_payload,
                                               parse_generate_response, parse_score_response)

PAUSE_MODES = ("abort", "retract", "in_place")


# sglang-router 0.3.2 reads this header (its `manual` policy pins each key to one worker; the default
# `cache_aware` policy keeps a session together through its shared prefix).
ROUTING_KEY_HEADER = "x-smg-routing-key"


def _json_body(response: httpx.Response) -> Any:
    try:
        return orjson.loads(response.content)  # several times json's speed on the rollout's answers
    except ValueError:  # orjson.JSONDecodeError, a ValueError
        raise ValueError(f"the body is not JSON (HTTP {response.status_code}): {response.text[:300]!r}") from None


class EngineClient(EngineHTTP):
    """Async client of one SGLang server (or of the router, for generation): its endpoints."""

    # ------------------------------------------------------------------ generation
    async def generate(
        self,
        input_ids: list[int],
        sampling_params: dict | None = None,
        *,
        return_logprob: bool = False,
        rid: str | None = None,
        timeout_s: float | None = None,
        routing_key: str | None = None,
        return_routed_experts: bool = False,
        image_data: list[str] | None = None,
        image_token_id: int | None = None,
    ) -> GenerateResult:
        """Generate from token ids. `rid` names the request for abort_request; with return_logprob the
        result carries one log-prob per output token. `routing_key`: requests with the same key belong
        to one session (the turns of one trajectory); sent to the router as its routing-key header.
        `return_routed_experts` (a server started with --enable-return-routed-experts): the result
        carries the experts every token of input + output but the last went through. `image_data`: the
        prompt's images, one `image_token_id` each in input_ids (image_prompt.py)."""
        payload = build_generate_payload(input_ids, sampling_params, return_logprob=return_logprob, rid=rid,
                                         return_routed_experts=return_routed_experts, adapter=self.adapter,
                                         image_data=image_data, image_token_id=image_token_id)
        headers = {ROUTING_KEY_HEADER: routing_key} if routing_key else None
        response = await self.request("POST", "/generate", payload, timeout_s=timeout_s, headers=headers)
        try:
            return parse_generate_response(_json_body(response), return_logprob=return_logprob,
                                           return_routed_experts=return_routed_experts)
        except ValueError as exc:
            raise EngineError(self.base_url, "/generate", f"unexpected response: {exc}") from exc

    async def score(self, input_ids: list[int], *, top_k: int = 0, timeout_s: float | None = None) -> ScoreResult:
        """log p(input_ids[j] | input_ids[:j]) for j >= 1 under the engine's current weights (one
        forward pass; the weight-sync probe compares these with the trainer's), and with top_k > 0
        the top_k likeliest tokens of each of those distributions (on-policy distillation's teacher)."""
        payload = build_score_payload(input_ids, top_k, self.adapter)
        response = await self.request("POST", "/generate", payload, timeout_s=timeout_s)
        try:
            return parse_score_response(_json_body(response), payload["input_ids"], top_k)
        except ValueError as exc:
            raise EngineError(self.base_url, "/generate", f"unexpected score response: {exc}") from exc

    async def abort_request(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """Abort one request by rid, or every request (abort_all=True); the pending generate returns
        with finish_reason 'abort' and the tokens made so far."""
        if (rid is None) == (not abort_all):
            raise ValueError("abort_request: pass exactly one of rid=... or abort_all=True")
        await self.request("POST", "/abort_request", {"abort_all": True} if abort_all else {"rid": rid})

    async def pause_generation(self, mode: str = "abort") -> None:
        """Stop scheduling: 'abort' ends running requests, 'retract' requeues them (KV dropped),
        'in_place' freezes them with their KV cache. Resume with continue_generation()."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause_generation: mode must be one of {PAUSE_MODES}, got {mode!r}")
        await self._post_json("/pause_generation", {"mode": mode})

    async def continue_generation(self) -> None:
        await self._post_json("/continue_generation", {})

    async def flush_cache(self) -> None:
        """Drop the prefix (radix) cache; the server refuses (HTTP 400) while requests are running."""
        await self.request("POST", "/flush_cache")

    # ------------------------------------------------------------------ weights
    async def update_weights_from_disk(
        self, model_path: str, *, weight_version: str | None = None, flush_cache: bool = True,
        timeout_s: float | None = None,
    ) -> dict:
        body = {"model_path": str(model_path), "flush_cache": flush_cache}
        if weight_version is not None:
            body["weight_version"] = str(weight_version)
        return await self._post_json("/update_weights_from_disk", body, timeout_s=timeout_s)

    async def begin_weight_update(self) -> dict:
        return await self._post_json("/begin_weight_update", {})

    async def end_weight_update(self) -> dict:
        return await self._post_json("/end_weight_update", {})

    async def _in_weight_update_session(self, endpoint: str, body: dict, timeout_s: float | None,
                                        in_open_session: bool = False) -> dict:
        if in_open_session:  # the caller opened the session and sends several buckets in it
            return await self._post_json(endpoint, body, timeout_s=timeout_s)
        # 0.5.23 rejects tensor/distributed updates outside /begin_weight_update ... /end_weight_update
        # (HTTP 400 "must run between begin_weight_update() and end_weight_update()"). Always close the
        # session, also when the update fails, or the next update cannot begin.
        await self.begin_weight_update()
        try:
            return await self._post_json(endpoint, body, timeout_s=timeout_s)
        finally:
            await self.end_weight_update()

    async def update_weights_from_tensor(
        self, serialized_named_tensors: list[str], *, weight_version: str | None = None, flush_cache: bool = True,
        load_format: str | None = None, timeout_s: float | None = None, in_open_session: bool = False,
    ) -> dict:
        """`serialized_named_tensors`: one base64 payload per TP rank of the engine. Wrapped in its own
        begin/end_weight_update session unless `in_open_session` (the caller holds one)."""
        body = {"serialized_named_tensors": serialized_named_tensors, "flush_cache": flush_cache,
                "weight_version": None if weight_version is None else str(weight_version), "load_format": load_format}
        return await self._in_weight_update_session("/update_weights_from_tensor", body, timeout_s, in_open_session)

    async def replace_lora_adapter(self, name: str, peft_config: dict, serialized_tensors: list[str], *,
                                   weight_version: str, timeout_s: float | None = None) -> dict:
        """Serve the adapter `name` with these tensors from now on, as `weight_version`: unload the one
        loaded under that name (none on a fresh or restarted server), load the new one
        (`serialized_tensors`: one inline payload per TP rank, as update_weights_from_tensor's; SGLang
        slices it per rank itself), set the version. The radix cache needs no flush: SGLang keys its
        entries by the adapter's load id, which is new on every load (sglang/srt/mem_cache/events.py:42)."""
        try:
            await self._post_json("/unload_lora_adapter", {"lora_name": name}, timeout_s=timeout_s)
        except EngineHTTPError as exc:  # HTTP 400 "LoRA with name ... does not exist": nothing to unload
            if "does not exist" not in exc.server_message:
                raise
        loaded = await self._post_json("/load_lora_adapter_from_tensors", {
            "lora_name": name, "config_dict": peft_config, "serialized_named_tensors": serialized_tensors},
            timeout_s=timeout_s)
        await self._post_json("/update_weight_version", {"new_version": str(weight_version),
                                                         "abort_all_requests": False}, timeout_s=timeout_s)
        return loaded

    async def update_weights_from_distributed(
        self, names: list[str], dtypes: list[str], shapes: list[list[int]], *, group_name: str = "weight_update_group",
        weight_version: str | None = None, flush_cache: bool = True, load_format: str | None = None,
        timeout_s: float | None = None, in_open_session: bool = False,
    ) -> dict:
        """The engine receives each tensor by broadcast from rank 0 of `group_name`, in `names` order
        (load_format "flattened_bucket": one broadcast of all of them, concatenated as bytes); the sender
        must broadcast while this call is in flight (BlockingEngineClient.submit)."""
        if not len(names) == len(dtypes) == len(shapes):
            raise ValueError(f"names, dtypes, shapes differ in length: {len(names)}, {len(dtypes)}, {len(shapes)}")
        body = {"names": list(names), "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
                "shapes": [list(s) for s in shapes], "group_name": group_name, "flush_cache": flush_cache,
                "weight_version": None if weight_version is None else str(weight_version), "load_format": load_format}
        return await self._in_weight_update_session("/update_weights_from_distributed", body, timeout_s,
                                                    in_open_session)

    async def init_weights_update_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int, *,
        group_name: str = "weight_update_group", backend: str = "gloo", timeout_s: float | None = None,
    ) -> dict:
        """Join a torch.distributed group as ranks rank_offset.. (the trainer is rank 0); the trainer
        must join concurrently. backend 'gloo' on CPU, 'nccl' on GPU."""
        body = {"master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
                "world_size": int(world_size), "group_name": group_name, "backend": backend}
        return await self._post_json("/init_weights_update_group", body, timeout_s=timeout_s)

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> dict:
        return await self._post_json("/destroy_weights_update_group", {"group_name": group_name})

    async def weight_checksums(self, timeout_s: float | None = None) -> list[dict[str, str]]:
        """/weights_checker (action "checksum"): per TP rank of the engine, {parameter name (SGLang's,
        e.g. fused qkv_proj): hex hash of its bytes}. Used to find which tensor a failed sync broke."""
        payload = await self._post_json("/weights_checker", {"action": "checksum"}, timeout_s=timeout_s)
        try:
            return [dict(rank["checksums"]) for rank in payload["ranks"]]
        except (KeyError, TypeError) as exc:
            raise EngineError(self.base_url, "/weights_checker", f"unexpected response: {str(payload)[:300]}") from exc

    async def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """GPU only (the server needs --enable-memory-saver): free weights / KV cache / CUDA graphs
        (`tags`; None = all) while the trainer uses the GPU. A no-op on CPU servers."""
        await self.request("POST", "/release_memory_occupation", {"tags": tags})

    async def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        await self.request("POST", "/resume_memory_occupation", {"tags": tags})

    # ------------------------------------------------------------------ status
    async def health(self, timeout_s: float = 10.0) -> None:
        """Raise unless the server answers GET /health with 200."""
        await self.request("GET", "/health", timeout_s=timeout_s)

    async def is_healthy(self, timeout_s: float = 5.0) -> bool:
        try:
            await self.health(timeout_s)
        except EngineError:
            return False
        return True

    async def model_info(self) -> dict:
        """/model_info: model_path, weight_version, architectures, is_generation, ..."""
        return (await self.request("GET", "/model_info")).json()

    async def server_info(self) -> dict:
        """/server_info: the server's flags plus runtime state."""
        return (await self.request("GET", "/server_info")).json()

    async def weight_version(self) -> str:
        return (await self.model_info())["weight_version"]

    async def loads(self) -> list[dict]:
        """/v1/loads: one dict per data-parallel rank with num_running_reqs, num_waiting_reqs,
        token_usage, ... (what a scheduler or health monitor needs to see)."""
        return (await self.request("GET", "/v1/loads")).json()["loads"]
