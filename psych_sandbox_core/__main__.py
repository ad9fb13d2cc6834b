"""``python -m psych_sandbox_core``: the ``psych-sandbox`` command."""

import sys

from .cli import console_main

sys.exit(console_main())
