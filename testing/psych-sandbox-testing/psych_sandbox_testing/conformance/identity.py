"""The conformance tests of identity on a root host: a leased uid per execution, seen from
the host, kept apart from other executions, and what it planted gone afterwards."""

from __future__ import annotations

import json
import os
import secrets
import signal
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from psych_sandbox_core import ExecutionResult
from psych_sandbox_core.kit.posix.sweep import has_keys

from ..host import (
    host_processes,
    marker,
    opens_of,
    pids_with,
    reap_children,
    uids_of,
    wait_for_pids,
)
from ..leftovers import finding_program, host_leftovers, host_targets, own_uid, planting_program
from ..programs import SECRET_SPY, secret_holder
from .base import ConformanceBase
from .declarations import applies, needs_root, root_identity


class IdentityTests(ConformanceBase):
    """What a backend enforcing identity is asked about it."""

    # ------------------------------------------------------------ identity on a root host

    def leased(self, uid: int) -> bool:
        """Whether ``uid`` is one of the backend's per-execution identities."""
        uids = self.identity_uids()
        return uids is not None and uid in uids

    @applies(root_identity)
    @pytest.mark.anyio
    async def test_identity_seen_from_the_host(self) -> None:
        """The program's process, inspected from the host: an identity leased for it (on a
        root host), no capabilities, no new privileges, namespaces of its own."""
        mark = marker()
        seen: dict[str, Any] = {}
        separate = {"network": "net", "process_tree": "pid", "filesystem": "mnt"}
        namespaces = ["ipc", *(ns for g, ns in separate.items() if g in self.enforced)]

        async def inspect() -> None:
            (pid,) = await wait_for_pids(mark)
            status = dict(
                line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            )
            seen["uid"] = [int(x) for x in status["Uid"].split()]
            seen["capeff"] = int(status["CapEff"].strip(), 16)
            seen["capprm"] = int(status["CapPrm"].strip(), 16)
            seen["nnp"] = status["NoNewPrivs"].strip()
            seen["own"] = {
                ns: os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
                for ns in namespaces
            }
            os.kill(pid, signal.SIGTERM)

        async with anyio.create_task_group() as tg:
            tg.start_soon(inspect)
            result = await self.run(
                "import subprocess, sys\n"
                f"subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)', {mark!r}])"
                ".returncode"
            )
        assert result.error is None, result.error
        assert result.return_value == -signal.SIGTERM
        (uid,) = set(seen["uid"])  # the same in all four slots
        assert uid != 0
        if os.geteuid() == 0:
            assert self.leased(uid), uid
        assert seen["capeff"] == 0 and seen["capprm"] == 0
        assert seen["nnp"] == "1"
        assert all(seen["own"].values()), seen["own"]

    @applies(root_identity)
    @pytest.mark.anyio
    async def test_two_running_executions_run_as_distinct_uids(self) -> None:
        needs_root()
        marks = [marker(), marker()]
        async with self.sandbox() as sandbox, anyio.create_task_group() as tg:
            for mark in marks:
                tg.start_soon(partial(sandbox.run, secret_holder(mark, "x"), profile=self.profile))
            pids = [(await wait_for_pids(mark))[0] for mark in marks]
            uids = [uids_of(pid) for pid in pids]
            tg.cancel_scope.cancel()
        # Each process under one uid in all four slots, leased, and not the same for both.
        assert all(len(set(ids)) == 1 for ids in uids), uids
        first, second = uids[0][0], uids[1][0]
        assert first != second, f"both executions ran as host uid {first}"
        assert self.leased(first) and self.leased(second)
        assert pids_with(marks[0]) == [] and pids_with(marks[1]) == []

    async def spy_on_a_running_execution(
        self, options: dict[str, Any], plain: dict[str, Any]
    ) -> tuple[str, list[ExecutionResult], list[str]]:
        """Run a holder, then spies from this backend and from a program on the host (the
        plain profile) while it runs: the secret, the spies' results and the host's record
        of opens of the secret."""
        assert self.workspace_path is not None
        mark, secret = marker(), "SECRET-" + marker()
        async with (
            self.sandbox(options=options, plain=plain) as sandbox,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(partial(sandbox.run, secret_holder(mark, secret), profile=self.profile))
            (pid,) = await wait_for_pids(mark)
            # The host (root) reaches the secret's inode through the holder's own root, and
            # watches it: any spy that opens it is seen, whatever path it took.
            path = f"/proc/{pid}/root{self.workspace_path}/secret.txt"
            with opens_of(path) as opened:
                spies = [
                    await sandbox.run(SECRET_SPY, profile=self.profile),
                    await sandbox.run(SECRET_SPY, profile=self.PLAIN),
                ]
            # The control: the secret was there all along, and the watch sees an open.
            with opens_of(path) as control, open(path) as fh:
                assert fh.read() == secret
            assert control
            tg.cancel_scope.cancel()
        return secret, spies, opened

    @applies(lambda cls: root_identity(cls) and cls.workspace_path is not None)
    @pytest.mark.anyio
    async def test_a_program_in_another_execution_cannot_read_a_running_workspace(self) -> None:
        needs_root()
        secret, spies, opened = await self.spy_on_a_running_execution({}, {})
        for spy in spies:
            assert spy.error is None, spy.error
            assert "looked at" in spy.stdout
            assert spy.return_value == []
            assert secret not in spy.stdout + spy.stderr + repr(spy.return_value)
        # Seen from the host: nothing but the host itself opened the secret's inode.
        assert opened == []

    @applies(
        lambda cls: (
            root_identity(cls)
            and cls.workspace_path is not None
            and cls.shared_identity is not None
        )
    )
    @pytest.mark.anyio
    async def test_with_one_shared_identity_a_host_program_does_read_it(self) -> None:
        """The control for the test above, and why the shared identity is the weaker setting:
        the same spy, with every execution under the one identity, reads the secret."""
        needs_root()
        assert self.shared_identity is not None
        options, (uid, gid) = self.shared_identity
        secret, spies, opened = await self.spy_on_a_running_execution(
            options, {"drop_to_uid": uid, "drop_to_gid": gid}
        )
        inside, plain = spies
        # The boundary's pid namespace hides the holder from a program in another one...
        assert inside.return_value == []
        # ... but not from a program on the host under the same uid.
        assert plain.return_value and plain.return_value == [secret] * len(plain.return_value)
        assert opened

    @applies(lambda cls: "identity" in cls.enforced and cls.identity_options)
    @pytest.mark.anyio
    async def test_state_planted_under_the_uid_is_gone_from_the_host(self) -> None:
        needs_root()
        with own_uid(1_970_000_000 + secrets.randbelow(1_000_000)) as options:
            uid, mark = options["identity_first_uid"], marker("psych-left")
            with host_targets(mark) as (target, target_dir):
                async with self.sandbox(options=options) as sandbox:
                    planted = await sandbox.run(
                        planting_program(mark, target, target_dir), profile=self.profile
                    )
                # The Sandbox closed: its execution is over, its teardown included (a result
                # may come back before its teardown has finished).
                assert planted.error is None, planted.error
                done = json.loads(planted.return_value)
                # Planted in the execution's own IPC namespace and temporary directory...
                assert all(done[kind] for kind in ("shm", "msg", "sem", "/tmp")), done
                # ...and none of it is on the host once the execution is over (keys are
                # collected by the kernel in the background).
                assert host_leftovers(mark, uid) in ([], ["keys"])
                # This process is a child subreaper during the test (see the fixture): an
                # orphan a backend leaves to the system's init (bwrap's namespace init) is
                # this process's to reap, and until then its zombie holds the uid's keys.
                me = os.getpid()
                reap_children(
                    {
                        p.pid
                        for p in host_processes().values()
                        if p.ppid == me and not p.alive and uid in p.uids
                    }
                )
                with anyio.move_on_after(10):
                    while has_keys(uid):
                        await anyio.sleep(0.05)
                assert not has_keys(uid)
                async with self.sandbox(options=options) as sandbox:
                    found = await sandbox.run(finding_program(mark), profile=self.profile)
        assert found.error is None, found.error
        assert json.loads(found.return_value) == []
