"""How a call on the trainer's ranks fails: MegatronGroupError (a call failed or timed out on some rank; the
group is shut down), and PlacementError, its kind for nodes that cannot be reserved now (a heal waits
those out: trainer_heal.py)."""

from __future__ import annotations


class MegatronGroupError(RuntimeError):
    """A call failed or timed out on some rank; the group has been shut down."""


class PlacementError(MegatronGroupError):
    """The trainer's nodes cannot be reserved now (too few alive, or their resources held)."""
