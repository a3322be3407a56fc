"""`import slime.X` → lean_rl's compatibility module for X, when slime itself is not installed.

A meta-path finder placed last on sys.meta_path: a real slime (installed, or on PYTHONPATH) is found
by the ordinary finders first and always wins; install_slime_finder says which one a run uses."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys

logger = logging.getLogger(__name__)

# slime's module -> ours; None: a package that only holds the modules below it
MODULES: dict[str, str | None] = {
    "slime": None,
    "slime.utils": None,
    "slime.utils.types": "lean_rl.slime_compat.types",
    "slime.utils.http_utils": "lean_rl.slime_compat.http_utils",
    "slime.utils.misc": "lean_rl.slime_compat.misc",
    "slime.utils.async_utils": "lean_rl.slime_compat.async_utils",
    "slime.utils.processing_utils": "lean_rl.slime_compat.processing_utils",
    "slime.utils.ppo_utils": "lean_rl.slime_compat.ppo_utils",
    "slime.utils.mask_utils": "lean_rl.slime_compat.mask_utils",
    "slime.backends": None,
    "slime.backends.megatron_utils": None,
    "slime.backends.megatron_utils.loss": "lean_rl.slime_compat.megatron_loss",
    "slime.backends.megatron_utils.cp_utils": "lean_rl.slime_compat.cp_utils",
    "slime.rollout": None,
    "slime.rollout.base_types": "lean_rl.slime_compat.base_types",
    "slime.rollout.data_source": "lean_rl.slime_compat.data_source",
    "slime.rollout.sglang_rollout": "lean_rl.slime_compat.sglang_rollout",
    "slime.rollout.rm_hub": "lean_rl.slime_compat.rm_hub",
    "slime.rollout.rm_hub.math_utils": "lean_rl.slime_compat.rm_hub.math_utils",
    "slime.rollout.rm_hub.math_dapo_utils": "lean_rl.slime_compat.rm_hub.math_dapo_utils",
    "slime.rollout.rm_hub.f1": "lean_rl.slime_compat.rm_hub.f1",
    "slime.rollout.filter_hub": "lean_rl.slime_compat.filter_hub",
    "slime.rollout.filter_hub.base_types": "lean_rl.slime_compat.filter_hub.base_types",
    "slime.rollout.filter_hub.dynamic_sampling_filters": "lean_rl.slime_compat.filter_hub.dynamic_sampling_filters",
}
COMPAT_PREFIX = "lean_rl.slime_compat"


class _SlimeLoader(importlib.abc.Loader):
    """Loads slime.X as our module for X (the same module object, so `Sample` is one class whichever
    name imported it), or as an empty package."""

    def create_module(self, spec):
        target = MODULES[spec.name]
        return importlib.import_module(target) if target else None  # None: a fresh empty package

    def exec_module(self, module) -> None:
        pass  # ours ran when imported; a package stand-in holds only its submodules


class SlimeFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MODULES:
            return None  # a slime module lean_rl does not serve: the import fails as it would without slime
        is_package = MODULES[fullname] is None or fullname in ("slime.rollout.rm_hub", "slime.rollout.filter_hub")
        return importlib.machinery.ModuleSpec(fullname, _SlimeLoader(), is_package=is_package)


_installed: str | None = None  # "ours" or the real slime's path, once decided


def install_slime_finder() -> str:
    """Serve `slime.*` from lean_rl unless a real slime is importable (then leave it, and say so once).
    Returns "lean_rl" or the path of the real slime."""
    global _installed
    if _installed is not None:
        return _installed
    if any(isinstance(f, SlimeFinder) for f in sys.meta_path):
        _installed = "lean_rl"
        return _installed
    real = sys.modules.get("slime")
    spec = importlib.util.find_spec("slime") if real is None else getattr(real, "__spec__", None)
    if real is not None or spec is not None:
        _installed = str(getattr(spec, "origin", None) or getattr(real, "__file__", None) or "slime")
        logger.info("slime is installed (%s): user hooks importing slime.* get the real slime, not lean_rl's "
                    "compatibility modules", _installed)
        return _installed
    sys.meta_path.append(SlimeFinder())
    _installed = "lean_rl"
    return _installed
