"""lean_rl/slime_flags.py: the table covers slime's flag list, agrees with lean_rl's parser, and
translates a slime command line as slime means it; docs/slime_flags.md is current."""

from pathlib import Path

import pytest

from lean_rl.config import build_parser
from lean_rl.options import ConfigError
from lean_rl.slime_flags import OTHER_MEANING_HERE, SLIME_FLAGS, markdown, translate

REPO = Path(__file__).resolve().parents[2]
FLAG_LIST = Path(__file__).with_name("slime_flag_list.txt")


def _slime_list() -> list[str]:
    return [line.split("\t")[0] for line in FLAG_LIST.read_text().splitlines() if line and not line.startswith("#")]


def _lean_flags() -> set[str]:
    return {option for action in build_parser()._actions for option in action.option_strings}


def test_the_list_names_its_slime_commit():
    assert FLAG_LIST.read_text().startswith("# slime's launch flags at THUDM/slime 624b824a8")


def test_the_table_covers_exactly_the_flags_of_the_list():
    listed = _slime_list()
    assert len(listed) == len(set(listed)) > 300
    assert sorted(set(listed) - set(SLIME_FLAGS)) == [], "slime flags without an entry"
    assert sorted(set(SLIME_FLAGS) - set(listed)) == [], "entries for flags slime does not have"


def test_the_table_agrees_with_lean_rls_parser():
    """same: lean_rl parses the flag; a renamed flag's target is lean_rl's; a notice or a refusal is for a
    flag lean_rl does not have (when lean_rl gains one, its entry must change)."""
    lean = _lean_flags()
    for flag, rule in SLIME_FLAGS.items():
        if rule.status == "same":
            assert flag in lean, f"{flag}: 'same' but lean_rl has no such flag"
        elif rule.status in ("notice", "refused") and flag not in OTHER_MEANING_HERE:
            assert flag not in lean, f"{flag}: lean_rl has this flag now; its entry says {rule.status}"
        if rule.to is not None:
            assert rule.to in lean, f"{flag} -> {rule.to}: not a lean_rl flag"
        if rule.status in ("notice", "refused"):
            assert rule.text, f"{flag}: a {rule.status} needs its one line"


def test_the_doc_is_current():
    assert (REPO / "docs" / "slime_flags.md").read_text() == markdown(), \
        "regenerate: python -m lean_rl.slime_flags --markdown > docs/slime_flags.md"


def _lean(argv, script="train.py"):
    translation = translate(script, argv)
    args, unknown = build_parser().parse_known_args(translation.argv)
    return translation, args, unknown


BASE = ["--hf-checkpoint", "/m", "--prompt-data", "/d.jsonl", "--rollout-batch-size", "4", "--num-rollout", "2"]


def test_slimes_defaults_hold_where_lean_rls_differ():
    t, args, unknown = _lean(BASE)
    assert unknown == [] and not t.asynchronous
    assert (args.input_key, args.label_key, args.metadata_key, args.tool_key) == ("input", "", "metadata", "tools")
    assert args.n_samples_per_prompt == 1 and args.loss_agg_mode == "seq-mean-token-mean"
    assert (args.weight_decay, args.attention_dropout, args.hidden_dropout) == (0.01, 0.1, 0.1)
    _, args, _ = _lean(BASE + ["--input-key", "prompt", "--label-key", "label", "--calculate-per-token-loss"])
    assert (args.input_key, args.label_key, args.loss_agg_mode) == ("prompt", "label", "token-mean")


def test_use_kl_loss_as_in_slime():
    _, args, _ = _lean(BASE + ["--use-kl-loss", "--kl-loss-coef", "0.01", "--kl-loss-type", "low_var_kl"])
    assert (args.kl_loss_coef, args.kl_loss_type) == (0.01, "low_var_kl")
    _, args, _ = _lean(BASE + ["--kl-loss-coef", "0.01"])  # without --use-kl-loss slime adds no KL term
    assert args.kl_loss_coef == 0.0


def test_tuning_flags_are_accepted_with_a_notice_and_cp_above_one_refused():
    t, args, unknown = _lean(BASE + ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                     "--recompute-num-layers", "1", "--accumulate-allreduce-grads-in-fp32",
                                     "--attention-softmax-in-fp32", "--optimizer-cpu-offload", "--optimizer", "adam",
                                     "--context-parallel-size", "1", "--expert-tensor-parallel-size", "1"])
    assert unknown == [] and len(t.notices) == 9
    assert all(n.startswith("slime flag --") and "\n" not in n for n in t.notices)
    with pytest.raises(ConfigError, match=r"^slime flag --context-parallel-size 2: only 1 in lean_rl \(context "
                                          r"parallelism is not in lean_rl"):
        translate("train.py", BASE + ["--context-parallel-size", "2"])
    with pytest.raises(ConfigError, match=r"^slime flag --optimizer sgd: only adam"):
        translate("train.py", BASE + ["--optimizer", "sgd"])


