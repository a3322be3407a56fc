"""SGLang 0.5.23 keeps a vision-language model's image embeddings across weight updates: turned off.

Why: the scheduler caches each image's vision-tower output by the image's hash
(sglang/srt/managers/mm_schedule.py:283 and :312 `embedding_cache.get` / `.set`, sized by
SGLANG_VLM_CACHE_SIZE_MB, sglang/srt/mem_cache/kv_cache_builder.py:479), and neither a weight update nor
/flush_cache clears it (sglang/srt/managers/scheduler.py:5518 `flush_cache` resets the KV and radix caches
only; the weight updaters call that, sglang/srt/managers/scheduler_components/weight_updater.py:120). After
a sync that moved the tower, every image the engine saw before is embedded by the OLD tower: rollouts
on repeated images (n samples of a prompt, the next epoch) come from a model that no longer exists. The
weight-sync probe on an image prompt (lean_rl/weight_sync/image_probe.py) found it: |Δ log p| 0.245
after the first step of a run whose tower trains, while every synced tensor matched the trainer's bytes.

A cache of 0 MB admits nothing (`MultiModalStaticCache.set` refuses an entry larger than its size,
sglang/srt/mem_cache/multimodal_cache.py:116) and SGLang uses the fresh embedding: each request encodes
its images again, the tower's cost per request. Set by environment so that it also reaches a scheduler
SGLang spawns (GPU); a value the user set is kept (the probe then fails loudly if it is stale).
"""

from __future__ import annotations

import os

CACHE_ENV = "SGLANG_VLM_CACHE_SIZE_MB"


def keep_no_image_embeddings(environ: dict | None = None) -> None:
    env = os.environ if environ is None else environ
    env.setdefault(CACHE_ENV, "0")
