"""Weight-sync flags, parsed once into a frozen dataclass.

    add_options(parser, WeightSyncConfig, "weight sync (trainer -> SGLang engines)")
    cfg = read_options(WeightSyncConfig, args, colocate=run.colocate, device=layout.device,
                       trainer_nodes=layout.num_nodes, on_cluster=layout.on_cluster)   # derived at start-up

`--weight-sync-transport auto` resolves in __post_init__, once, the way slime chooses: colocated (train and
generate share the devices) -> `tensor`, disaggregated -> `distributed`; `disk` is always available.
Two rules of a cluster: CUDA IPC handles (tensor on GPU) are valid on their own node only, so colocated
trainer nodes > 1 on GPU go through the process group (auto) or refuse an explicit tensor; and the disk
transport needs a directory every node shares.
"""

from __future__ import annotations

from dataclasses import dataclass

from lean_rl.options import ConfigError, option

TRANSPORTS = ("distributed", "tensor", "disk")
TRANSPORT_CHOICES = ("auto", *TRANSPORTS)
DEFAULT_BUFFER_SIZE_BYTES = 512 * 1024**2  # slime's default --update-weight-buffer-size
# Probe tolerance on max |Δ log p| when --weight-sync-probe-tol is not given. float32: engine and
# trainer agree to ~5e-6 on this machine (DESIGN.md §4), so 1e-3 only trips on a real difference.
# 16-bit: kernels round differently; a wrong tensor still moves log-probs by O(1). Not calibrated on GPU.
DEFAULT_PROBE_TOL = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.1}


@dataclass(frozen=True)
class WeightSyncConfig:
    transport: str = option(  # resolved in __post_init__: distributed | tensor | disk
        "auto", flag="--weight-sync-transport", choices=TRANSPORT_CHOICES,
        help="tensor: colocated (CUDA IPC on GPU, an inline payload on CPU); distributed: a process group with "
             "the engines (NCCL on GPU, gloo on CPU); disk: safetensors + /update_weights_from_disk. auto: tensor "
             "with --colocate, else distributed")
    buffer_size_bytes: int = option(DEFAULT_BUFFER_SIZE_BYTES, flag="--update-weight-buffer-size",
                                    help="bytes of HF tensors per bucket sent to the engines in one call")
    probe_tol: float | None = option(  # None: DEFAULT_PROBE_TOL for the dtype the trainer sends
        None, flag="--weight-sync-probe-tol",
        help="largest max |Δ log p| allowed between trainer and engine on the probe sequence after a sync "
             "(default: 1e-3 for float32 weights, 0.1 for 16-bit)")
    disk_dir: str | None = option(  # disk transport; None: a temporary directory per WeightSync
        None, flag="--weight-sync-disk-dir",
        help="directory for the disk transport (reachable by every engine; default: a temporary directory)")
    timeout_s: float = option(  # one bucket, one engine call, one process-group rendezvous
        600.0, flag="--weight-sync-timeout", help="seconds allowed for one bucket / one engine call during a sync")
    # derived (--colocate): engines share the trainer's devices (GPU: release memory while training)
    colocate: bool = False
    # derived (the trainer's layout): its device, its number of nodes, and whether the run is on a Ray cluster
    device: str = "cpu"
    trainer_nodes: int = 1
    on_cluster: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "transport", resolve_transport(
            self.transport, self.colocate, ipc_across_nodes=self.device == "cuda" and self.trainer_nodes > 1))
        if self.on_cluster and self.transport == "disk" and not self.disk_dir:
            # the trainer's stage leads write the files on their nodes and each engine reads them on its own
            raise ConfigError("--weight-sync-transport disk on a Ray cluster (--ray-address) needs "
                              "--weight-sync-disk-dir: a directory on a filesystem every node shares")
        if not isinstance(self.buffer_size_bytes, int) or self.buffer_size_bytes < 1:
            raise ConfigError(f"--update-weight-buffer-size must be a positive number of bytes, "
                              f"got {self.buffer_size_bytes!r}")
        if self.probe_tol is not None and not self.probe_tol > 0:
            raise ConfigError(f"--weight-sync-probe-tol must be > 0, got {self.probe_tol}")
        if not self.timeout_s > 0:
            raise ConfigError(f"--weight-sync-timeout must be > 0 seconds, got {self.timeout_s}")

    def probe_tolerance(self, dtype: str) -> float:
        """The probe threshold for tensors sent as `dtype` ("float32", "bfloat16", ...)."""
        if self.probe_tol is not None:
            return self.probe_tol
        if dtype not in DEFAULT_PROBE_TOL:
            raise ConfigError(f"--weight-sync-probe-tol: no default for weights in {dtype}; set it")
        return DEFAULT_PROBE_TOL[dtype]


def resolve_transport(requested: str, colocate: bool, ipc_across_nodes: bool = False) -> str:
    """The transport for --weight-sync-transport `requested`. `ipc_across_nodes`: tensor would mean
    CUDA IPC between nodes (colocated on GPU over several trainer nodes), which cannot work."""
    if requested not in TRANSPORT_CHOICES:
        raise ConfigError(f"--weight-sync-transport: expected one of {', '.join(TRANSPORT_CHOICES)}, "
                          f"got {requested!r}")
    if requested == "tensor" and ipc_across_nodes:
        raise ConfigError("--weight-sync-transport tensor (CUDA IPC) works within one node; with several "
                          "trainer nodes (--actor-num-nodes) use distributed (the default) or disk")
    if requested == "auto":
        return "tensor" if colocate and not ipc_across_nodes else "distributed"
    return requested
