"""Weight-sync flags, parsed once into a frozen dataclass.

    add_options(parser, WeightSyncConfig, "weight sync (trainer -> SGLang engines)")
    cfg = read_options(WeightSyncConfig, args, colocate=run.colocate, device=layout.device,
                       trainer_nodes=layout.num_nodes, on_cluster=layout.on_cluster)   # derived at start-up

`--weight-sync-transport auto` resolves in WeightSyncConfig.derive_fields, once: disaggregated -> `distributed` (as slime);
colocated -> `tensor` where it can serve every engine, else `disk`. On CPU `tensor` is an inline payload
that reaches any engine. On GPU it is CUDA IPC, which serves an engine only when the engine's server
sees the GPU of every stage lead (ipc_map.py: one colocated engine holding the leads' GPUs); and a
colocated engine must never share a NCCL group with the trainer rank on its own GPU ("Duplicate GPU
detected" at the first broadcast, review C5), so on GPU `distributed` with --colocate is refused and
`auto` falls back to `disk`, not to `distributed`. The disk transport on a cluster needs a directory
every node shares.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lean_rl.backends.sglang.lora import ServedAdapter
from lean_rl.options import ConfigError, option

if TYPE_CHECKING:
    from lean_rl.backends.megatron.lora_config import LoraConfig

TRANSPORTS = ("distributed", "tensor", "disk", "adapter")  # adapter: chosen by --lora-sync, not by the flag
TRANSPORT_CHOICES = ("auto", "distributed", "tensor", "disk")
LORA_SYNC_CHOICES = ("auto", "adapter", "merged")
logger = logging.getLogger(__name__)

DEFAULT_BUFFER_SIZE_BYTES = 512 * 1024**2  # slime's default --update-weight-buffer-size
# The probe's default tolerance per dtype of a forward pass, on the statistic probe_statistic picks,
# calibrated on this CPU with tools/probe_calibration.py (its docstring has the figures). Both sides
# float32: engine and trainer agree to < 1e-5, so a max of 1e-3 trips only on a real difference.
# Either side 16-bit: correct weights already reach a max of 0.74 (bfloat16, SmolLM2-135M) while one
# zeroed late layer gives 0.79, so the max cannot tell them apart; the mean can: correct bfloat16
# <= 0.059, float16 <= 0.006, the mildest broken layer tried >= 0.17. Not calibrated on GPU kernels:
# --weight-sync-probe-tol overrides it.
DEFAULT_PROBE_TOL = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.05}
# float32 on a GPU is not the exact float32 of the CPU calibration: TransformerEngine's and cuBLAS's
# float32 GEMMs default to TF32 (a 10-bit mantissa, float16's), so a float32 forward there is judged
# like a float16 one: on the mean, with float16's bound (review 2026-12-06 N1).
GPU_FLOAT32_AS = "float16"


def compute_dtype(dtype: str, device: str) -> str:
    """The dtype whose rounding a forward pass in `dtype` on `device` has (TF32 on GPU counts as float16)."""
    return GPU_FLOAT32_AS if device == "cuda" and dtype == "float32" else dtype


def probe_statistic(trainer_dtype: str, engine_dtype: str, device: str = "cpu") -> str:
    """What the probe's tolerance bounds: the max |Δ log p| over the probe's tokens when both sides
    compute in exact float32 (CPU), the mean |Δ log p| when either is 16-bit or on a GPU (TF32; see
    DEFAULT_PROBE_TOL)."""
    exact = {compute_dtype(trainer_dtype, device), compute_dtype(engine_dtype, device)} == {"float32"}
    return "max" if exact else "mean"


@dataclass(frozen=True)
class WeightSyncConfig:
    transport: str = option(  # resolved by derive_fields: distributed | tensor | disk
        "auto", flag="--weight-sync-transport", choices=TRANSPORT_CHOICES,
        help="tensor: colocated (CUDA IPC on GPU, an inline payload on CPU); distributed: a process group with "
             "the engines (NCCL on GPU, gloo on CPU); disk: safetensors + /update_weights_from_disk. auto: "
             "distributed; with --colocate tensor, on GPU only where CUDA IPC reaches every engine, else disk")
    buffer_size_bytes: int = option(DEFAULT_BUFFER_SIZE_BYTES, flag="--update-weight-buffer-size",
                                    help="bytes of HF tensors per bucket sent to the engines in one call")
    probe_tol: float | None = option(  # None: DEFAULT_PROBE_TOL for the dtype the trainer sends
        None, flag="--weight-sync-probe-tol",
        help="largest |Δ log p| allowed between trainer and engine on the probe sequence after a sync: the max "
             "over its tokens when both compute in float32 on CPU (default 1e-3), the mean when either is 16-bit or "
             "on GPU, whose float32 GEMMs run in TF32 (default as float16) "
             "(default 0.1 for bfloat16, 0.05 for float16: 16-bit rounding alone moves single tokens by up to ~0.7)")
    disk_dir: str | None = option(  # disk transport; None: a temporary directory per WeightSync
        None, flag="--weight-sync-disk-dir",
        help="directory for the disk transport (reachable by every engine; default: a temporary directory)")
    timeout_s: float = option(  # one bucket, one engine call, one process-group rendezvous
        600.0, flag="--weight-sync-timeout", help="seconds allowed for one bucket / one engine call during a sync")
    # derived (--colocate): engines share the trainer's devices (GPU: release memory while training)
    colocate: bool = False
    # derived (the trainer's layout): its device and whether the run is on a Ray cluster
    device: str = "cpu"
    on_cluster: bool = False
    lora_sync: str = option(
        "auto", flag="--lora-sync", choices=LORA_SYNC_CHOICES,
        help="with --lora-rank: adapter: the engines serve their base with the LoRA adapter loaded apart (SGLang's "
             "LoRA support) and each sync sends only the adapters' A and B; merged: each sync sends every weight, "
             "W + alpha/rank B A merged (as many bytes as full fine-tuning). auto: adapter, unless the run needs "
             "merged (a MoE model; --async-mode full), which the log says at start-up")
    # derived (ipc_map.unserved_by_ipc, colocated on GPU): why CUDA IPC cannot serve every engine, or None
    ipc_unserved: str | None = None
    # derived (config.parse_config, from --lora-sync): the adapter the engines serve; its transport is
    # `adapter` whatever --weight-sync-transport says (that flag picks how full weights travel)
    adapter: ServedAdapter | None = None

    @staticmethod
    def derive_fields(values: dict[str, Any]) -> dict[str, Any]:
        """--weight-sync-transport (auto included) resolved to the transport this run uses (options.build)."""
        v = dict(values)
        v["transport"] = "adapter" if v["adapter"] is not None else resolve_transport(
            v["transport"], v["colocate"], v["device"], v["ipc_unserved"], v["on_cluster"], v["disk_dir"])
        return v

    def __post_init__(self) -> None:
        if not isinstance(self.buffer_size_bytes, int) or self.buffer_size_bytes < 1:
            raise ConfigError(f"--update-weight-buffer-size must be a positive number of bytes, "
                              f"got {self.buffer_size_bytes!r}")
        if self.probe_tol is not None and not self.probe_tol > 0:
            raise ConfigError(f"--weight-sync-probe-tol must be > 0, got {self.probe_tol}")
        if not self.timeout_s > 0:
            raise ConfigError(f"--weight-sync-timeout must be > 0 seconds, got {self.timeout_s}")

    def probe_tolerance(self, trainer_dtype: str, engine_dtype: str) -> float:
        """The probe threshold when the trainer computes in `trainer_dtype` and the engines in
        `engine_dtype` ("float32", "bfloat16", "float16"): --weight-sync-probe-tol, else the looser of
        the two dtypes' calibrated defaults (DEFAULT_PROBE_TOL)."""
        if self.probe_tol is not None:
            return self.probe_tol
        for dtype in (trainer_dtype, engine_dtype):
            if dtype not in DEFAULT_PROBE_TOL:
                raise ConfigError(f"--weight-sync-probe-tol: no default for a forward pass in {dtype}; set it")
        return max(DEFAULT_PROBE_TOL[compute_dtype(trainer_dtype, self.device)],
                   DEFAULT_PROBE_TOL[compute_dtype(engine_dtype, self.device)])


