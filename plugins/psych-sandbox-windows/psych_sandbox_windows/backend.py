"""The windows backend: the process level on Windows, with a Job Object per execution.

The child is started suspended, put in a Job Object of its own (jobobject.py) and only then
resumed, so nothing it runs ever runs outside the job: active-process, job-memory and job-CPU
limits, every UI restriction, no breakaway, and kill-on-job-close, so no descendant outlives
the handle. The control channel is a loopback socket with a one-time token
(psych_sandbox_core.kit.channel_loopback); the bootstrap source and the token reach the child on
its stdin, which is then closed: a Windows command line holds 32767 characters, less than the
bootstrap, and neither belongs where other processes can read it. The environment is built
from an allow-list; the working directory is a fresh private directory.

What it cannot do, and says so in the grades (the plugin's README):

- The child runs as the worker's own account: identity is unavailable, and the program can
  reach the worker's processes (and the job's handle in them), so the job's limits, the
  process tree and the wall clock are unverified rather than enforced.
- No filesystem confinement, no network denial: both unavailable.
- No file-size limit exists for a job: unavailable.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import anyio.abc
from psych_sandbox_core.kit import (
    Backend,
    BackendRegistrar,
    BackendUnavailable,
    ErrorKind,
    ExitStatus,
    InterpreterOptions,
    Launched,
    LaunchRequest,
    Level,
    LoopbackTokenChannel,
    Mechanisms,
    child_environment,
    hookimpl,
)

from .jobobject import (
    CREATE_NO_WINDOW,
    CREATE_SUSPENDED,
    EXIT_JOB_TIME_EXCEEDED,
    JobApi,
    JobObject,
    Win32JobApi,
    job_limits,
)

#: The platform this backend serves, as sys.platform names it.
PLATFORM = "win32"
#: Largest bootstrap the loader accepts on stdin (the bootstrap is about 60 KiB).
MAX_BOOTSTRAP_BYTES = 4 * 1024 * 1024

#: Read from stdin: a decimal length and a newline, that many bytes of bootstrap source, then
#: run it as ``__main__`` with the arguments it was given. Reads exactly what it needs with
#: os.read, so the token line after the source stays on stdin for the bootstrap to read.
LOADER = (
    "import os,sys\n"
    "def _r(n):\n"
    "    b=b''\n"
    "    while len(b)<n:\n"
    "        c=os.read(0,n-len(b))\n"
    "        if not c: raise SystemExit('psych-sandbox: bootstrap cut short on stdin')\n"
    "        b+=c\n"
    "    return b\n"
    "_h=b''\n"
    "while not _h.endswith(b'\\n'):\n"
    "    _h+=_r(1)\n"
    f"    if len(_h)>{len(str(MAX_BOOTSTRAP_BYTES)) + 1}: raise SystemExit('bad length')\n"
    "_n=int(_h)\n"
    f"if not 0<_n<={MAX_BOOTSTRAP_BYTES}: raise SystemExit('psych-sandbox: bad length')\n"
    "_c=compile(_r(_n),'<bootstrap>','exec',dont_inherit=True)\n"
    "del _r,_h,_n\n"
    "exec(_c,{'__name__':'__main__','__builtins__':__builtins__})\n"
)


def requires_windows() -> str | None:
    """Why this host cannot run the backend at all, or None on Windows."""
    if sys.platform != PLATFORM:
        return f"requires Windows (Job Objects); this host is {sys.platform}"
    return None


def stdin_payload(bootstrap_source: str, channel: LoopbackTokenChannel) -> bytes:
    """What the child reads on stdin: the bootstrap for LOADER, then the channel's token."""
    source = bootstrap_source.encode("utf-8")
    return str(len(source)).encode("ascii") + b"\n" + source + channel.child_stdin


def windows_environment(temp: str) -> dict[str, str]:
    """The child's whole environment, built from nothing: its temporary directory under every
    name Windows programs read it by, and SystemRoot, without which the interpreter cannot
    start Winsock (and so the channel)."""
    return {
        "SYSTEMROOT": os.environ.get("SYSTEMROOT", r"C:\Windows"),
        "TEMP": temp,
        "TMP": temp,
        **child_environment(temp),
    }


class WindowsOptions(InterpreterOptions):
    # interpreter: a path or a name on PATH (None: this process's own interpreter); or
    # environment: a virtual environment or prefix whose own python runs.
    pass


