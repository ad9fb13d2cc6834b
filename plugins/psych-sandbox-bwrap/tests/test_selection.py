"""Selection and identity: bwrap is offered only where a trial execution works, and it works
for a root host and an unprivileged one alike."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from bwrap_support import BWRAP_ROOT, needs_root, requires_bwrap, run
from psych_sandbox_core import ConfigurationError, Sandbox
from psych_sandbox_testing.as_user import SYSTEM_PYTHON, staged_environment, unprivileged_user
from psych_sandbox_testing.host import marker, pids_with
from psych_sandbox_testing.requirements import skip_unless_required
from psych_sandbox_testing.selection import (
    BackendRegistry,
    availability,
    forget_selections,
    forget_trials,
)

pytestmark = [requires_bwrap, pytest.mark.anyio]

HERE = Path(__file__).parent
TEST_USER = "psych-bwrap-test"


@pytest.fixture
def fresh_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget trials and selections remembered by earlier tests in this process."""
    forget_trials(monkeypatch)
    forget_selections(monkeypatch)


@pytest.fixture
def failing_bwrap() -> Iterator[Path]:
    """A bwrap that fails the way bwrap does where user namespaces are forbidden (in a
    directory the unprivileged uid bwrap runs as can enter)."""
    directory = Path(tempfile.mkdtemp(prefix="psych-bwrap-fake-"))
    directory.chmod(0o755)
    fake = directory / "bwrap"
    fake.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace (simulated)' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    try:
        yield fake
    finally:
        fake.unlink()
        directory.rmdir()


async def test_failing_bwrap_is_a_clear_backend_not_ready(failing_bwrap: Path) -> None:
    result = await run("print('never')", options={"bwrap": str(failing_bwrap)})
    assert result.error is not None
    assert result.error.kind.value == "backend_not_ready"
    assert "No permissions to create new namespace (simulated)" in result.error.message
    assert result.stdout == ""


async def test_default_profile_skips_bwrap_whose_trial_fails(
    failing_bwrap: Path, fresh_selection: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{failing_bwrap.parent}:{os.environ['PATH']}")
    registry = BackendRegistry()
    status = await availability(registry, "bwrap")
    assert status.available is False
    assert status.reason is not None
    assert "No permissions to create new namespace (simulated)" in status.reason
    async with Sandbox(registry=registry) as sandbox:
        assert await sandbox.strongest_working_backend() != "bwrap"
        result = await sandbox.run("1")
    assert result.backend.id != "bwrap"


async def test_default_profile_picks_bwrap_where_it_works(fresh_selection: None) -> None:
    async with Sandbox(registry=BackendRegistry()) as sandbox:
        assert await sandbox.strongest_working_backend() == "bwrap"
        result = await sandbox.run("1")
    assert result.backend.id == "bwrap"
    assert result.level == "isolated"


async def test_missing_bwrap_reported_without_a_trial() -> None:
    registry = BackendRegistry()
    backend = registry.create("bwrap", {"bwrap": f"no-such-bwrap-{uuid.uuid4().hex}"})
    reason = backend.unavailable_reason()
    assert reason is not None and "not on PATH" in reason


@pytest.mark.parametrize(
    "options",
    [
        {"extra_ro_binds": ["/root"]},
        {"extra_ro_binds": ["/"]},
        {"extra_ro_binds": ["/tmp"]},
        {"extra_ro_binds": ["relative"]},
        {"workspace_bytes": 1},
        {"sandbox_uid": 0},
        {"no_such_option": True},
    ],
)
async def test_bad_options_fail_at_load(options: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        BackendRegistry().create("bwrap", options)


def _as_user_argv(program: str) -> list[str]:
    staged = staged_environment(
        editable=("psych_sandbox_core", "psych_sandbox_bwrap", "psych_sandbox_testing"),
        leave_out=("psych_sandbox_docker", "psych_sandbox_example", "psych_sandbox_remote"),
        files=(str(HERE / "as_user.py"),),
    )
    return [SYSTEM_PYTHON, "-I", str(staged / "as_user.py"), str(staged / "site"), program]


@needs_root
def test_works_as_an_unprivileged_host_user() -> None:
    uid, gid = unprivileged_user(TEST_USER)
    if not Path(SYSTEM_PYTHON).exists():
        skip_unless_required(BWRAP_ROOT, f"no system interpreter {SYSTEM_PYTHON}")
    mark = marker()
    program = (
        "import os, subprocess, sys\n"
        "if os.fork() == 0:\n    os.setsid()\n"
        f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', {mark!r}])\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "try:\n    open('/root/.profile').read(); home = 'read'\n"
        "except OSError:\n    home = 'denied'\n"
        "[os.getuid(), home]"
    )
    completed = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *_as_user_argv(program)],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
        cwd="/",
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert report["bwrap_available"] is True, report
    assert report["selected"] == "bwrap"
    assert report["error"] is None, report
    assert report["level"] == "isolated"
    for guarantee in ("filesystem", "network", "process_tree", "identity"):
        assert report["grades"][guarantee] == "enforced"
    assert report["return_value"] == [65534, "denied"]
    # An unprivileged host creates no cgroup: usage is honestly not measured, and memory and
    # process count rest on rlimits alone.
    assert report["measured_by"] == "none"
    assert report["cpu_seconds"] is None
    assert report["grades"]["memory"] == "unverified"
    assert report["grades"]["process_count"] == "unverified"
    # The daemon the program left died with the sandbox.
    assert pids_with(mark) == []


CLONE_NEWUSER = 0x10000000


@needs_root
def test_trial_fails_where_user_namespaces_are_forbidden() -> None:
    """Real bwrap, under a user namespace whose limit on further user namespaces is 0 (set in
    that namespace only, so nothing else on the host is affected)."""
    uid, gid = unprivileged_user(TEST_USER)
    if not Path(SYSTEM_PYTHON).exists():
        skip_unless_required(BWRAP_ROOT, f"no system interpreter {SYSTEM_PYTHON}")
    libc = ctypes.CDLL(None, use_errno=True)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child execs or exits
        try:
            os.close(ready_r)
            os.close(go_w)
            os.close(out_r)
            if libc.unshare(CLONE_NEWUSER) != 0:
                os._exit(3)
            os.write(ready_w, b"1")
            os.read(go_r, 1)  # the parent has written our uid and gid maps
            os.setresgid(0, 0, 0)
            os.setresuid(0, 0, 0)
            with open("/proc/sys/user/max_user_namespaces", "w") as fh:
                fh.write("0")
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            os.chdir("/")
            argv = _as_user_argv("1")
            os.execv(argv[0], argv)
        finally:
            os._exit(4)
    os.close(ready_w)
    os.close(go_r)
    os.close(out_w)
    try:
        assert os.read(ready_r, 1) == b"1"
        Path(f"/proc/{pid}/uid_map").write_text("0 0 65536\n")
        Path(f"/proc/{pid}/gid_map").write_text("0 0 65536\n")
        os.write(go_w, b"1")
        chunks = []
        while chunk := os.read(out_r, 65536):
            chunks.append(chunk)
    finally:
        _, status = os.waitpid(pid, 0)
        for fd in (ready_r, go_w, out_r):
            os.close(fd)
    output = b"".join(chunks).decode()
    assert os.waitstatus_to_exitcode(status) == 0, output
    report = json.loads(output.strip().splitlines()[-1])
    assert report["bwrap_available"] is False
    assert "bubblewrap could not start the sandbox" in report["bwrap_reason"]
    assert "namespace" in report["bwrap_reason"]
    assert report["selected"] != "bwrap"
    assert report["error"][0] == "backend_not_ready"
