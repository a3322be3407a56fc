"""Weight sync from the Megatron trainer to the SGLang engines (sync.py has the overview)."""

from lean_rl.weight_sync.config import (WeightSyncConfig, add_weight_sync_args, resolve_transport,
                                        weight_sync_config_from_args)
from lean_rl.weight_sync.errors import WeightSyncError, WeightSyncProbeError
from lean_rl.weight_sync.probe import ProbeResult
from lean_rl.weight_sync.sync import SyncReport, WeightSync

__all__ = ["WeightSync", "WeightSyncConfig", "SyncReport", "ProbeResult", "WeightSyncError", "WeightSyncProbeError",
           "add_weight_sync_args", "weight_sync_config_from_args", "resolve_transport"]
