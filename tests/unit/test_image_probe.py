"""The weight-sync probe on an image prompt (weight_sync/image_probe.py), its pure parts: the probe's tokens
for the trainer and the engine, the /generate payload, reading SGLang's answer, the failure's headline,
and the scoring plan carrying the image inputs to the ranks. The probe against a live engine after a
sync: tests/e2e/test_vlm_run.py (slow)."""

from types import SimpleNamespace

import numpy as np
import pytest

from lean_rl.backends.megatron.scoring_plan import micro_batch_image_rows, plan_scoring
from lean_rl.testing.tiny_vlm import build_processor
from lean_rl.weight_sync.errors import WeightSyncProbeError
from lean_rl.weight_sync.image_probe import build_image_probe, build_image_score_payload, parse_image_score
from lean_rl.weight_sync.probe import EngineProbe, ProbeResult, raise_on_failure


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    path = tmp_path_factory.mktemp("processor")
    build_processor().save_pretrained(path)
    return build_image_probe(str(path))


def test_the_probe_holds_an_image_and_scores_only_what_follows_it(probe):
    grid = probe.train_inputs["image_grid_thw"]
    assert grid.tolist() == [[1, 4, 6]]  # 84x56 pixels, patch 14
    assert probe.image_tokens == 6 and probe.train_inputs["pixel_values"].shape == (24, 3 * 2 * 14 * 14)
    pads = [i for i, t in enumerate(probe.token_ids) if t == probe.image_token_id]
    assert pads == list(range(pads[0], pads[0] + 6))  # one run, the processor's expansion
    assert probe.score_from == pads[-1] + 1
    assert probe.engine_ids.count(probe.image_token_id) == 1  # SGLang expands the one pad itself
    assert len(probe.engine_ids) == len(probe.token_ids) - 5
    assert probe.engine_ids[pads[0] + 1:] == probe.token_ids[probe.score_from:]
    assert len(probe.token_ids) - probe.score_from >= 10  # the continuation is scored, not just a token or two
    assert probe.image_data[0].startswith("data:image/png;base64,")


def test_the_payload_sends_one_pad_the_image_and_the_start_in_expanded_ids(probe):
    payload = build_image_score_payload(probe, adapter="policy")
    assert payload["input_ids"] == probe.engine_ids and payload["image_data"] == probe.image_data
    assert payload["return_logprob"] is True and payload["sampling_params"]["max_new_tokens"] == 1
    # SGLang 0.5.23 counts logprob_start_len over the ids after its expansion (measured)
    assert payload["logprob_start_len"] == probe.score_from - 1
    assert payload["lora_path"] == "policy"


def _answer(probe, log_probs, ids=None):
    ids = probe.token_ids[probe.score_from - 1:] if ids is None else ids
    entries = [[None if i == 0 else lp, 0 if t == probe.image_token_id else t, "x"]
               for i, (t, lp) in enumerate(zip(ids, [0.0] + list(log_probs)))]
    return {"meta_info": {"input_token_logprobs": entries, "weight_version": "3"}}


def test_sglang_s_answer_gives_the_log_probs_after_the_image(probe):
    n = len(probe.token_ids) - probe.score_from
    scored = parse_image_score(_answer(probe, [-0.5 - i for i in range(n)]), probe)
    assert scored.log_probs == [-0.5 - i for i in range(n)] and scored.weight_version == "3"
    with pytest.raises(ValueError, match=f"expected {n + 1} input_token_logprobs after the image, got {n}"):
        parse_image_score(_answer(probe, [-1.0] * (n - 1), probe.token_ids[probe.score_from:]), probe)
    wrong = list(probe.token_ids[probe.score_from - 1:])
    wrong[3] = wrong[3] + 1
    with pytest.raises(ValueError, match=r"input_token_logprobs\[3\] is for token"):
        parse_image_score(_answer(probe, [-1.0] * n, wrong), probe)
    with pytest.raises(ValueError, match="meta_info"):
        parse_image_score({"text": "x"}, probe)


def test_a_failing_image_probe_says_its_prompt_had_an_image():
    result = ProbeResult(version="2", tolerance=1e-4, num_tokens=20, image_tokens=6,
                         engines=(EngineProbe("http://e", 0.7, 0.2, "2"),))
    assert result.failures()
    clients = [SimpleNamespace(base_url="http://e")]
    with pytest.raises(WeightSyncProbeError, match=r"the probe sequence \(with an image\): max \|Δ log p\| 0.7"):
        raise_on_failure(result, clients, [1], None, 5.0, unnamed_why="no hashes here")


def test_the_scoring_plan_carries_each_sequence_s_images_to_its_rank():
    image = {"pixel_values": np.zeros((4, 8), np.float32), "image_grid_thw": np.array([[1, 2, 2]])}
    plan = plan_scoring([[1, 2, 3], [4, 5], [6, 7, 8]], None, data_parallel_size=2, micro_batch_size=1,
                        vocab_size=16, max_seq_length=8, images=[image, None, image])
    assert [len(b.images) for b in plan.batches] == [2, 1]
    assert micro_batch_image_rows(plan.batches[0], 1) == [image] and micro_batch_image_rows(plan.batches[1], 0) == [None]
    assert micro_batch_image_rows(plan.batches[1], 1) == [None]  # a padding row
    text = plan_scoring([[1, 2]], None, data_parallel_size=1, micro_batch_size=2, vocab_size=16, max_seq_length=8)
    assert text.batches[0].images == () and micro_batch_image_rows(text.batches[0], 0) == [None, None]
    with pytest.raises(ValueError, match="images has 1 entries for 2 sequences"):
        plan_scoring([[1, 2], [3, 4]], None, data_parallel_size=1, micro_batch_size=1, vocab_size=16,
                     max_seq_length=8, images=[image])


def test_the_vision_tower_s_tensors_are_named_as_the_engine_fuses_them():
    """After a failed probe the checksums name the differing tensors; the tower's must map to SGLang's names."""
    from lean_rl.weight_sync.engine_params import engine_slot

    assert engine_slot("visual.blocks.0.attn.qkv.weight", None) == engine_slot("visual.blocks.0.attn.qkv.weight", 0)
    assert engine_slot("visual.blocks.0.attn.qkv.bias", None).engine_name == "visual.blocks.0.attn.qkv_proj.bias"
    up = engine_slot("visual.blocks.1.mlp.up_proj.bias", None)
    assert (up.engine_name, up.position, up.num_parts) == ("visual.blocks.1.mlp.gate_up_proj.bias", 1, 2)
    assert engine_slot("model.layers.0.mlp.gate_proj.weight", None).engine_name == "model.layers.0.mlp.gate_up_proj.weight"
    assert engine_slot("visual.blocks.0.attn.proj.weight", None).engine_name == "visual.blocks.0.attn.proj.weight"
