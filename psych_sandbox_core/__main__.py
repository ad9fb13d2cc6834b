"""``python -m psych_sandbox_core``: the ``psych-sandbox`` command."""

import sys

from .cli import main

sys.exit(main())