class WindowsBackend(
    Backend[WindowsOptions],
    id="windows",
    # Never isolated: the program runs as the worker's own account.
    claims=Level.PROCESS,
):
    def __init__(
        self, options: WindowsOptions, *, job_api: Callable[[], JobApi] = Win32JobApi
    ) -> None:
        super().__init__(options)
        self._job_api = job_api
        self.interpreter: str | None = None
        if requires_windows() is not None:
            # Installed on another platform: nothing to resolve; unavailable_reason says why.
            return
        base = getattr(sys, "_base_executable", None) or sys.executable
        self.interpreter = options.child_interpreter(
            reachable_by_any_uid=False,
            runner="the program",
            candidates=[os.path.realpath(base)],
            bound_read_only=False,
        ).executable

    def unavailable_reason(self) -> str | None:
        return requires_windows()

    @staticmethod
    def mechanisms(limits_memory: bool) -> Mechanisms:
        return Mechanisms(
            # The job holds the whole tree; but the program runs as the worker's account and
            # can open the worker's processes (and take the job's handle from them).
            process_tree_boundary=True,
            process_group=False,
            supervisor_reachable=True,
            rlimits=False,
            memory_cgroup=limits_memory,
            pids_cgroup=True,
            cpu_limit_outside=True,
        )

    @asynccontextmanager
    async def launch(self, request: LaunchRequest) -> AsyncIterator[Launched]:
        reason = self.unavailable_reason()
        if reason is not None or self.interpreter is None:
            raise BackendUnavailable(reason or "no interpreter")
        try:
            api = self._job_api()
            job = JobObject.create(api, job_limits(request.limits))
        except OSError as exc:
            raise BackendUnavailable(f"no Job Object could be made: {exc}") from exc
        workspace = tempfile.mkdtemp(prefix="psych-ws-")
        channel = LoopbackTokenChannel()
        process: anyio.abc.Process | None = None
        adopted = False
        try:
            await channel.open()
            argv = [
                self.interpreter,
                "-I",
                "-u",
                "-c",
                LOADER,
                f"channel={channel.child_spec}",
                "probe=" + json.dumps(request.probe.as_json_object()),
            ]
            try:
                process = await anyio.open_process(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=workspace,
                    env={**windows_environment(workspace), **request.environment},
                    creationflags=CREATE_SUSPENDED | CREATE_NO_WINDOW,
                )
                # Suspended until it is in the job: nothing it starts can be outside it.
                job.adopt_suspended(process.pid)
                adopted = True
                assert process.stdin is not None
                await process.stdin.send(stdin_payload(request.bootstrap_source, channel))
                await process.stdin.aclose()
            except (OSError, anyio.BrokenResourceError) as exc:
                raise BackendUnavailable(
                    f"the child could not be started in its job: {exc}"
                ) from exc
            launched = _Launched(
                process, job, channel, self.mechanisms(request.limits.memory_bytes is not None)
            )
            # No artifacts: the host's walk (and the bootstrap's) opens directories by
            # descriptor without following links, which Windows cannot do; a run that asks
            # for artifacts gets artifacts_unavailable rather than a walk that could follow a
            # junction out of the workspace.
            launched.workspace_path = None
            yield launched
        finally:
            # Shielded: a cancelled run must still end the job, reap and remove its workspace.
            with anyio.CancelScope(shield=True):
                job.close()
                if process is not None:
                    if not adopted:
                        # Still suspended outside the job, which cannot end it.
                        with suppress(OSError):
                            process.kill()
                    await process.wait()
                    await process.aclose()
                await channel.aclose()
                await anyio.to_thread.run_sync(remove_workspace, workspace)


class _Launched(Launched):
    def __init__(
        self,
        process: anyio.abc.Process,
        job: JobObject,
        channel: LoopbackTokenChannel,
        mechanisms: Mechanisms,
    ) -> None:
        assert process.stdout is not None and process.stderr is not None
        self.process = process
        self.job = job
        self.channel = channel
        self.mechanisms = mechanisms
        self.stdout = process.stdout
        self.stderr = process.stderr
        self._status: ExitStatus | None = None

    async def wait_exited(self) -> None:
        await self.process.wait()

    async def terminate(self, grace_seconds: float) -> None:
        # No polite signal reaches a whole job on Windows, and nothing in an untrusted tree is
        # worth a grace window: the job ends at once.
        with suppress(OSError):
            self.job.terminate()
        await self.process.wait()

    async def finish(self) -> ExitStatus:
        if self._status is not None:
            return self._status
        with suppress(OSError):
            self.job.terminate()
        with anyio.CancelScope(shield=True):
            code = await self.process.wait()
        hint: tuple[ErrorKind, str] | None = None
        if code == EXIT_JOB_TIME_EXCEEDED:
            hint = (
                ErrorKind.TIMEOUT,
                "the program's process tree used up its CPU budget (the Job Object's CPU time "
                "limit ended it)",
            )
        self._status = ExitStatus(
            code=code, signal=None, cpu_seconds=None, peak_memory_bytes=None, failure_hint=hint
        )
        return self._status


def remove_workspace(path: str) -> None:
    """Delete the workspace without following a link or junction out of it (shutil.rmtree
    does not, on Windows, since Python 3.8), clearing read-only attributes it meets."""

    def clear_read_only(function: Callable[..., Any], name: str, *_: Any) -> None:
        with suppress(OSError):
            os.chmod(name, stat.S_IWRITE)
            function(name)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=clear_read_only)
    else:
        shutil.rmtree(path, onerror=clear_read_only)


@hookimpl
def psych_sandbox_register_backends(registry: BackendRegistrar) -> None:
    registry.add(WindowsBackend)
