"""slime.rollout.filter_hub.base_types: a dynamic filter's verdict."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DynamicFilterOutput:
    keep: bool
    reason: str | None = None
    # slime keeps a rejected group when dropping it would need another sampling round; lean_rl tops the
    # batch up continuously, so it drops the group (hooks.SlimeDynamicFilter)
    keep_when_insufficient: bool = False
