"""The URLs an engine group's processes reported once they run, held beside its frozen EngineConfig."""

from __future__ import annotations


class LiveEndpoints:
    """The URLs an engine group's servers and router reported once they run (on a cluster each actor
    binds its node's address on a port free there). The group writes them (start, restart); whoever
    holds the run's EngineConfig reads them through engine_urls / router_url, so the config itself is
    never replaced after start-up. A copy sent to another process is a snapshot."""

    __slots__ = ("engine_urls", "router_url")

    def __init__(self) -> None:
        self.engine_urls: tuple[str, ...] = ()
        self.router_url: str | None = None

    def publish(self, engine_urls: tuple[str, ...] | list[str], router_url: str) -> None:
        self.engine_urls, self.router_url = tuple(engine_urls), router_url
