"""The windows backend passes the shared behaviour suite, on Windows only (CI)."""

from __future__ import annotations

import sys

import pytest

if sys.platform != "win32":
    pytest.skip("the windows backend runs on Windows only (CI)", allow_module_level=True)

from psych_sandbox_testing.conformance import BackendConformance


class TestWindowsConformance(BackendConformance):
    backend = "windows"
    level = "process"
    enforced = frozenset({"environment"})
