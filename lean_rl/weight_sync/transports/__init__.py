"""The weight-sync transports, one class each (base.py says what a transport is), and the resolver's
second half: config.resolve_transport turns --weight-sync-transport into a transport's name (auto
resolved, impossible combinations refused), transport_for turns that name into the class's driver
half. Nothing else compares a transport's name (tests/unit/test_weight_sync_transports.py holds it)."""

from __future__ import annotations

from lean_rl.weight_sync.errors import WeightSyncError
from lean_rl.weight_sync.transports.adapter import AdapterTransport
from lean_rl.weight_sync.transports.base import Transport
from lean_rl.weight_sync.transports.disk import DiskTransport
from lean_rl.weight_sync.transports.distributed import DistributedTransport
from lean_rl.weight_sync.transports.tensor import TensorTransport

# by name; the flag's choices (config.TRANSPORTS) are declared in the config layer, which imports no
# transport (no torch): a unit test holds the two in step
TRANSPORT_CLASSES: dict[str, type[Transport]] = {
    cls.name: cls for cls in (DistributedTransport, TensorTransport, DiskTransport, AdapterTransport)}


def transport_for(name: str) -> Transport:
    """The driver half of the transport `name` (a resolved WeightSyncConfig.transport)."""
    if name not in TRANSPORT_CLASSES:
        raise WeightSyncError(f"--weight-sync-transport: no transport {name!r} (known: "
                              f"{', '.join(TRANSPORT_CLASSES)}); resolve the flag with WeightSyncConfig first")
    return TRANSPORT_CLASSES[name]()
