"""tinker-cookbook's sl_basic and rl_basic recipes, run by their own `main` against a lean_rl Tinker
server (docs/tinker.md), with local data instead of the Hugging Face hub:

- sl_basic: the recipe's supervised loop (tinker_cookbook.supervised.train) on the cookbook's own
  example_data/conversations.jsonl (its FromConversationFileBuilder, the swap the recipe's source
  shows), 16 held out for the test NLL;
- rl_basic: the recipe's RL loop (tinker_cookbook.rl.train, loss importance_sampling) on the toy task
  as a cookbook RL dataset (toy_env.py) instead of GSM8K.

The model is the server's --hf-checkpoint (a local path: the cookbook loads its tokenizer from it);
the renderer is role_colon (model_info picks one only for the hub names it knows). Hyperparameters are
the recipes' but for the data sizes, the LoRA rank (the server's --lora-rank) and the learning rate
(a randomly initialised tiny model, not a 9B one). Each run writes LOG/<recipe>/metrics.jsonl.

    TINKER_API_KEY=tml-... python examples/tinker_cookbook/run_recipes.py --base-url http://127.0.0.1:8000 \
        --model /path/to/checkpoint --log-dir /tmp/cookbook [--recipes sl_basic rl_basic]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tinker_cookbook
from tinker_cookbook.recipes import rl_basic, sl_basic
from tinker_cookbook.renderers import TrainOnWhat
from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.supervised import train as sl_train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toy_env import ToyDatasetBuilder  # noqa: E402  (beside this script, not a package)

RENDERER = "role_colon"
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


def rl_config(args) -> rl_train.Config:
    dataset = ToyDatasetBuilder(batch_size=8, group_size=8, num_batches=args.rl_steps,
                                model_name_for_tokenizer=args.model, renderer_name=RENDERER)
    return rl_train.Config(log_path=str(args.log_dir / "rl_basic"), model_name=args.model,
                           recipe_name="recipe_rl_basic", renderer_name=RENDERER, dataset_builder=dataset,
                           learning_rate=args.rl_lr, max_tokens=8, eval_every=0, save_every=0,
                           lora_rank=args.lora_rank, base_url=args.base_url)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True, help="the server's --hf-checkpoint")
    parser.add_argument("--log-dir", type=Path, required=True, help="a new directory for the runs' logs")
    parser.add_argument("--recipes", nargs="+", default=["sl_basic", "rl_basic"], choices=["sl_basic", "rl_basic"])
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--sl-lr", type=float, default=2e-2)
    parser.add_argument("--sl-epochs", type=int, default=4)
    parser.add_argument("--rl-lr", type=float, default=5e-3)
    parser.add_argument("--rl-steps", type=int, default=16)
    args = parser.parse_args(argv)
    if "sl_basic" in args.recipes:
        sl_basic.main(sl_config(args))
    if "rl_basic" in args.recipes:
        rl_basic.main(rl_config(args))


if __name__ == "__main__":
    main()
