"""tinker-cookbook's sl_basic, rl_basic, rl_loop and DPO recipes, run by their own `main` against a lean_rl
Tinker server (docs/tinker.md), with local data instead of the Hugging Face hub:

- sl_basic: the recipe's supervised loop (tinker_cookbook.supervised.train) on the cookbook's own
  example_data/conversations.jsonl (its FromConversationFileBuilder, the swap the recipe's source
  shows), 16 held out for the test NLL;
- rl_basic: the recipe's RL loop (tinker_cookbook.rl.train, loss importance_sampling) on the toy task
  as a cookbook RL dataset (toy_env.py) instead of GSM8K;
- rl_basic_kl: rl_basic with its KL penalty against a sampling client of the base model;
- rl_loop: the cookbook's minimal RL loop (tinker_cookbook.recipes.rl_loop, loss importance_sampling or
  cispo; its default stable_reinforce is refused by this server) with its hard-wired GSM8K, renderer
  and \\boxed{} reward swapped for the toy task (rl_loop_local.py says where and why);
- dpo: tinker_cookbook.preference.train_dpo (the DPO loss computed client-side through
  forward_backward_custom, the reference a sampling client of the starting weights) on local preference
  pairs (preference_pairs.py) read by the cookbook's ComparisonBuilderFromJsonl.

The model is the server's --hf-checkpoint (a local path: the cookbook loads its tokenizer from it);
the renderer is role_colon (model_info picks one only for the hub names it knows). Hyperparameters are
the recipes' but for the data sizes, the LoRA rank (the server's --lora-rank) and the learning rate
(a randomly initialised tiny model, not a 9B one). Each run writes LOG/<recipe>/metrics.jsonl.

    TINKER_API_KEY=tml-... python examples/tinker_cookbook/run_recipes.py --base-url http://127.0.0.1:8000 \
        --model /path/to/checkpoint --log-dir /tmp/cookbook [--recipes sl_basic rl_basic rl_loop dpo]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tinker_cookbook
from tinker_cookbook.preference import train_dpo
from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons
from tinker_cookbook.preference.preference_datasets import ComparisonBuilderFromJsonl
from tinker_cookbook.recipes import rl_basic, rl_loop, sl_basic
from tinker_cookbook.renderers import TrainOnWhat
from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.supervised import train as sl_train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from preference_pairs import write_pairs  # noqa: E402  (beside this script, not a package)
from rl_loop_local import local_rl_loop, write_toy_gsm8k  # noqa: E402
from toy_env import ToyDatasetBuilder  # noqa: E402

RENDERER = "role_colon"
RECIPES = ("sl_basic", "rl_basic", "rl_basic_kl", "rl_loop", "dpo")
CONVERSATIONS = Path(tinker_cookbook.__file__).parent / "example_data" / "conversations.jsonl"


def sl_config(args) -> sl_train.Config:
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=args.model, renderer_name=RENDERER,
                                            max_length=256, batch_size=16,
                                            train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    dataset = FromConversationFileBuilder(common_config=common, file_path=str(CONVERSATIONS), test_size=16)
    return sl_train.Config(log_path=str(args.log_dir / "sl_basic"), model_name=args.model,
                           recipe_name="recipe_sl_basic", renderer_name=RENDERER, dataset_builder=dataset,
                           learning_rate=args.sl_lr, lr_schedule="linear", num_epochs=args.sl_epochs,
                           eval_every=2, save_every=0, lora_rank=args.lora_rank, base_url=args.base_url)


def rl_config(args, kl_penalty_coef: float = 0.0) -> rl_train.Config:
    """rl_basic; with kl_penalty_coef > 0 the reward is penalised by the sampled tokens' log-ratio to a
    sampling client of the base model (the recipe's KLReferenceConfig), logged as kl_policy_base."""
    dataset = ToyDatasetBuilder(batch_size=8, group_size=8, num_batches=args.rl_steps,
                                model_name_for_tokenizer=args.model, renderer_name=RENDERER)
    kl = {"kl_penalty_coef": kl_penalty_coef,
          "kl_reference_config": rl_train.KLReferenceConfig(base_model=args.model)} if kl_penalty_coef > 0 else {}
    name = "rl_basic_kl" if kl_penalty_coef > 0 else "rl_basic"
    return rl_train.Config(log_path=str(args.log_dir / name), model_name=args.model,
                           recipe_name="recipe_rl_basic", renderer_name=RENDERER, dataset_builder=dataset,
                           learning_rate=args.rl_lr, max_tokens=8, eval_every=0, save_every=0,
                           lora_rank=args.lora_rank, base_url=args.base_url, **kl)


def rl_loop_config(args) -> rl_loop.Config:
    return rl_loop.Config(base_url=args.base_url, log_path=str(args.log_dir / "rl_loop"), model_name=args.model,
                          batch_size=8, group_size=8, learning_rate=args.rl_loop_lr, lora_rank=args.lora_rank,
                          save_every=0, max_tokens=8, loss_fn=args.rl_loop_loss, max_steps=args.rl_loop_steps)


def dpo_config(args) -> train_dpo.Config:
    data = args.log_dir / "dpo_data"
    pairs = ComparisonBuilderFromJsonl(train_path=str(write_pairs(data / "train.jsonl", 8 * args.dpo_batches, 0)),
                                       test_path=str(write_pairs(data / "test.jsonl", 16, 1)))
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=args.model, renderer_name=RENDERER,
                                            max_length=128, batch_size=8)
    # Each eval saves a sampler snapshot; the server keeps --max-sampler-adapters (8) and unloads the
    # oldest first, which would be the reference: eval_every keeps the evals of a run below that.
    return train_dpo.Config(log_path=str(args.log_dir / "dpo"), model_name=args.model,
                            recipe_name="recipe_preference_dpo", renderer_name=RENDERER,
                            dataset_builder=DPODatasetBuilderFromComparisons(common_config=common,
                                                                             comparison_builder=pairs),
                            learning_rate=args.dpo_lr, lr_schedule="linear", num_epochs=args.dpo_epochs,
                            dpo_beta=0.1, lora_rank=args.lora_rank, base_url=args.base_url, save_every=0,
                            eval_every=args.dpo_batches * args.dpo_epochs // 2, infrequent_eval_every=0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True, help="the server's --hf-checkpoint")
    parser.add_argument("--log-dir", type=Path, required=True, help="a new directory for the runs' logs")
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=RECIPES)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--sl-lr", type=float, default=2e-2)
    parser.add_argument("--sl-epochs", type=int, default=4)
    parser.add_argument("--rl-lr", type=float, default=5e-3)
    parser.add_argument("--rl-steps", type=int, default=16)
    parser.add_argument("--kl-coef", type=float, default=0.05, help="rl_basic_kl's kl_penalty_coef")
    parser.add_argument("--rl-loop-lr", type=float, default=2e-3)
    parser.add_argument("--rl-loop-steps", type=int, default=24)
    parser.add_argument("--rl-loop-loss", default="importance_sampling", choices=["importance_sampling", "cispo"])
    parser.add_argument("--dpo-lr", type=float, default=1e-2)
    parser.add_argument("--dpo-batches", type=int, default=6, help="batches of 8 pairs per epoch")
    parser.add_argument("--dpo-epochs", type=int, default=4)
    args = parser.parse_args(argv)
    if "sl_basic" in args.recipes:
        sl_basic.main(sl_config(args))
    if "rl_basic" in args.recipes:
        rl_basic.main(rl_config(args))
    if "rl_basic_kl" in args.recipes:
        rl_basic.main(rl_config(args, args.kl_coef))
    if "rl_loop" in args.recipes:
        data = write_toy_gsm8k(args.log_dir / "rl_loop_data" / "train.jsonl", 8 * args.rl_loop_steps, 0)
        with local_rl_loop(data, RENDERER, args.model):
            rl_loop.main(rl_loop_config(args))
    if "dpo" in args.recipes:
        train_dpo.main(dpo_config(args))


if __name__ == "__main__":
    main()
