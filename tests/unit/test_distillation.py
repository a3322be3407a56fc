"""On-policy distillation (--use-opd): the advantage's reverse-KL term written out, the flags' checks,
the teacher's engine config, the tokenizer check, a teacher fault, and the trainer's refusal of
unscored samples. The whole loop (a teacher served by its own engines; the KL falls) is
tests/e2e/test_distillation_run.py."""

import asyncio
import math
from types import SimpleNamespace

import pytest
import torch

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.distillation import reverse_kl_advantages, topk_reverse_kl
from lean_rl.backends.megatron.rollout_batch import failure_reason, rollout_batch
from lean_rl.backends.megatron.train_driver import train_on_rollout
from lean_rl.backends.megatron.train_options import Distillation
from lean_rl.backends.sglang.config import EngineConfig
from lean_rl.backends.sglang.ports_and_key import resolve_api_key, resolve_ports
from lean_rl.config import parse_config
from lean_rl.options import ConfigError, build
from lean_rl.rollout.distillation import score_with_teacher
from lean_rl.rollout.distillation_config import DistillationConfig, check_same_vocabulary, teacher_engine_config
from lean_rl.sample import Sample, Status
from tests.unit.stand_ins import RefusingActor
from lean_rl.utils.net import find_free_port


def test_the_advantage_loses_coef_times_student_minus_teacher_on_trained_tokens():
    advantages = torch.tensor([[0.5, 0.5, 0.5], [-1.0, -1.0, 0.0]])
    student = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, 0.0]])
    teacher = torch.tensor([[-1.5, -1.0, -0.5], [-1.0, -0.1, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # row 1: one trained token, then padding
    adjusted, kl = reverse_kl_advantages(advantages, student, teacher, mask, kl_coef=0.5)
    # A - 0.5 * (s - t) where trained: row 0: 0.5 - 0.5*0.5, 0.5 - 0.5*(-1), 0.5 - 0; row 1: -1 - 0.5*(-2)
    expected = torch.tensor([[0.25, 1.0, 0.5], [0.0, -1.0, 0.0]])
    assert torch.allclose(adjusted, expected)
    # k1 = s - t over the 4 trained tokens: (0.5 + -1 + 0 + -2) / 4
    assert kl == pytest.approx(-0.625)
    # pure distillation (A = 0, coef 1): the advantage is t - s, the teacher's log-ratio over the student
    pure, _ = reverse_kl_advantages(torch.zeros(2, 3), student, teacher, mask, kl_coef=1.0)
    assert torch.allclose(pure, (teacher - student) * mask)


@pytest.mark.parametrize("kwargs, flag", [
    (dict(opd_type="sglang"), "--opd-type is a setting of on-policy distillation: add --use-opd"),
    (dict(teacher_url="http://127.0.0.1:1"), "--opd-teacher-url is a setting of on-policy distillation"),
    (dict(use_opd=True, teacher_url="http://127.0.0.1:1"), "--use-opd needs --opd-type sglang"),
    (dict(use_opd=True, opd_type="megatron", teacher_url="http://x:1"),
     "--opd-teacher-url is a setting of --opd-type sglang; --opd-type megatron takes the teacher from --opd-teacher-load"),
    (dict(use_opd=True, opd_type="megatron"), "--opd-type megatron needs --opd-teacher-load DIR"),
    (dict(use_opd=True, opd_type="megatron", teacher_load="/no/such/ckpt"), "--opd-teacher-load /no/such/ckpt: not a directory"),
    (dict(use_opd=True, opd_type="sglang", teacher_url="http://x:1", teacher_load="/tmp"),
     "--opd-teacher-load is a setting of --opd-type megatron"),
    (dict(teacher_load="/tmp"), "--opd-teacher-load is a setting of on-policy distillation: add --use-opd"),
    (dict(use_opd=True, opd_type="sglang"), "exactly one of --opd-teacher-hf-checkpoint DIR"),
    (dict(use_opd=True, opd_type="sglang", teacher_url="http://x:1", teacher_hf_checkpoint="/t"),
     "exactly one of --opd-teacher-hf-checkpoint"),
    (dict(use_opd=True, opd_type="sglang", teacher_url="x:1"), "--opd-teacher-url 'x:1': give http://HOST:PORT"),
    (dict(use_opd=True, opd_type="sglang", teacher_url="http://x:1", teacher_num_engines=2),
     "--opd-teacher-num-engines sizes the teacher this run serves"),
    (dict(use_opd=True, opd_type="sglang", teacher_url="http://x:1", opd_kl_coef=0.0), "--opd-kl-coef must be > 0"),
    (dict(use_opd=True, opd_type="sglang", teacher_hf_checkpoint="/no/such/dir"),
     "--opd-teacher-hf-checkpoint /no/such/dir: not an HF checkpoint directory"),
])
def test_config_errors_name_the_flag(kwargs, flag):
    with pytest.raises(ConfigError, match=flag.replace("(", r"\(").replace(".", r"\.")):
        build(DistillationConfig, **kwargs)


def test_the_megatron_type_has_the_trainer_score_and_no_teacher_engines(tmp_path):
    opd = build(DistillationConfig, use_opd=True, opd_type="megatron", teacher_load=str(tmp_path))
    assert opd.teacher_in_trainer == str(tmp_path) and not opd.scores_in_rollout and opd.teacher_engine_count == 0
    assert Distillation.of(opd) == Distillation(kl_coef=1.0, top_k=20, teacher_load=str(tmp_path))
    sglang = build(DistillationConfig, use_opd=True, opd_type="sglang", teacher_url="http://127.0.0.1:1",
                   opd_estimator="sampled")
    assert sglang.scores_in_rollout and sglang.teacher_in_trainer is None
    assert Distillation.of(sglang) == Distillation(kl_coef=1.0) and Distillation.of(build(DistillationConfig)) is None


def test_defaults_off_and_one_teacher_engine(tmp_path):
    assert not build(DistillationConfig).use_opd and build(DistillationConfig).teacher_engine_count == 0
    (tmp_path / "config.json").write_text("{}")
    served = build(DistillationConfig, use_opd=True, opd_type="sglang", teacher_hf_checkpoint=str(tmp_path))
    assert served.serves_teacher and served.teacher_num_engines == 1 and served.teacher_engine_count == 1
    external = build(DistillationConfig, use_opd=True, opd_type="sglang", teacher_url="http://127.0.0.1:30000")
    assert not external.serves_teacher and external.teacher_engine_count == 0


def test_teacher_engines_take_the_students_settings_on_ports_of_their_own_and_share_the_cores():
    student = resolve_api_key(resolve_ports(build(EngineConfig, model_path="/student", num_engines=2, device="cpu",
                                                         other_cpu_engines=3, max_total_tokens=4096,
                                                         server_passthrough=("--chunked-prefill-size", "64"))))
    teacher = teacher_engine_config(student, "/teacher", 3)
    assert teacher.model_path == "/teacher" and teacher.num_engines == 3 and teacher.other_cpu_engines == 2
    assert teacher.api_key == student.api_key and teacher.max_total_tokens == 4096
    assert teacher.server_passthrough == ("--chunked-prefill-size", "64")
    student_ports = {*student.engine_ports, student.resolved_router_port}
    teacher_ports = {*teacher.engine_ports, teacher.resolved_router_port}
    assert len(teacher_ports) == 4 and not student_ports & teacher_ports
    # cores // (2 student + 3 teacher engines + 1), at least 1: both groups get the same share
    cores = len(__import__("os").sched_getaffinity(0))
    assert student.threads_per_cpu_engine == teacher.threads_per_cpu_engine == max(1, cores // 6)


def _tokenizer_dir(path, vocab_size):
    from lean_rl.testing.tiny_model import build_tokenizer

    build_tokenizer(vocab_size).save_pretrained(path)
    return str(path)


def test_a_teacher_of_another_tokenizer_is_refused_naming_both_dirs(tmp_path):
    student = _tokenizer_dir(tmp_path / "student", 512)
    check_same_vocabulary(student, _tokenizer_dir(tmp_path / "same", 512))  # the same tokenizer: fine
    other = _tokenizer_dir(tmp_path / "other", 300)
    with pytest.raises(ConfigError) as err:
        check_same_vocabulary(student, other)
    assert f"--opd-teacher-hf-checkpoint {other}" in str(err.value) and f"--hf-checkpoint {student}" in str(err.value)
    with pytest.raises(ConfigError, match=f"--opd-teacher-hf-checkpoint {tmp_path}: cannot load its tokenizer"):
        check_same_vocabulary(student, str(tmp_path))


def _sample(index, response=(7, 8), status=Status.COMPLETED):
    s = Sample(index=index, group_index=0, prompt="p", tokens=[5, 6])
    s.append_response(list(response), log_probs=[-1.0] * len(response), weight_versions=0)
    s.status, s.reward = status, 0.0
    return s


def test_a_teacher_that_cannot_be_reached_fails_the_sample_with_teacher_error():
    port = find_free_port("127.0.0.1")  # nothing listens there: a real connection failure
    opd = build(DistillationConfig, use_opd=True, opd_type="sglang", teacher_url=f"http://127.0.0.1:{port}")
    cfg = SimpleNamespace(distillation=opd, engines=SimpleNamespace(request_timeout_s=5.0),
                          rollout=SimpleNamespace(request_retries=0))
    samples = [_sample(0), _sample(1, status=Status.FAILED), _sample(2, response=())]
    assert asyncio.run(score_with_teacher(cfg, samples)) == 1
    assert samples[0].status is Status.FAILED and samples[0].teacher_log_probs == []
    assert "EngineConnectionError" in samples[0].metadata["teacher_error"]
    assert failure_reason(samples[0]).startswith("teacher_error: EngineConnectionError")
    assert "teacher_error" not in samples[1].metadata  # failed before: not sent to the teacher
    assert samples[2].status is Status.COMPLETED  # nothing to score


def test_the_trainer_refuses_unscored_samples_before_any_forward_pass():
    scored, unscored = _sample(0), _sample(1)
    scored.teacher_log_probs = [-0.5, -0.25]
    with pytest.raises(ValueError, match=r"--use-opd: samples \[1\] have no teacher_log_probs"):
        train_on_rollout(RefusingActor(build(AlgorithmConfig)), [[scored, unscored]], policy_version=0,
                         distillation=Distillation(kl_coef=1.0))


def test_rollout_batch_lays_out_teacher_log_probs_response_aligned():
    long, short = _sample(0, response=(7, 8, 9)), _sample(1, response=(7,))
    long.teacher_log_probs, short.teacher_log_probs = [-0.1, -0.2, -0.3], [-0.4]
    batch = rollout_batch([[long, short]])
    assert torch.equal(batch.teacher_log_probs, torch.tensor([[-0.1, -0.2, -0.3], [-0.4, 0.0, 0.0]]))
    assert math.isclose(float(batch.masks.sum()), 4.0)


# ---------------------------------------------------------------- --opd-estimator topk
def _coarse_reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, k: int) -> torch.Tensor:
    """KL(student || teacher) of the two distributions lumped onto the teacher's top-k tokens and one
    bucket for the rest, written from the definition with full distributions (not the estimator's form)."""
    p, q = torch.softmax(student_logits.double(), -1), torch.softmax(teacher_logits.double(), -1)
    top = q.topk(k, dim=-1).indices
    in_top = torch.zeros_like(q, dtype=torch.bool).scatter(-1, top, True)
    coarse_p = torch.cat([p.gather(-1, top), (p * ~in_top).sum(-1, keepdim=True)], -1)
    coarse_q = torch.cat([q.gather(-1, top), (q * ~in_top).sum(-1, keepdim=True)], -1)
    return (torch.special.xlogy(coarse_p, coarse_p) - torch.special.xlogy(coarse_p, coarse_q)).sum(-1)  # 0 log 0 = 0


def _topk_inputs(student_logits, teacher_logits, k):
    teacher_lp = torch.log_softmax(teacher_logits, -1)
    top_lp, top_ids = teacher_lp.topk(k, dim=-1)
    return torch.log_softmax(student_logits, -1).gather(-1, top_ids), top_lp


@pytest.mark.parametrize("k", [1, 3, 12])
def test_topk_reverse_kl_is_the_kl_of_the_lumped_distributions(k):
    generator = torch.Generator().manual_seed(k)
    student, teacher = torch.randn(4, 5, 12, generator=generator), torch.randn(4, 5, 12, generator=generator) * 3
    value = topk_reverse_kl(*_topk_inputs(student, teacher, k))
    assert value.shape == (4, 5)
    assert torch.allclose(value.double(), _coarse_reverse_kl(student, teacher, k), atol=2e-5)
    full = (torch.softmax(student, -1) * (torch.log_softmax(student, -1) - torch.log_softmax(teacher, -1))).sum(-1)
    assert bool((value <= full + 1e-5).all())  # a lower bound of the full reverse KL (data processing)
    if k == 12:  # the top-k holds the whole vocabulary: the full KL (the tail is clamped to ~0 on both sides)
        assert torch.allclose(value, full, atol=1e-5)


def test_topk_reverse_kl_moves_the_student_towards_the_teachers_modes_not_one_token():
    """A peaked teacher with two modes; the student sampled mode A. The sampled-token k1 gradient
    raises only A; the top-k KL's gradient raises both modes and lowers the rest."""
    teacher = torch.log(torch.tensor([0.49, 0.49, 0.01, 0.01]))
    logits = torch.zeros(4, requires_grad=True)  # a uniform student
    student_lp, teacher_lp = _topk_inputs(logits, teacher, 2)
    topk_reverse_kl(student_lp, teacher_lp).backward()
    assert bool((logits.grad[:2] < 0).all()) and bool((logits.grad[2:] > 0).all())  # descent raises both modes
    assert torch.allclose(logits.grad[0], logits.grad[1])
    # at the teacher, the KL and its gradient are 0
    at_teacher = teacher.clone().requires_grad_()
    kl = topk_reverse_kl(*_topk_inputs(at_teacher, teacher, 2))
    kl.backward()
    assert abs(float(kl.detach())) < 1e-6 and float(at_teacher.grad.abs().max()) < 1e-6


def test_topk_reverse_kl_is_finite_on_padding_rows():
    zeros = torch.zeros(2, 3, 4)  # padding positions: every log-prob 0, the ids all 0
    student = zeros.clone().requires_grad_()
    kl = topk_reverse_kl(student, zeros)
    kl.sum().backward()
    assert bool(torch.isfinite(kl).all()) and bool(torch.isfinite(student.grad).all())


def test_topk_is_the_default_estimator_and_asks_sglang_for_top_k():
    config = build(DistillationConfig, use_opd=True, opd_type="sglang", teacher_url="http://127.0.0.1:1")
    assert config.opd_estimator == "topk" and config.top_k_if_used == 20
    sampled = build(DistillationConfig, use_opd=True, opd_type="sglang", teacher_url="http://127.0.0.1:1",
                    opd_estimator="sampled")
    assert sampled.top_k_if_used == 0
    assert build(DistillationConfig).top_k_if_used == 0


def test_the_trainer_refuses_samples_without_the_teachers_top_k():
    scored, unscored = _sample(0), _sample(1)
    for sample in (scored, unscored):
        sample.teacher_log_probs = [-0.5, -0.25]
    scored.teacher_top_ids, scored.teacher_top_log_probs = [[1, 2], [3, 4]], [[-0.5, -1.0], [-0.25, -2.0]]
    with pytest.raises(ValueError, match=r"--use-opd: samples \[1\] have no teacher_top_ids"):
        train_on_rollout(RefusingActor(build(AlgorithmConfig)), [[scored, unscored]], policy_version=0,
                         distillation=Distillation(kl_coef=1.0, top_k=2))


def test_rollout_batch_lays_out_the_teachers_top_k_response_aligned():
    long, short = _sample(0, response=(7, 8, 9)), _sample(1, response=(7,))
    long.teacher_top_ids = [[1, 2], [3, 4], [5, 6]]
    long.teacher_top_log_probs = [[-0.1, -2.0], [-0.2, -3.0], [-0.3, -4.0]]
    short.teacher_top_ids, short.teacher_top_log_probs = [[9, 8]], [[-0.5, -0.6]]
    batch = rollout_batch([[long, short]])
    assert batch.teacher_top_ids.dtype == torch.long and batch.teacher_top_ids.shape == (2, 3, 2)
    assert batch.teacher_top_ids[1].tolist() == [[9, 8], [0, 0], [0, 0]]
    assert batch.teacher_top_log_probs[0, 2].tolist() == pytest.approx([-0.3, -4.0])
    long.teacher_top_ids = long.teacher_top_ids[:2]
    with pytest.raises(ValueError, match="teacher_top_ids and teacher_top_log_probs must both hold one row"):
        long.check()


def test_a_top_k_larger_than_the_vocabulary_is_refused_at_start_up(tiny_qwen2, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "2+2?", "label": "4"}\n')
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--use-opd", "--opd-type", "sglang",
            "--opd-teacher-url", "http://127.0.0.1:1"]
    with pytest.raises(ConfigError, match="--opd-top-k 513 is more than the vocabulary's 512 tokens"):
        parse_config(base + ["--opd-top-k", "513"])
    assert parse_config(base + ["--opd-top-k", "512"]).distillation.top_k_if_used == 512
