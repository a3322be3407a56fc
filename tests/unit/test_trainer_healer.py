"""TrainerHealer's own decisions (lean_rl/trainer_heal.py): when healing is off and why, what ends a run
that cannot heal, which start failures are waited out. The run it heals is a stand-in recording calls:
the real heal (Megatron ranks, SGLang engines, Ray) is tests/e2e/test_trainer_heal.py."""

import pytest

from lean_rl.backends.megatron.rank_errors import MegatronGroupError, PlacementError
from lean_rl.config import parse_config
from lean_rl.trainer_heal import TrainerHealer, TrainerHealFailed


def _cfg(tiny_qwen2, tmp_path, *extra):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1 + 1 =", "label": "2"}\n')
    return parse_config(["--hf-checkpoint", str(tiny_qwen2), "--output-dir", str(tmp_path / "run"),
                         "--prompt-data", str(data), *extra])


@pytest.mark.parametrize("flags, off", [
    ([], "no --save"),
    (["--save", "CKPT", "--max-trainer-restarts", "0"], "--max-trainer-restarts 0"),
    (["--save", "CKPT"], None),
])
def test_healing_is_on_only_with_a_checkpoint_to_go_back_to(flags, off, tiny_qwen2, tmp_path, caplog):
    cfg = _cfg(tiny_qwen2, tmp_path, *[str(tmp_path / "ckpt") if f == "CKPT" else f for f in flags])
    caplog.set_level("INFO", logger="lean_rl.trainer_heal")
    healer = TrainerHealer.of(cfg)
    if off is None:
        assert healer.max_restarts == 2 and healer.off_because is None
        assert "trainer healing on" in caplog.text
    else:
        assert healer.max_restarts == 0 and off in healer.off_because
        if "--max-trainer-restarts 0" not in off:  # asked for by the default: say why it is not given
            assert "trainer healing off" in caplog.text


class _Buffer:
    """A data buffer's state: 20 samples finished now, 4 at the checkpoint healed back to."""

    def __init__(self, calls):
        self.calls = calls

    def get_counters(self):
        return {"samples_finished": 20}

    def load_state_dict(self, state):
        self.calls.append("rewind")


class _Trainers:
    def __init__(self, calls, start_failures):
        self.calls, self.start_failures = calls, start_failures

    def shutdown_lost(self):
        self.calls.append("shutdown")

    def restart(self, heal_from, actor_step, start_timeout_s, started=None):
        self.calls.append("restart")
        if self.start_failures:
            raise self.start_failures.pop(0)
        return 3, {"buffer": {"counters": {"samples_finished": 4}}}


class _Run:
    """What TrainerHealer.heal acts on (trainer_heal.HealedRun), recorded; `start_failures` raised by the
    trainers' restart."""

    def __init__(self, start_failures=()):
        self.calls = []
        self.trainers, self.buffer = _Trainers(self.calls, list(start_failures)), _Buffer(self.calls)
        self.logger = self.weight_sync = None

    def sync_weights(self, version):
        self.calls.append(f"sync {version}")
        return type("Report", (), {"probe": type("Probe", (), {"max_abs_diff": 0.0})()})()


def test_a_heal_restarts_rewinds_syncs_and_reports_then_the_budget_ends():
    healer, run = TrainerHealer(save_dir="/nonexistent", max_restarts=1, wait_s=5), _Run()
    assert healer.heal(run, MegatronGroupError("rank 1 died"), step=5) == 3
    assert run.calls == ["shutdown", "restart", "rewind", "sync 3"]
    metrics = healer.metrics()
    assert metrics["fault/trainer_restarts"] == 1 and metrics["fault/samples_dropped"] == 16
    assert metrics["fault/steps_redone"] == 2 and metrics["fault/heal_seconds"] >= 0
    assert "fault/heal_seconds" not in healer.metrics()  # reported once, with the step after the heal
    with pytest.raises(TrainerHealFailed, match=r"1 trainer restart\(s\) used \(--max-trainer-restarts 1\).*rank 9"):
        healer.heal(run, MegatronGroupError("rank 9 died"), step=6)


def test_healing_off_names_why():
    healer = TrainerHealer(save_dir="/nonexistent", max_restarts=0, wait_s=5, off_because="no --save: nothing to go back to")
    with pytest.raises(TrainerHealFailed, match="healing off \\(no --save"):
        healer.heal(_Run(), MegatronGroupError("rank 1 died"), step=2)


def test_no_capacity_is_waited_out_until_the_wait_ends():
    run = _Run([PlacementError("cannot place 2 trainer node(s)")])
    assert TrainerHealer(save_dir="/nonexistent", max_restarts=1, wait_s=30).heal(run, MegatronGroupError("lost"), step=4) == 3
    assert run.calls.count("restart") == 2
    never = _Run([PlacementError("cannot place 2 trainer node(s)")] * 100)
    with pytest.raises(TrainerHealFailed, match="no capacity for the trainer within --trainer-restart-wait 1s"):
        TrainerHealer(save_dir="/nonexistent", max_restarts=1, wait_s=1).heal(never, MegatronGroupError("lost"), step=4)


def test_a_restarted_trainer_that_fails_by_itself_is_not_retried():
    run = _Run([MegatronGroupError("RankTrainer.load_checkpoint failed on rank 0 (OSError: bad file)")])
    with pytest.raises(TrainerHealFailed, match="the restarted trainer failed.*bad file"):
        TrainerHealer(save_dir="/nonexistent", max_restarts=2, wait_s=60).heal(run, MegatronGroupError("lost"), step=4)
    assert run.calls.count("restart") == 1
