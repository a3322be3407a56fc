"""Weight sync from the Megatron trainer to the SGLang engines (sync.py has the overview)."""

from lean_rl.weight_sync.config import WeightSyncConfig, resolve_transport
from lean_rl.weight_sync.errors import WeightSyncError, WeightSyncProbeError
from lean_rl.weight_sync.probe import ProbeResult
from lean_rl.weight_sync.sync import SyncReport, WeightSync

__all__ = ["WeightSync", "WeightSyncConfig", "SyncReport", "ProbeResult", "WeightSyncError", "WeightSyncProbeError",
           "resolve_transport"]
