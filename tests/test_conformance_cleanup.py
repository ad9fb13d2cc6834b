"""The shared behaviour suite cleans up after the backend it tests, whatever that backend did:
run against a backend whose teardown leaves a detached daemon running, it fails the tests that
ran it, naming the daemon, and afterwards the host's /proc holds no process of that daemon."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from psych_sandbox_core.testing.host import host_processes, kill_by_pidfd, marker, pids_with

#: A real backend (the subprocess backend, subclassed) whose teardown starts a helper daemon
#: that double-forks, calls setsid(), ignores SIGTERM and is never stopped.
LEAKY_MODULE = '''
import os
import subprocess
import sys
from contextlib import asynccontextmanager

from psych_sandbox_core import hookspecs
from psych_sandbox_core.backends.subprocess import SubprocessBackend
from psych_sandbox_core.registry import BackendRegistry
from psych_sandbox_core.testing.conformance import BackendConformance

DAEMON = """
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        code = "import signal, time\\\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\\\n" \\\\
               "while True: time.sleep(1)"
        os.execv(sys.executable, [sys.executable, "-c", code, sys.argv[1]])
    os._exit(0)
"""


class LeakyBackend(SubprocessBackend):
    id = "leaky"

    @asynccontextmanager
    async def launch(self, request):
        async with super().launch(request) as launched:
            yield launched
        # The broken part: a helper started at teardown and forgotten.
        subprocess.run([sys.executable, "-c", DAEMON, os.environ["LEAKY_MARK"]], check=True)


class Plugin:
    @hookspecs.hookimpl
    def psych_sandbox_register_backends(self, registry):
        registry.add(LeakyBackend)


PLUGIN = Plugin()


class TestLeakyConformance(BackendConformance):
    backend = "leaky"
    level = "process"
    environment = frozenset({"TMPDIR"})

    def registry(self):
        registry = BackendRegistry()
        registry.register_plugin(PLUGIN, "leaky")
        return registry
'''


def _kill_marked(mark: str) -> None:
    table = host_processes()
    kill_by_pidfd([table[pid] for pid in pids_with(mark) if pid in table])


def test_a_backend_that_leaves_a_daemon_fails_the_suite_and_the_daemon_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mark = marker("psych-leaky-daemon")
    monkeypatch.setenv("LEAKY_MARK", mark)
    module = tmp_path / "test_leaky.py"
    module.write_text(textwrap.dedent(LEAKY_MODULE))
    try:
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                str(module),
                "-q",
                "-p",
                "no:cacheprovider",
                "--rootdir",
                str(tmp_path),
                "-k",
                "test_prints_and_returns or test_worker_exit",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=110,
            check=False,
        )
        report = completed.stdout + completed.stderr
        # The tests themselves passed; each then failed for what its execution left.
        assert completed.returncode == 1, report
        assert re.search(r"\b2 passed, \d+ deselected, 2 errors\b", report), report
        assert report.count("the backend 'leaky' left this behind") == 2, report
        assert report.count("outlived the execution (killed now)") == 2, report
        assert report.count(mark) >= 2, report
        assert "would not die" not in report, report
        # Seen from the host: no process of the daemon is left.
        assert pids_with(mark) == []
    finally:
        _kill_marked(mark)


def test_the_suite_passes_a_backend_that_leaves_nothing(tmp_path: Path) -> None:
    """The control: the same check over the intact backend finds nothing."""
    module = tmp_path / "test_intact.py"
    module.write_text(
        textwrap.dedent("""
        from psych_sandbox_core.testing.conformance import BackendConformance

        class TestIntact(BackendConformance):
            backend = "subprocess"
            level = "process"
            environment = frozenset({"TMPDIR"})
    """)
    )
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(module),
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            "-k",
            "test_prints_and_returns or test_worker_exit",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=110,
        check=False,
    )
    report = completed.stdout + completed.stderr
    assert completed.returncode == 0, report
    assert re.search(r"\b2 passed, \d+ deselected in\b", report), report
