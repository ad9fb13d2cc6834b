"""The conformance tests of command mode, for a backend that runs commands."""

from __future__ import annotations

import pytest
from psych_sandbox_core import ErrorKind, Guarantee, InvalidRequestError, Sandbox
from psych_sandbox_core._policy.registry import BackendRegistry

from ..host import marker
from ..programs import DAEMON
from .base import ConformanceBase
from .declarations import applies


class CommandTests(ConformanceBase):
    """Commands go through the same child and teardown as programs."""

    # Commands go through the same child and teardown as programs, on every loop alike:
    # once, on asyncio.

    @pytest.mark.anyio
    async def test_declares_whether_it_runs_commands(self) -> None:
        registry = self.registry() or BackendRegistry()
        assert registry.get(self.backend).cls.runs_commands is self.runs_commands

    @applies(lambda cls: cls.runs_commands)
    @pytest.mark.parametrize("anyio_backend", ["asyncio"])
    @pytest.mark.anyio
    async def test_a_command_runs_where_a_program_runs(self) -> None:
        python = await self.child_python()
        code = (
            "import sys\n"
            "print(open('in.txt').read(), sys.argv[1:])\n"
            "print('to stderr', file=sys.stderr)\n"
            "sys.stdout.write('x' * 10000)\n"
            "sys.exit(3)\n"
        )
        # Not a shell: the argument's $, ; and backquotes reach the command as they are.
        result = await self.exec(
            [python, "-c", code, "$HOME; `id`"],
            inputs={"in.txt": b"given"},
            stdout_bytes=4096,
        )
        assert result.error is None, result.error
        assert result.exit_status == 3
        assert result.stdout.startswith("given ['$HOME; `id`']\n")
        assert result.stderr == "to stderr\n"
        # Held to the stream's cap, and the count of what was written exact (a relay that
        # carries only a capped head and tail across still counts the rest).
        info = result.stdout_info
        written = len("given ['$HOME; `id`']\n") + 10000
        assert info.captured_bytes <= 4096 < info.total_bytes == written, info
        assert info.dropped_bytes > 0
        assert result.return_value is None
        assert result.level == self.level
        for guarantee in sorted(self.enforced):
            assert result.grades[Guarantee(guarantee)] == "enforced", (guarantee, result.grades)

    @applies(lambda cls: cls.runs_commands)
    @pytest.mark.parametrize("anyio_backend", ["asyncio"])
    @pytest.mark.anyio
    async def test_a_command_past_its_wall_clock_is_killed_with_its_whole_tree(self) -> None:
        python = await self.child_python()
        mark = marker()
        result, seen = await self._watching(
            mark,
            self.exec(
                [python, "-c", DAEMON.format(mark=mark) + "while True:\n    time.sleep(1)\n"],
                wall_seconds=1.0,
                grace_seconds=0.2,
            ),
        )
        assert result.error is not None
        assert result.error.kind is ErrorKind.TIMEOUT, result.error
        assert result.exit_status is None
        if self.processes_visible:
            assert seen, "the command's detached daemon was never seen running"
        self._nothing_left(mark)

    @applies(lambda cls: cls.runs_commands)
    @pytest.mark.parametrize("anyio_backend", ["asyncio"])
    @pytest.mark.anyio
    async def test_a_string_is_run_by_a_shell_only_when_asked(self) -> None:
        async with Sandbox(self.config(), registry=self.registry()) as sandbox:
            with pytest.raises(InvalidRequestError):
                await sandbox.exec("echo $((6 * 7))", profile=self.profile)
            result = await sandbox.exec("echo $((6 * 7)); exit 4", shell=True, profile=self.profile)
        assert result.error is None, result.error
        if self.has_shell:
            assert (result.stdout, result.exit_status) == ("42\n", 4)
        else:
            assert result.exit_status == 127
            assert "not found" in result.stderr
