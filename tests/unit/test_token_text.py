import random

import pytest
import transformers

from lean_rl.utils.token_text import decode_ids


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2):
    return transformers.AutoTokenizer.from_pretrained(tiny_qwen2)


def test_decode_ids_is_the_tokenizers_decode_with_special_tokens_kept(tokenizer):
    rng = random.Random(0)
    specials = list(tokenizer.all_special_ids)
    assert specials, "the tiny tokenizer has special tokens: the test needs them"
    for _ in range(200):  # any ids: byte pieces that split characters, special tokens among them
        ids = [rng.choice(specials) if rng.random() < 0.1 else rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 80))]
        assert decode_ids(tokenizer, ids) == tokenizer.decode(ids)
    assert tokenizer.eos_token in decode_ids(tokenizer, [5, tokenizer.eos_token_id])


def test_a_tokenizer_that_cleans_up_spaces_goes_through_its_decode(tokenizer):
    cleaning = transformers.AutoTokenizer.from_pretrained(tokenizer.name_or_path, clean_up_tokenization_spaces=True,
                                                          clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output=True)
    ids = cleaning(" a , b .", add_special_tokens=False)["input_ids"]
    assert decode_ids(cleaning, ids) == cleaning.decode(ids) != cleaning.backend_tokenizer.decode(ids)
