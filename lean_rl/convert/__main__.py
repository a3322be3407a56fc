import sys

from lean_rl.convert.cli import main

sys.exit(main())
