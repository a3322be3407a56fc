"""How a call to an SGLang server fails (EngineError and its three kinds, each naming the server and the
endpoint), and which failures are retried: connection failures only (the request never reached the
server, so a retry cannot run it twice), with RetryPolicy's bounded exponential backoff."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


class EngineError(RuntimeError):
    """A call to an SGLang server failed; `url` and `endpoint` say which."""

    def __init__(self, url: str, endpoint: str, message: str):
        super().__init__(f"{url}{endpoint}: {message}")
        self.url, self.endpoint = url, endpoint


class EngineConnectionError(EngineError):
    """Could not reach the server (after the retries)."""


class EngineTimeoutError(EngineError):
    """The server took longer than the call's timeout."""


class EngineHTTPError(EngineError):
    """The server answered with an error status, or `success: false`."""

    def __init__(self, url: str, endpoint: str, status_code: int, server_message: str):
        super().__init__(url, endpoint, f"HTTP {status_code}: {server_message}")
        self.status_code, self.server_message = status_code, server_message


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of connection failures: `attempts` tries in all, with exponential backoff between them."""

    attempts: int = 5
    initial_backoff_s: float = 0.25
    max_backoff_s: float = 4.0
    multiplier: float = 2.0

    def __post_init__(self):
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")

    def backoffs(self) -> Iterator[float]:
        """The sleeps between attempts (attempts - 1 of them)."""
        delay = self.initial_backoff_s
        for _ in range(self.attempts - 1):
            yield min(delay, self.max_backoff_s)
            delay *= self.multiplier
