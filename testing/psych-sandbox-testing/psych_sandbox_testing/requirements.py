"""Which backends a test run must exercise: where the environment names a requirement, a test
that would skip for want of it fails instead, naming what was missing (so a CI host that lost
its engine cannot pass by skipping)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

#: Set in CI to the backends that must be tested, e.g. "bwrap-root,docker,gvisor".
REQUIRE_VARIABLE = "PSYCH_SANDBOX_REQUIRE_BACKENDS"


def required(requirement: str) -> bool:
    wanted = os.environ.get(REQUIRE_VARIABLE, "")
    return requirement in {part.strip() for part in wanted.split(",")}


def skip_unless_required(requirement: str, reason: str) -> NoReturn:
    """Skip, or fail when the environment says ``requirement`` must be tested here."""
    if required(requirement):
        pytest.fail(f"{REQUIRE_VARIABLE} requires {requirement!r}, but {reason}", pytrace=False)
    pytest.skip(reason)


def needs(condition: bool, requirement: str, reason: str) -> pytest.MarkDecorator:
    """Marks tests that cannot run here unless ``condition``: they skip, or fail where the
    environment requires ``requirement`` (the plugin reads the ``psych_missing`` mark)."""
    if condition:
        return pytest.mark.skipif(False, reason=reason)
    return pytest.mark.psych_missing(requirement, reason)
