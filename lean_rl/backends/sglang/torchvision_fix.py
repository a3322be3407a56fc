"""Make PyPI's CUDA-linked torchvision importable beside the CPU build of torch.

Why: SGLang imports torchvision at config-import time (sglang/srt/configs/deepseek_ocr.py:7, pulled in
by sglang/srt/configs/__init__.py) and transformers imports it from modeling_utils when it is installed;
PyPI has no CPU torchvision for torch 2.13, and the CUDA one dies on import because its _C.so cannot
load and torchvision/_meta_registrations.py:163 then registers a fake kernel for an operator that was
never defined ("operator torchvision::nms does not exist"). Defining the two schemas it needs, only
when the real C ops cannot load, lets it import; the detection ops themselves stay unavailable.

Installed by scripts/setup.sh on CPU machines as a .pth line in the project's own .venv, so that every
Python in that venv (SGLang's spawned workers, transformers scripts, tests) gets it. Importing this
module is cheap: torch is imported only when something imports torchvision.

This is the project's one implicitly applied patch (every other compat fix is a function its caller
applies: backends/sglang/compat.py, backends/megatron/compat.py). It stays a .pth because the
imports it must precede are not ours to order: `from transformers import AutoModelForCausalLM`
fails without it ("operator torchvision::nms does not exist"), and that runs in test fixtures,
subprocesses of tests, Ray worker processes, users' own scripts and tools in the venv, not only at
lean_rl's entry points. An explicit import at our entry points (the SGLang launcher does one:
compat.load_torchvision_fix, for venvs without the .pth) could not cover those. It only adds a
meta-path finder that fires once, right before the first `import torchvision`, and does nothing
when the real torchvision ops load (a matching torch build, i.e. the GPU flavour, which gets no .pth).
"""

import importlib.abc
import importlib.util
import sys
from pathlib import Path


def _define_missing_torchvision_ops() -> None:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return
    import torch

    package_dir = Path(list(spec.submodule_search_locations)[0])
    for shared_object in sorted(package_dir.glob("_C*.so")):
        try:
            torch.ops.load_library(str(shared_object))
            return  # the real ops load (matching torch build): defining them again would abort
        except (OSError, RuntimeError):
            continue
    lib = torch.library.Library("torchvision", "FRAGMENT")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP_ALIVE.append(lib)  # the schemas vanish when the Library object is collected


_KEEP_ALIVE: list = []


class _BeforeTorchvisionImport(importlib.abc.MetaPathFinder):
    """Fires once, right before the first `import torchvision`, then gets out of the way."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            _define_missing_torchvision_ops()
        return None  # the normal finders import the real package


def install() -> None:
    if "torchvision" in sys.modules:
        return
    if not any(isinstance(finder, _BeforeTorchvisionImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvisionImport())


install()
