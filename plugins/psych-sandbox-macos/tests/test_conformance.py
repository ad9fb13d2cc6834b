"""The macos backend passes the shared behaviour suite, on macOS only (CI)."""

from __future__ import annotations

import sys

import pytest

if sys.platform != "darwin":
    pytest.skip("the macos backend runs on macOS only (CI)", allow_module_level=True)

from psych_sandbox_testing.conformance import BackendConformance


class TestMacosConformance(BackendConformance):
    backend = "macos"
    level = "process"
    enforced = frozenset({"network", "environment"})