def resolve_transport(requested: str, colocate: bool, device: str = "cpu", ipc_unserved: str | None = None,
                      on_cluster: bool = False, disk_dir: str | None = None) -> str:
    """The transport for --weight-sync-transport `requested` (see the module docstring); the name of
    one class in transports/ (transports.transport_for). `ipc_unserved`: on GPU, why CUDA IPC cannot
    reach every engine (None: it can). The only place that compares transport names."""
    if requested not in TRANSPORT_CHOICES:
        raise ConfigError(f"--weight-sync-transport: expected one of {', '.join(TRANSPORT_CHOICES)}, "
                          f"got {requested!r}")
    if device == "cuda":
        if requested == "tensor" and not colocate:
            raise ConfigError("--weight-sync-transport tensor (CUDA IPC) needs --colocate: an engine on GPUs of its "
                              "own cannot open memory of the trainer's GPUs; use distributed (the default) or disk")
        if requested == "tensor" and ipc_unserved:
            raise ConfigError(f"--weight-sync-transport tensor (CUDA IPC) cannot reach every engine: {ipc_unserved}; "
                              "use disk (auto picks it), or one engine over the GPUs of every pipeline stage's lead")
        if requested == "distributed" and colocate:
            raise ConfigError("--weight-sync-transport distributed with --colocate on GPU would put an engine and the "
                              "trainer rank on the same GPU into one NCCL group, which NCCL refuses; use tensor or "
                              "disk (auto picks one)")
    if requested != "auto":
        resolved = requested
    elif not colocate:
        resolved = "distributed"
    else:  # on CPU tensor reaches any engine; on GPU never distributed (C5)
        resolved = "disk" if device == "cuda" and ipc_unserved else "tensor"
    if on_cluster and resolved == "disk" and not disk_dir:
        # the trainer's stage leads write the files on their nodes and each engine reads them on its own
        raise ConfigError("--weight-sync-transport disk on a Ray cluster (--ray-address) needs "
                          "--weight-sync-disk-dir: a directory on a filesystem every node shares")
    return resolved


