"""Check a model directory before spending half a minute starting SGLang on it.

Why before launch: SGLang's own failures here are late or unclear. A directory without tokenizer files
is not rejected at all; the server starts, tokenizes its warm-up prompt to nothing and dies inside the
rotary embedding ("cannot reshape tensor of 0 elements"). An unknown architecture dies in the
scheduler after ~20 s of imports. A missing directory is reported from deep inside transformers.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# Any one of these makes a loadable HF tokenizer (fast, sentencepiece, BPE, WordPiece, tiktoken).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tiktoken.model")


class ModelDirError(ValueError):
    """The model directory cannot be served; the message names the path and what is wrong."""


@dataclass(frozen=True)
class ModelDirInfo:
    path: Path
    architectures: tuple[str, ...]
    model_type: str
    vocab_size: int | None


@lru_cache(maxsize=1)
def sglang_native_architectures() -> frozenset[str]:
    """Architecture names SGLang implements, read from `EntryClass = ...` in sglang/srt/models/*.py.

    Parsing instead of importing: importing sglang's model registry imports ~260 modules (7 s here).
    The parsed set is a superset of the registry (a few modules do not import on CPU; those still fail
    at launch, with the server's log tail), so a name missing from it is really unsupported natively.
    """
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ModelDirError("sglang is not installed in this Python environment")
    models_dir = Path(list(spec.submodule_search_locations)[0]) / "srt" / "models"
    names: set[str] = set()
    for source in models_dir.glob("*.py"):
        for node in ast.parse(source.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
                values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                names.update(v.id for v in values if isinstance(v, ast.Name))
    return frozenset(names)


def transformers_has_architecture(name: str) -> bool:
    """SGLang falls back to its Transformers backend for any class transformers ships
    (sglang/srt/model_loader/utils.py:231 resolve_transformers_arch)."""
    import transformers

    try:
        return getattr(transformers, name, None) is not None
    except Exception:  # transformers' lazy module raises when the class's own imports fail
        return False


def _read_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelDirError(f"model directory {path} has no config.json; is it an HF checkpoint directory?")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelDirError(f"{config_file} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelDirError(f"{config_file} must hold a JSON object")
    return config


def check_model_dir(
    model_path: str | Path, *, tokenizer_path: str | Path | None = None, skip_tokenizer_init: bool = False,
    flag: str = "--hf-checkpoint",
) -> ModelDirInfo:
    """Raise ModelDirError (naming `flag` and the file) unless SGLang can serve `model_path`."""
    path = Path(model_path).expanduser()
    if not path.exists():
        raise ModelDirError(f"{flag}: model directory {path} does not exist")
    if not path.is_dir():
        raise ModelDirError(f"{flag}: {path} is not a directory (SGLang needs an HF checkpoint directory)")
    config = _read_config(path)

    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures or not all(isinstance(a, str) for a in architectures):
        raise ModelDirError(f"{path / 'config.json'}: 'architectures' must be a non-empty list of class names")
    native = sglang_native_architectures()
    if not any(a in native or transformers_has_architecture(a) for a in architectures):
        raise ModelDirError(
            f"{path / 'config.json'}: architecture {', '.join(architectures)} is not supported by SGLang "
            f"(neither natively nor through its transformers fallback); e.g. Qwen2ForCausalLM, "
            f"LlamaForCausalLM and Qwen3ForCausalLM are"
        )

    if not skip_tokenizer_init:
        tok_dir = Path(tokenizer_path).expanduser() if tokenizer_path else path
        if not tok_dir.is_dir() or not any((tok_dir / f).is_file() for f in TOKENIZER_FILES):
            where = "--sglang-tokenizer-path" if tokenizer_path else flag
            raise ModelDirError(
                f"{where}: {tok_dir} has no tokenizer (looked for {', '.join(TOKENIZER_FILES)}); save the "
                f"tokenizer next to the weights, pass --sglang-tokenizer-path, or --sglang-skip-tokenizer-init"
            )

    vocab_size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return ModelDirInfo(
        path=path.resolve(),
        architectures=tuple(architectures),
        model_type=str(config.get("model_type", "")),
        vocab_size=int(vocab_size) if vocab_size else None,
    )
