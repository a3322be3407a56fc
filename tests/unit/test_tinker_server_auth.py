"""lean_rl/tinker/server.py without a trainer: the key check, the client config, refusals."""

import pytest
from fastapi.testclient import TestClient

from lean_rl.tinker.server import CLIENT_CONFIG, create_app, key_ok


@pytest.fixture
def client():
    return TestClient(create_app(None, "tml-secret"))


def test_a_missing_or_wrong_key_is_refused_and_healthz_is_open(client):
    assert client.post("/api/v1/client/config", json={}).status_code == 401
    assert client.post("/api/v1/client/config", json={}, headers={"X-API-Key": "tml-other"}).status_code == 401
    assert client.get("/api/v1/healthz").json() == {"status": "ok"}
    answer = client.post("/api/v1/client/config", json={}, headers={"X-API-Key": "tml-secret"})
    assert answer.status_code == 200 and answer.json() == CLIENT_CONFIG


def test_an_unsupported_call_answers_not_supported(client):
    answer = client.post("/api/v1/unload_model", json={}, headers={"X-API-Key": "tml-secret"})
    assert answer.status_code == 404
    assert "not supported by lean_rl's Tinker server: unloading models" in answer.json()["detail"]


def test_key_comparison_and_key_format():
    assert key_ok("tml-a", "tml-a") and not key_ok("tml-b", "tml-a") and not key_ok(None, "tml-a")
    with pytest.raises(ValueError, match="must start with 'tml-'"):
        create_app(None, "secret")
