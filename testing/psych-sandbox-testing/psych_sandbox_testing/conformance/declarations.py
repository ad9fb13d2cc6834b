"""Which conformance tests a backend inherits, from what its test class declares."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

Test = TypeVar("Test", bound=Callable[..., Any])


def applies(when: Callable[[Any], bool]) -> Callable[[Test], Test]:
    """Marks a test that only a backend declaring something asks for: ``when(cls)`` decides,
    from the test class's declarations, whether a subclass inherits it."""

    def mark(test: Test) -> Test:
        test.applies_when = when  # type: ignore[attr-defined]
        return test

    return mark


def claims(*guarantees: str) -> Callable[[Any], bool]:
    return lambda cls: set(guarantees) <= cls.enforced


def root_identity(cls: Any) -> bool:
    """Identity enforced, and the program's processes in the host's /proc to inspect."""
    return "identity" in cls.enforced and cls.processes_visible


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("identities are leased per execution only on a root host")
