"""EngineHTTP's connection pools (lean_rl/backends/sglang/engine_http.py): the limits split among the
pools, requests taken round-robin, new pools on a new event loop, all of them closed. No server: a pool
opens no connection before a request."""

from __future__ import annotations

import asyncio

import pytest

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.engine_http import pool_limits


def test_the_limits_are_split_among_the_pools_with_nothing_lost():
    limits = pool_limits(4096, 256, 8)
    assert [(x.max_connections, x.max_keepalive_connections) for x in limits] == [(512, 32)] * 8
    uneven = pool_limits(10, 5, 4)
    assert [(x.max_connections, x.max_keepalive_connections) for x in uneven] == [(3, 2), (3, 1), (2, 1), (2, 1)]
    assert sum(x.max_connections for x in uneven) == 10
    # fewer idle connections allowed than pools: each pool still keeps one
    assert [x.max_keepalive_connections for x in pool_limits(8, 2, 4)] == [1, 1, 1, 1]
    assert [(x.max_connections, x.max_keepalive_connections) for x in pool_limits(3, 2, 1)] == [(3, 2)]


def test_pools_that_cannot_hold_a_connection_each_are_refused():
    with pytest.raises(ValueError, match="3 connections cannot be shared by 4 pools"):
        pool_limits(3, 2, 4)
    with pytest.raises(ValueError, match="cannot be shared by 0 pools"):
        pool_limits(3, 2, 0)


def test_requests_take_the_pools_in_turn_and_a_new_loop_gets_new_pools():
    client = EngineClient("http://127.0.0.1:9")

    async def turns() -> list:
        taken = [client._client() for _ in range(2 * EngineClient.pool_shards)]
        pools = client._pools
        await client.aclose()
        assert all(pool.is_closed for pool in pools) and client._pools == ()
        return taken

    first = asyncio.run(turns())
    assert len({id(p) for p in first}) == EngineClient.pool_shards == 8
    assert first[:8] == first[8:]  # round-robin: each pool once per turn
    second = asyncio.run(turns())
    assert not {id(p) for p in first} & {id(p) for p in second}


def test_idle_connections_are_given_up_before_sglangs_server_closes_them():
    # SGLang's uvicorn closes a connection idle for SGLANG_TIMEOUT_KEEP_ALIVE seconds; a request sent on one
    # it is closing that instant fails mid-request (a weight sync's /end_weight_update did, in a bench run)
    from sglang.srt.environ import envs

    server_closes_after = envs.SGLANG_TIMEOUT_KEEP_ALIVE.get()
    assert all(limits.keepalive_expiry < server_closes_after for limits in pool_limits(4096, 256, 8))
