"""Starting (or joining) Ray the same way everywhere."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def shutdown_ray() -> None:
    """The end of a Ray this process started (init_ray returned True)."""
    import ray

    ray.shutdown()


def init_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Join the cluster at `address` (--ray-address), or start a local Ray of this process's own.
    Returns True when this call started Ray (so the caller knows to shut it down).

    A local Ray cannot be confined to loopback: Ray rewrites a loopback node address to the routed one
    (ray/_private/services.py resolve_ip_for_localhost) and its GCS, raylet and agents listen on all
    interfaces whatever the node address; Ray 2.60 guards them with its token auth, on by default.
    lean_rl's own services (engines, router, rendezvous) bind loopback on one node (utils.net)."""
    import ray

    if ray.is_initialized():
        return False
    if (warning := ray_auth_warning(os.environ)) is not None:
        logger.warning("%s", warning)
    if address:
        check_ray_address_reachable(address)
        _use_token_auth_if_available()
        try:
            ray.init(address=address, log_to_driver=True, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise ConnectionError(f"--ray-address {address}: cannot connect to Ray ({err})") from err
        return True
    # address="local": a Ray of our own, always. Without it ray.init joins whatever $RAY_ADDRESS or
    # <ray temp dir>/ray_current_cluster names (ray/_private/services.py get_ray_address_from_environment),
    # e.g. a cluster that died without `ray stop`: minutes of "Failed to connect to GCS", then a ValueError.
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=True,
             configure_logging=False)
    return True


def ray_auth_warning(environ) -> str | None:
    """What to tell the user when Ray's token auth is off: every process that reaches a Ray port of this
    cluster (GCS, raylet, dashboard: they listen on all interfaces) can then run code as this user."""
    if environ.get("RAY_AUTH_MODE", "").strip().lower() != "disabled":
        return None
    return ("RAY_AUTH_MODE=disabled: Ray's ports (GCS, raylet, dashboard, on every interface) accept anyone who "
            "reaches them, who can then run code as this user; leave it unset (token auth) unless the network is "
            "trusted")


def check_ray_address_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Fail fast on an unreachable --ray-address: ray.init itself retries for minutes (seen: > 5 min
    on Ray 2.60) before giving up. 'auto' and 'local' are Ray's own keywords and pass through."""
    import socket

    if address in ("auto", "local"):
        return
    host_port = address.removeprefix("ray://").rsplit("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--ray-address {address!r}: expected HOST:PORT (or ray://HOST:PORT, auto, local)")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        raise ConnectionError(f"--ray-address {address}: nothing answers at {host}:{port} ({err}); "
                              "is the Ray head running (`ray start --head`)?") from None


def _use_token_auth_if_available() -> None:
    """Ray 2.60 turns token auth on for every cluster that `ray start` makes (token in
    ~/.ray/auth_token), but a driver that names the address never turns it on by itself
    (ray/_private/worker.py:1972-1976: "an explicit address never does"), so it is refused
    (InvalidAuthToken) unless RAY_AUTH_MODE=token is in its environment. Do what the user would:
    with no RAY_AUTH_MODE set and a token on this machine, use it (RAY_AUTH_MODE=disabled opts out).
    Config.initialize re-reads the environment, as Ray's own _enable_token_auth does
    (ray/_private/authentication/authentication_token_setup.py:64)."""
    import os
    from pathlib import Path

    if os.environ.get("RAY_AUTH_MODE") is not None:
        return
    token = os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or \
        (Path.home() / ".ray" / "auth_token").is_file()
    if token:
        from ray._raylet import Config

        os.environ["RAY_AUTH_MODE"] = "token"
        Config.initialize("")
