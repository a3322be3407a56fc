"""The check that ends every sync: did the weights really arrive?

A fixed token sequence (a prompt and a fixed continuation, from the served model's tokenizer) is
scored by the trainer (MegatronGroup.compute_log_probs) and by every engine (EngineClient.score:
one forward pass, log-prob of every token after the first). An engine whose |Δ log p| exceeds the
tolerance, or whose weight_version is not the step, fails the sync with WeightSyncProbeError. The
statistic judged follows the dtypes (config.probe_statistic): the max over the tokens when both sides
compute in float32, the mean when either is 16-bit, whose rounding alone moves single tokens as much
as a broken layer does.

Naming the tensor: the probe only sees log-probs, so on a failure the engine's per-parameter hashes
(/weights_checker, SGLang's names, e.g. the fused qkv_proj) are compared with the same hashes of the
trainer's tensors (engine_params.py). The error lists the parameters whose bytes differ, with the HF
tensors they are built from; if none differ, the weights arrived bit-exact and the error says the gap
is in the forward pass. This needs engines with TP 1 (per-rank shards are not reproduced).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.weight_sync.engine_calls import submit_all, wait_all
from lean_rl.weight_sync.engine_params import compare_checksums
from lean_rl.weight_sync.errors import WeightSyncProbeError

# Plain text (no chat markup), so that any tokenizer splits it the same way every time.
PROBE_PROMPT = "Question: what is 12 + 30? Answer:"
PROBE_CONTINUATION = " 12 + 30 = 42, so the answer is \\boxed{42}. The cat sat on the mat, why not?"
MAX_LISTED_TENSORS = 8


def probe_token_ids(tokenizer_path: str) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    prompt = tokenizer.encode(PROBE_PROMPT, add_special_tokens=False)
    continuation = tokenizer.encode(PROBE_CONTINUATION, add_special_tokens=False)
    ids = prompt + continuation
    if len(ids) < 8:
        raise ValueError(f"the probe text is only {len(ids)} tokens with the tokenizer at {tokenizer_path}")
    return ids


@dataclass(frozen=True)
class EngineProbe:
    url: str
    max_abs_diff: float
    mean_abs_diff: float
    weight_version: str | None

    def diff(self, statistic: str) -> float:
        return self.max_abs_diff if statistic == "max" else self.mean_abs_diff


@dataclass(frozen=True)
class ProbeResult:
    version: str
    tolerance: float
    num_tokens: int  # scored tokens per engine
    engines: tuple[EngineProbe, ...]
    statistic: str = "max"  # what the tolerance bounds: "max" or "mean" |Δ log p| (config.probe_statistic)
    image_tokens: int = 0  # vision tokens in the probe's prompt (image_probe.py); 0: the text probe

    @property
    def max_abs_diff(self) -> float:
        return max(e.max_abs_diff for e in self.engines)

    @property
    def mean_abs_diff(self) -> float:
        return max(e.mean_abs_diff for e in self.engines)

    def within(self, engine: EngineProbe) -> bool:
        return engine.diff(self.statistic) <= self.tolerance  # NaN is not

    def failures(self) -> list[EngineProbe]:
        return [e for e in self.engines if e.weight_version != self.version or not self.within(e)]


def submit_probe(clients: Sequence, token_ids: list[int], timeout_s: float, image_probe=None) -> list:
    """The engines' half of the probe, posted to every engine at once; run_probe(calls=...) waits.
    `image_probe`: an ImageProbe (image_probe.py) scored instead of `token_ids`."""
    if image_probe is None:
        return submit_all(clients, EngineClient.score, token_ids, timeout_s=timeout_s)
    from lean_rl.weight_sync.image_probe import score_image_probe

    return submit_all(clients, score_image_probe, image_probe, timeout_s=timeout_s)


def run_probe(trainer_log_probs: torch.Tensor, clients: Sequence, token_ids: list[int], version: str,
              tolerance: float, timeout_s: float, statistic: str = "max", image_probe=None,
              calls: list | None = None) -> ProbeResult:
    """Score the probe on every engine (concurrently; `calls`: already posted by submit_probe, e.g.
    while the trainer scored) and compare with the trainer's log-probs of the same tokens
    (MegatronGroup.compute_log_probs); no judgement yet."""
    if calls is None:
        calls = submit_probe(clients, token_ids, timeout_s, image_probe)
    trainer = trainer_log_probs.double()
    engines = []
    for (url, _), scored in zip(calls, wait_all(calls, timeout_s, "probe /generate")):
        engine = torch.tensor(scored.log_probs, dtype=torch.float64)
        if engine.shape != trainer.shape:
            raise WeightSyncProbeError(f"probe: {url} scored {engine.numel()} tokens, the trainer {trainer.numel()}",
                                       engine_url=url, max_abs_diff=None, tensors=None)
        delta = (engine - trainer).abs()
        engines.append(EngineProbe(url, float(delta.max()), float(delta.mean()), scored.weight_version))
    return ProbeResult(version=version, tolerance=tolerance, num_tokens=trainer.numel(), engines=tuple(engines),
                       statistic=statistic, image_tokens=image_probe.image_tokens if image_probe is not None else 0)


def raise_on_failure(result: ProbeResult, clients: Sequence, engine_tp_sizes: Sequence[int],
                     trainer_checksums: Callable[[], tuple[dict[str, str], dict[str, list[str]]]] | None,
                     timeout_s: float, dtypes: tuple[str, str] | None = None, unnamed_why: str | None = None) -> None:
    """WeightSyncProbeError for the first failing engine, naming the tensors that differ (not when
    `trainer_checksums` is None: then `unnamed_why` says why none can be named). `dtypes`:
    (the trainer's, the engines') compute dtypes; the checksums hash the weights as sent, in the
    engines' dtype, so a gap that only precision explains is named as such."""
    failures = result.failures()
    if not failures:
        return
    failures.sort(key=result.within)  # wrong weights before wrong versions
    failed = failures[0]
    others = f" (also failing: {', '.join(f.url for f in failures[1:])})" if len(failures) > 1 else ""
    if result.within(failed):  # the weights are right, the version is not
        raise WeightSyncProbeError(
            f"weight sync to version {result.version}: engine {failed.url} reports weight_version "
            f"{failed.weight_version!r}{others}", engine_url=failed.url, max_abs_diff=failed.max_abs_diff, tensors=None)
    index = [c.base_url for c in clients].index(failed.url)
    version_note = ("" if failed.weight_version == result.version
                    else f" (and it reports weight_version {failed.weight_version!r})")
    headline = (f"weight sync to version {result.version}: engine {failed.url} disagrees with the trainer on "
                f"the probe sequence{' (with an image)' if result.image_tokens else ''}: {result.statistic} |Δ log p| {failed.diff(result.statistic):.3g} > tolerance "
                f"{result.tolerance:.3g} over {result.num_tokens} tokens (max {failed.max_abs_diff:.3g}, mean "
                f"{failed.mean_abs_diff:.3g}){version_note}{others}")
    if trainer_checksums is None:  # the adapter transport, or an offloaded trainer: no bytes to compare
        why = unnamed_why or "the trainer's tensors cannot be hashed now, so no tensor can be named"
        raise WeightSyncProbeError(f"{headline}; {why}", engine_url=failed.url, max_abs_diff=failed.max_abs_diff,
                                   tensors=None)
    if engine_tp_sizes[index] != 1:
        raise WeightSyncProbeError(f"{headline}; the differing tensor cannot be named for an engine with TP "
                                   f"{engine_tp_sizes[index]} (hashes are per shard)",
                                   engine_url=failed.url, max_abs_diff=failed.max_abs_diff, tensors=None)
    expected, sources = trainer_checksums()
    engine = wait_all(submit_all([clients[index]], EngineClient.weight_checksums, timeout_s=timeout_s), timeout_s,
                      "weights_checker")[0][0]
    diff = compare_checksums(expected, engine)
    if diff.differing:
        listed = ", ".join(_describe(name, sources) for name in diff.differing[:MAX_LISTED_TENSORS])
        extra = len(diff.differing) - MAX_LISTED_TENSORS
        more = f" and {extra} more" if extra > 0 else ""
        detail = f"tensors whose bytes differ from the trainer's: {listed}{more}"
    elif diff.missing_on_engine:
        missing = ", ".join(diff.missing_on_engine[:MAX_LISTED_TENSORS])
        detail = f"the engine lacks parameters the trainer sends: {missing}"
    elif dtypes is not None and dtypes[0] != dtypes[1]:
        detail = (f"all {diff.compared} parameters arrived bit-exact (in the engine's {dtypes[1]}), but the dtype "
                  f"differs: the trainer computes in {dtypes[0]}, the engine in {dtypes[1]}, and that precision gap "
                  f"is the difference (serve and train in one dtype: --sglang-dtype {dtypes[0]}, or --bf16 / --fp16 "
                  "for the trainer; or raise --weight-sync-probe-tol)")
    else:
        detail = (f"all {diff.compared} parameters match the trainer's bytes: the weights arrived and the gap "
                  "comes from the forward pass (raise --weight-sync-probe-tol if it is expected)")
    raise WeightSyncProbeError(f"{headline}; {detail}", engine_url=failed.url, max_abs_diff=failed.max_abs_diff,
                               tensors=list(diff.differing))


def _describe(engine_name: str, sources: dict[str, list[str]]) -> str:
    parts = sources.get(engine_name, [])
    if parts == [engine_name] or not parts:
        return engine_name
    if len(parts) > 3:
        return f"{engine_name} (from {parts[0]} ... {parts[-1]}, {len(parts)} HF tensors)"
    return f"{engine_name} (from {', '.join(parts)})"
