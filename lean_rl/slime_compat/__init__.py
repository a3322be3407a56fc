"""slime's Python API served by lean_rl: a user's module written for slime (`from slime.utils.types import
Sample`, `GenerateState`, `slime.utils.http_utils.post`, ...) runs unchanged when slime is not installed.

lean_rl/utils/slime_finder.py maps `slime.*` imports to the modules here (installed when lean_rl loads the user's hooks);
args.py builds the mutable `args` view slime's functions read; convert.py turns samples from one
shape to the other at the boundary; hooks.py wraps a slime-style hook into lean_rl's contract. The
modules were written from slime's documented behaviour (THUDM/slime at 624b824), not copied.
docs/extending.md "Coming from slime" says what runs unchanged and what differs."""
