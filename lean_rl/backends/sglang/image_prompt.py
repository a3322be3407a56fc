"""Token ids of an image prompt as SGLang 0.5.23 takes them, and the guard that keeps a request from hanging.

SGLang's contract (sglang/srt/multimodal/processors/base_processor.py:586 build_input_ids): input_ids
carry ONE image pad token per image, and SGLang expands it to the image's vision tokens from the grid it
computes itself. A sample's tokens hold the HF processor's expansion (what the trainer sees), so each
run of pads is collapsed to one before /generate. Ids with more pads than images (e.g. the expansion
sent as it is) make SGLang lose an exception in its multimodal processor's executor and never answer
(docs/vlm_spike.md, failure 2): build_generate_payload refuses them here, at once, instead.
"""

from __future__ import annotations

from collections.abc import Sequence


def check_one_pad_per_image(input_ids: Sequence[int], n_images: int, image_token_id: int | None) -> None:
    if image_token_id is None:
        raise ValueError("generate: image_data needs the model's image pad token id (image_token_id)")
    pads = sum(1 for t in input_ids if t == image_token_id)
    if pads != n_images:
        raise ValueError(f"generate: {n_images} image(s) but {pads} image pad token(s) ({image_token_id}) in "
                         "input_ids; SGLang takes ONE pad per image and never answers otherwise (collapse the "
                         "processor's expansion: lean_rl/backends/sglang/image_prompt.py collapse_image_pads)")


def collapse_image_pads(tokens: Sequence[int], image_token_id: int, tokens_per_image: Sequence[int]) -> list[int]:
    """`tokens` with each image's run of pads made one pad. Checks, token-exact, that the runs are the
    images' expansions in order (run i holds tokens_per_image[i] pads); ValueError saying where not."""
    out: list[int] = []
    runs: list[int] = []
    for token in tokens:
        if token == image_token_id:
            if out and out[-1] == image_token_id and runs:
                runs[-1] += 1
                continue
            runs.append(1)
        out.append(int(token))
    if runs != list(tokens_per_image):
        raise ValueError(f"the image pads in the tokens come in runs of {runs}, but the images expand to "
                         f"{list(tokens_per_image)} tokens each: the tokens are not the processor's expansion of "
                         "these images")
    return out
