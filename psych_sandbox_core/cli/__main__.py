"""``python -m psych_sandbox_core.cli``: the ``psych-sandbox`` command."""

import sys

from . import console_main

sys.exit(console_main())
