"""Starting (or joining) Ray the same way everywhere."""

from __future__ import annotations


def init_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Join the cluster at `address` (--ray-address), or start a local Ray bound to loopback.
    Returns True when this call started Ray (so the caller knows to shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    if address:
        try:
            ray.init(address=address, log_to_driver=True, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise ConnectionError(f"--ray-address {address}: cannot connect to Ray ({err})") from err
        return True
    ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=True,
             configure_logging=False)
    return True