def test_a_refused_flag_names_the_lean_rl_way():
    with pytest.raises(ConfigError, match=r"^slime flag --ref-ckpt-step: lean_rl loads the latest checkpoint of "
                                          r"--ref-load$"):
        translate("train.py", BASE + ["--ref-ckpt-step", "3"])


def test_save_hf_takes_a_directory_not_slimes_template():
    _, args, _ = _lean(BASE + ["--save", "/ckpt", "--save-hf", "/out/hf"])
    assert args.save_hf == "/out/hf"
    with pytest.raises(ConfigError, match=r"--save-hf /out/iter_\{rollout_id\}: lean_rl writes each checkpoint's "
                                          r"HF model to DIR/step_N"):
        translate("train.py", BASE + ["--save", "/ckpt", "--save-hf", "/out/iter_{rollout_id}"])


def test_mapped_flags():
    t, args, unknown = _lean(BASE + ["--rollout-seed", "7", "--eval-prompt-data", "a", "/a.jsonl", "b", "/b.jsonl",
                                     "--sglang-server-concurrency", "16", "--rm-type", "deepscaler",
                                     "--wandb-group", "g1", "--rollout-max-context-len", "64",
                                     "--disable-grpo-std-normalization", "--eval-top-p", "0.7"])
    assert unknown == ["--sglang-context-length", "64"]  # passed through to SGLang
    assert args.seed == 7 and args.eval_prompt_data == [["a", "/a.jsonl"], ["b", "/b.jsonl"]]
    assert (args.rollout_max_concurrency, args.rm_type, args.rollout_max_prompt_len) == (16, "math", 63)
    assert args.advantage_estimator == "dr_grpo" and args.eval_top_p == 0.7
    assert t.env == {"WANDB_RUN_GROUP": "g1"}
    _, args, _ = _lean(BASE + ["--eval-prompt-data", "/aime.jsonl"])  # slime's one-path form
    assert args.eval_prompt_data == [["aime", "/aime.jsonl"]]
    with pytest.raises(ConfigError, match=r"--rm-type gpqa: lean_rl's built-in rewards serve"):
        translate("train.py", BASE + ["--rm-type", "gpqa"])


def test_num_epoch_counts_rollouts_from_the_data(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join('{"input": "x"}\n' for _ in range(10)))
    argv = ["--prompt-data", str(data), "--rollout-batch-size", "4", "--num-epoch", "3"]
    _, args, _ = _lean(argv)
    assert (args.num_epochs, args.num_rollout) == (3, 7)  # 3 * 10 // 4, as slime counts


def test_launchers_map_to_lean_rls_loops():
    t, args, _ = _lean(BASE, "train_async.py")
    assert t.asynchronous and args.async_mode == "one-step"
    t, args, _ = _lean(BASE + ["--rollout-function-path",
                               "slime.rollout.fully_async_rollout.generate_rollout_fully_async"], "train_async.py")
    assert t.asynchronous and (args.async_mode, args.max_staleness) == ("full", 1)
    assert args.rollout_function_path == "lean_rl.rollout.default.generate_rollout"
    t, args, _ = _lean(BASE + ["--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout",
                               "--loss-type", "sft_loss", "--debug-train-only",
                               "--disable-compute-advantages-and-returns"], "train_async.py")
    assert not t.asynchronous and args.loss_type == "sft_loss" and args.apply_chat_template
    assert args.rollout_function_path == "lean_rl.rollout.sft.generate_rollout" and not args.debug_train_only
    with pytest.raises(ConfigError, match="slime's launchers are train.py and train_async.py"):
        translate("run.py", BASE)


def test_lean_rls_own_parser_names_the_way_for_a_slime_flag(tmp_path, tiny_qwen2):
    from lean_rl.config import parse_config

    with pytest.raises(ConfigError, match=r"unrecognized arguments: --use-kl-loss \(--use-kl-loss is slime's: mapped, "
                                          r".*python -m lean_rl.slime_launch train.py"):
        parse_config(["--hf-checkpoint", str(tiny_qwen2), "--use-kl-loss"])


def test_every_mapped_entry_says_how():
    for flag, rule in SLIME_FLAGS.items():
        if rule.status == "mapped":
            assert (rule.to, rule.env, rule.convert) != (None, None, None), flag


def test_lr_warmup_fraction_counts_the_runs_optimizer_steps():
    _, args, _ = _lean(BASE + ["--n-samples-per-prompt", "8", "--global-batch-size", "16", "--lr-decay-style",
                               "cosine", "--lr-warmup-fraction", "0.25"])
    assert (args.lr_warmup_iters, args.lr_decay_iters) == (1, 4)  # 2 rollouts x 32 samples / 16 = 4 steps
