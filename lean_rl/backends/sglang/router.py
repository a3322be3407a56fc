"""The worker API of sglang-router 0.3.2: list, add and remove the SGLang servers it routes to.

0.3.2 manages workers with `GET /workers`, `POST /workers {"url"}` (202, done in the background) and
`DELETE /workers/{id}` (202); the older `/add_worker`, `/remove_worker`, `/list_workers` answer 404.
Because add and remove are asynchronous, each call here waits (with a deadline) until the router's
worker list shows the change, so the caller can rely on routing right after it returns.
The router forwards /generate, /v1/*, /flush_cache; it does NOT forward /abort_request,
/pause_generation, /continue_generation or the weight-update endpoints: call the engines for those.
With the run's API key (EngineConfig.api_key) every call carries it, and each worker is added with
it: the router then sends it on its discovery calls to the worker (/server_info, /model_info), which
an SGLang server with a key refuses otherwise.
"""

from __future__ import annotations

import time

import httpx

from lean_rl.backends.sglang.listener_check import bearer_auth


class RouterError(RuntimeError):
    pass


class RouterAdmin:
    def __init__(self, router_url: str, timeout_s: float = 30.0, *, api_key: str | None = None):
        self.url = router_url.rstrip("/")
        self.timeout_s = timeout_s
        self._api_key = api_key  # the run's key (EngineConfig.api_key); None / "": no authentication

    def __repr__(self) -> str:
        return f"RouterAdmin({self.url!r})"

    def _call(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            # the key only to a router that proves to be the run's (listener_check.py)
            with httpx.Client(timeout=self.timeout_s, trust_env=False, auth=bearer_auth(self._api_key)) as http:
                response = http.request(method, self.url + path, **kwargs)
        except httpx.TransportError as exc:
            raise RouterError(f"router {self.url}{path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise RouterError(f"router {method} {self.url}{path} -> HTTP {response.status_code}: {response.text[:500]}")
        return response

    def workers(self) -> list[dict]:
        """The router's workers: dicts with at least `id`, `url`, `is_healthy`."""
        return self._call("GET", "/workers").json()["workers"]

    def worker_urls(self, healthy_only: bool = True) -> set[str]:
        return {w["url"] for w in self.workers() if w.get("is_healthy") or not healthy_only}

    def add_worker(self, url: str, timeout_s: float | None = None) -> None:
        """Add a server and wait until the router lists it as healthy."""
        url = url.rstrip("/")
        if url not in self.worker_urls(healthy_only=False):
            body = {"url": url, "api_key": self._api_key} if self._api_key else {"url": url}
            self._call("POST", "/workers", json=body)
        self._wait(lambda: url in self.worker_urls(), f"worker {url} to be added and healthy", timeout_s)

    def remove_worker(self, url: str, timeout_s: float | None = None) -> None:
        """Remove a server (no-op when absent) and wait until the router no longer lists it."""
        url = url.rstrip("/")
        for worker in self.workers():
            if worker["url"] == url:
                self._call("DELETE", f"/workers/{worker['id']}")
        self._wait(lambda: url not in self.worker_urls(healthy_only=False), f"worker {url} to be removed", timeout_s)

    def _wait(self, done, what: str, timeout_s: float | None) -> None:
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while not done():
            if time.monotonic() > deadline:
                raise RouterError(f"router {self.url}: timed out waiting for {what}; workers: {self.workers()}")
            time.sleep(0.2)