def resolve_lora_sync(lora_sync: str, lora: LoraConfig, is_moe: bool, async_mode: str,
                      unserved_family: str | None = None) -> ServedAdapter | None:
    """--lora-sync resolved: the LoRA adapter the engines serve apart from their base, or None (they get
    merged weights); one log line says which, and why when it is merged. `unserved_family`: why the
    model's HF modules are not the adapter's (hf_weights.families.lora_hf_modules_differ), if so."""
    if not lora.enabled:
        if lora_sync == "adapter":
            raise ConfigError("--lora-sync adapter needs --lora-rank > 0: there is no adapter to sync")
        return None
    why_merged = unserved_family
    if is_moe:
        why_merged = "a MoE model (SGLang's LoRA beside MoE layers is not checked here)"
    elif async_mode == "full":
        why_merged = ("--async-mode full (requests held in the engines across a sync's pause keep the adapter in "
                      "use, and SGLang unloads an adapter only once no request holds it)")
    if lora_sync == "adapter" and why_merged:
        raise ConfigError(f"--lora-sync adapter cannot serve {why_merged}; use --lora-sync merged")
    if lora_sync == "merged" or why_merged:
        logger.info("LoRA sync: merged weights, every weight each sync: %s", why_merged or "--lora-sync merged")
        return None
    adapter = ServedAdapter(lora.lora_rank, lora.alpha, lora.hf_modules)
    logger.info("LoRA sync: the adapters only (rank %d, %s); the engines serve their base with it as %r",
                adapter.rank, " ".join(adapter.target_modules), adapter.name)
    return adapter
