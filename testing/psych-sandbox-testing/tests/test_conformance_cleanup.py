"""The shared behaviour suite cleans up after the backend it tests, whatever that backend did:
run against a backend whose teardown leaves a detached daemon running, it fails the tests that
ran it, naming the daemon, and afterwards the host's /proc holds no process of that daemon."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from psych_sandbox_core.kit.posix.identity import DEFAULT_COUNT, DEFAULT_FIRST_UID

from psych_sandbox_testing.host import (
    host_processes,
    kill_by_pidfd,
    marker,
    names_another_host,
    pids_with,
)

#: A real backend (the subprocess backend, subclassed) whose teardown starts a helper daemon
#: that double-forks, calls setsid(), ignores SIGTERM and is never stopped.
LEAKY_MODULE = '''
import os
import subprocess
import sys
from contextlib import asynccontextmanager

from psych_sandbox_core.kit import hookspecs
from psych_sandbox_core.backends.subprocess import SubprocessBackend
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_testing.conformance import BackendConformance

DAEMON = """
import os, sys
if os.fork() == 0:
    os.setsid()
    # Both ends wait until the daemon has exec'd (its end of the pipe closes then): the
    # host's census must find it under its own command line, not mid-exec with none.
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        os.set_inheritable(write, False)
        code = "import signal, time\\\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\\\n" \\\\
               "while True: time.sleep(1)"
        os.execv(sys.executable, [sys.executable, "-c", code, sys.argv[1]])
    os.close(write)
    os.read(read, 1)
    os._exit(0)
os.wait()
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


#: A backend whose executions' processes are not the test process's descendants (as an engine
#: daemon's are not): a spawner started at import, before any test, and detached from the test
#: process, runs a process under a uid of the backend's identity range at every teardown, which
#: no lease holds and nothing stops.
LEAKY_UID_MODULE = """
import os
import sys
from contextlib import asynccontextmanager

from psych_sandbox_core.kit import hookspecs
from psych_sandbox_core.backends.subprocess import SubprocessBackend
from psych_sandbox_core.kit.posix.identity import DEFAULT_COUNT, DEFAULT_FIRST_UID
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_testing.conformance import BackendConformance

#: The range's last uid: free unless the range is full.
UID = DEFAULT_FIRST_UID + DEFAULT_COUNT - 1

SPAWNER = '''
import os, sys
requests, replies, uid = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
# From the environment: the spawner's own command line carries only its own mark, so the
# host's search for the leaked process never finds the spawner on its way out.
mark = os.environ["LEAKY_MARK"]
while os.read(requests, 1):
    if os.fork() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        os.write(replies, b"k")
        code = "import time\\\\nwhile True: time.sleep(1)"
        os.execv("/usr/bin/python3.11", ["/usr/bin/python3.11", "-c", code, mark])
'''


def _start_spawner():
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            os.close(requests_w)
            os.close(replies_r)
            os.set_inheritable(requests_r, True)
            os.set_inheritable(replies_w, True)
            os.execv(sys.executable, [
                sys.executable, "-c", SPAWNER, str(requests_r), str(replies_w), str(UID),
                os.environ["LEAKY_SPAWNER_MARK"],
            ])
        os._exit(0)
    os.waitpid(child, 0)
    os.close(requests_r)
    os.close(replies_w)
    return requests_w, replies_r


REQUESTS, REPLIES = _start_spawner()


class LeakyUidBackend(SubprocessBackend):
    id = "leakyuid"

    @asynccontextmanager
    async def launch(self, request):
        async with super().launch(request) as launched:
            yield launched
        # The broken part: the spawner's process under a uid of the range is left running.
        os.write(REQUESTS, b"x")
        assert os.read(REPLIES, 1) == b"k"


class Plugin:
    @hookspecs.hookimpl
    def psych_sandbox_register_backends(self, registry):
        registry.add(LeakyUidBackend)


PLUGIN = Plugin()


class TestLeakyUidConformance(BackendConformance):
    backend = "leakyuid"
    level = "process"
    environment = frozenset({"TMPDIR"})

    def registry(self):
        registry = BackendRegistry()
        registry.register_plugin(PLUGIN, "leakyuid")
        return registry
"""


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
                # No short summary: whether its lines are cut to the terminal's width depends
                # on where the suite runs, and each error is counted once, in its own block.
                "-rN",
                "--rootdir",
                str(tmp_path),
                "-k",
                "(test_prints_and_returns or test_worker_exit) and asyncio",
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
        from psych_sandbox_testing.conformance import BackendConformance

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
            "(test_prints_and_returns or test_worker_exit) and asyncio",
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


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root host leases uids")
def test_a_process_left_under_an_unleased_uid_of_the_range_fails_the_suite_and_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mark = marker("psych-leaky-uid")
    spawner = marker("psych-leaky-spawner")
    monkeypatch.setenv("LEAKY_MARK", mark)
    monkeypatch.setenv("LEAKY_SPAWNER_MARK", spawner)
    module = tmp_path / "test_leaky_uid.py"
    module.write_text(LEAKY_UID_MODULE)
    uid = DEFAULT_FIRST_UID + DEFAULT_COUNT - 1
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
                "test_worker_exit and asyncio",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=110,
            check=False,
        )
        report = completed.stdout + completed.stderr
        assert completed.returncode == 1, report
        assert re.search(r"\b1 passed, \d+ deselected, 1 error\b", report), report
        assert "the backend 'leakyuid' left this behind" in report, report
        assert f"uid {uid}:" in report, report
        assert "would not die" not in report, report
        # Seen from the host: nothing runs under that uid any more. (The spawner, outside
        # the test's tree and running as root, is this test's scaffolding, stopped below.)
        assert [p for p in host_processes().values() if uid in p.uids and p.alive] == []
        assert pids_with(mark) == []
    finally:
        _kill_marked(mark)
        _kill_marked(spawner)


def test_a_cgroup_named_for_another_host_process_is_not_this_ones() -> None:
    # Per-execution cgroups carry their host's owner tag, <pid>.<start time>: another test
    # run's (a second worker's) are left to it, however they are nested.
    me = os.getpid()
    for name in (f"{me + 1}.{99}-0a1b2c", f"psych-sandbox-bwrap-{me + 1}.7-ab", f"{me + 1}-5-ff"):
        assert names_another_host(f"/sys/fs/cgroup/memory/psych-sandbox/{name}", me), name
    for name in (f"{me}.{99}-0a1b2c", f"psych-sandbox-bwrap-{me}.7-ab", "plain-name"):
        assert not names_another_host(f"/sys/fs/cgroup/memory/psych-sandbox/{name}", me), name
