"""``python -m runtime`` and ``torchrun -m runtime``: the ``dapple-run`` command line."""

import sys

from runtime.commands.cli import main

sys.exit(main())
