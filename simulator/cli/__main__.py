"""``python -m simulator.cli``: the ``asyngrad`` command."""

import sys

from simulator.cli import main

sys.exit(main())
