"""Weight-sync flags, parsed once into a frozen dataclass.

    group = add_weight_sync_args(parser)
    cfg = weight_sync_config_from_args(args, colocate=args.colocate)

`--weight-sync-transport auto` resolves here, once, the way slime chooses: colocated (train and
generate share the devices) -> `tensor`, disaggregated -> `distributed`; `disk` is always available.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

TRANSPORTS = ("distributed", "tensor", "disk")
TRANSPORT_CHOICES = ("auto", *TRANSPORTS)
DEFAULT_BUFFER_SIZE_BYTES = 512 * 1024**2  # slime's default --update-weight-buffer-size
# Probe tolerance on max |Δ log p| when --weight-sync-probe-tol is not given. float32: engine and
# trainer agree to ~5e-6 on this machine (DESIGN.md §4), so 1e-3 only trips on a real difference.
# 16-bit: kernels round differently; a wrong tensor still moves log-probs by O(1). Not calibrated on GPU.
DEFAULT_PROBE_TOL = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.1}


class WeightSyncConfigError(ValueError):
    """An invalid weight-sync flag; the message names it."""


@dataclass(frozen=True)
class WeightSyncConfig:
    transport: str  # resolved: distributed | tensor | disk
    buffer_size_bytes: int = DEFAULT_BUFFER_SIZE_BYTES
    probe_tol: float | None = None  # None: DEFAULT_PROBE_TOL for the dtype the trainer sends
    disk_dir: str | None = None  # disk transport; None: a temporary directory per WeightSync
    timeout_s: float = 600.0  # one bucket, one engine call, one process-group rendezvous
    colocate: bool = False  # engines share the trainer's devices (GPU: release memory while training)

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise WeightSyncConfigError(f"--weight-sync-transport: expected one of {', '.join(TRANSPORTS)} "
                                        f"after resolving 'auto', got {self.transport!r}")
        if not isinstance(self.buffer_size_bytes, int) or self.buffer_size_bytes < 1:
            raise WeightSyncConfigError(f"--update-weight-buffer-size must be a positive number of bytes, "
                                        f"got {self.buffer_size_bytes!r}")
        if self.probe_tol is not None and not self.probe_tol > 0:
            raise WeightSyncConfigError(f"--weight-sync-probe-tol must be > 0, got {self.probe_tol}")
        if not self.timeout_s > 0:
            raise WeightSyncConfigError(f"--weight-sync-timeout must be > 0 seconds, got {self.timeout_s}")

    def probe_tolerance(self, dtype: str) -> float:
        """The probe threshold for tensors sent as `dtype` ("float32", "bfloat16", ...)."""
        if self.probe_tol is not None:
            return self.probe_tol
        if dtype not in DEFAULT_PROBE_TOL:
            raise WeightSyncConfigError(f"--weight-sync-probe-tol: no default for weights in {dtype}; set it")
        return DEFAULT_PROBE_TOL[dtype]


def resolve_transport(requested: str, colocate: bool) -> str:
    if requested not in TRANSPORT_CHOICES:
        raise WeightSyncConfigError(f"--weight-sync-transport: expected one of {', '.join(TRANSPORT_CHOICES)}, "
                                    f"got {requested!r}")
    if requested == "auto":
        return "tensor" if colocate else "distributed"
    return requested


def add_weight_sync_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    group = parser.add_argument_group("weight sync (trainer -> SGLang engines)")
    group.add_argument("--weight-sync-transport", choices=TRANSPORT_CHOICES, default="auto",
                       help="tensor: colocated (CUDA IPC on GPU, an inline payload on CPU); distributed: a "
                            "process group with the engines (NCCL on GPU, gloo on CPU); disk: safetensors + "
                            "/update_weights_from_disk. auto: tensor with --colocate, else distributed")
    group.add_argument("--update-weight-buffer-size", type=int, default=DEFAULT_BUFFER_SIZE_BYTES,
                       help="bytes of HF tensors per bucket sent to the engines in one call")
    group.add_argument("--weight-sync-probe-tol", type=float, default=None,
                       help="largest max |Δ log p| allowed between trainer and engine on the probe sequence "
                            "after a sync (default: 1e-3 for float32 weights, 0.1 for 16-bit)")
    group.add_argument("--weight-sync-disk-dir", default=None,
                       help="directory for the disk transport (reachable by every engine; default: a "
                            "temporary directory)")
    group.add_argument("--weight-sync-timeout", type=float, default=600.0,
                       help="seconds allowed for one bucket / one engine call during a sync")
    return group


def weight_sync_config_from_args(args: argparse.Namespace, *, colocate: bool) -> WeightSyncConfig:
    return WeightSyncConfig(
        transport=resolve_transport(args.weight_sync_transport, colocate),
        buffer_size_bytes=args.update_weight_buffer_size,
        probe_tol=args.weight_sync_probe_tol,
        disk_dir=args.weight_sync_disk_dir,
        timeout_s=args.weight_sync_timeout,
        colocate=colocate,
    )
