"""What the run's services answer to someone who does not hold the key: every info route of SGLang
0.5.23's server and of sglang-router 0.3.2, asked without the key on the session's real services
(started with the run's key, conftest.py). None may return the key or another secret argument; the
table it prints is the one in docs/security.md."""

import json

import httpx
import pytest

pytestmark = pytest.mark.integration

# GET routes of sglang/srt/entrypoints/http_server.py (0.5.23) that describe the server, plus the
# standard probes; the router's (0.3.2, src/server.rs) on its main port
SERVER_ROUTES = ("/health", "/health_generate", "/ready", "/get_model_info", "/model_info", "/get_server_info",
                 "/server_info", "/v1/models", "/metrics", "/get_load", "/list_external_corpora",
                 "/get_hicache_l3_cache_layout", "/remote_instance_transfer_engine_info")
ROUTER_ROUTES = ("/health", "/health_generate", "/liveness", "/readiness", "/get_server_info", "/get_model_info",
                 "/v1/models", "/workers", "/list_workers", "/get_loads", "/engine_metrics", "/metrics")


def ask(base: str, route: str) -> httpx.Response:
    return httpx.get(base + route, timeout=60, trust_env=False)


@pytest.mark.parametrize("side, routes", [("engine", SERVER_ROUTES), ("router", ROUTER_ROUTES)])
def test_no_route_returns_the_key_or_a_secret_argument_without_the_key(engine_group, side, routes):
    key = engine_group.config.api_key
    base = engine_group.engine_urls[0] if side == "engine" else engine_group.router_url
    table = []
    for route in routes:
        reply = ask(base, route)
        body = reply.text
        assert key not in body, f"{side} {route} returned the API key"
        assert "api_key" not in body.lower() or reply.status_code in (401, 403), f"{side} {route}: {body[:300]}"
        table.append((route, reply.status_code, body[:120] if reply.status_code == 200 else len(body)))
    print(json.dumps({"side": side, "routes": table}))
    if side == "engine":  # every route that describes the server wants the key; only the probes answer
        assert {route for route, status, _ in table if status == 200} == {"/health", "/health_generate", "/ready"}
    else:  # the router answers its probes, counts, and the served model's name (no argument, no key)
        assert {route for route, status, _ in table if status == 200} <= {
            "/health", "/health_generate", "/liveness", "/readiness", "/get_server_info", "/v1/models"}, table
        assert {"/workers", "/get_loads"} <= {route for route, status, _ in table if status in (401, 403)}
