import hashlib
import json

import pytest
from safetensors.torch import load_file

from lean_rl.testing.tiny_model import SUPPORTED_ARCHS, make_tiny_model


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_gives_identical_files_and_other_seed_differs(tmp_path):
    a = make_tiny_model(tmp_path / "a", seed=3)
    b = make_tiny_model(tmp_path / "b", seed=3)
    c = make_tiny_model(tmp_path / "c", seed=4)
    assert _sha(a / "model.safetensors") == _sha(b / "model.safetensors")
    assert _sha(a / "model.safetensors") != _sha(c / "model.safetensors")
    # the tokenizer does not depend on the weight seed
    assert _sha(a / "tokenizer.json") == _sha(c / "tokenizer.json")


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_each_arch_writes_a_loadable_checkpoint(tmp_path, arch):
    import torch
    import transformers

    out = make_tiny_model(tmp_path / arch, arch=arch)
    config = json.loads((out / "config.json").read_text())
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert config["vocab_size"] == len(tokenizer)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True).endswith("<|im_start|>assistant\n")
    weights = load_file(out / "model.safetensors")
    # norms and biases are randomised too, so a mapping bug that drops one cannot hide
    norms = [t for n, t in weights.items() if "norm" in n]
    assert norms and all(not torch.all(t == 1) for t in norms)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = torch.tensor([tokenizer.encode("the cat sat on the mat")])
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert logits.std() > 1.0  # not the near-flat output of a default init


def test_unknown_arch_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="--arch 'gpt2' is not supported.*qwen2"):
        make_tiny_model(tmp_path / "x", arch="gpt2")
