"""Starting a child: the command line that runs the bootstrap, and the wait for it to come up.

Every backend runs the same bootstrap with the same arguments, whatever starts it (a process,
bubblewrap, a container engine); and a backend whose launcher can fail before the bootstrap
runs (bwrap setting up mounts, an engine starting a container) waits for the first of two
things: the bootstrap reaching the channel, or the launcher ending. Written once here, for
the backend kit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import ByteReceiveStream

from ..child.loader import directory_arguments
from .backend import BackendUnavailable, Launched, LaunchRequest
from .exit_status import ExitStatus
from .late_terms import LateTerms
from .watchers import waited

#: How long a child may take to connect and report before the host gives up on it. Start-up
#: of a container runtime is the slowest case we know of (a few seconds cold).
HANDSHAKE_SECONDS = 30.0

#: How long a failed start's stderr is read for, at most, to quote it.
STDERR_READ_SECONDS = 1.0


class PassedFds(list[int]):
    """Descriptors the host opened for one child to be given at spawn (the compiled
    bootstrap's memory file: see bootstrap_argv). They are the host's own until then: close
    them once the child is spawned, and in teardown in case it never was (idempotent)."""

    def close(self) -> None:
        for fd in self:
            os.close(fd)
        self.clear()


def bootstrap_argv(
    interpreter: str,
    request: LaunchRequest,
    channel_spec: str,
    *,
    passed_fds: list[int] | None = None,
    directory: tuple[str, str] | None = None,
    late: LateTerms | None = None,
) -> list[str]:
    """The child's command line: ``interpreter`` in isolated, unbuffered mode, without the
    site module (the bootstrap does its part: see its _as_site_would), running the
    bootstrap, then the channel and probe arguments. ``passed_fds``: the descriptors the
    child is given, to which the compiled code's may be added (the caller closes it once
    the child is spawned; see bootstrap_loader.py). ``directory``, for a child whose
    interpreter the host cannot run (an image's): a directory of the host's (its path here,
    its path in the child) the child can read and never write, where the bootstrap is
    written for it. ``late``: the probe's targets come after the spawn, with these terms
    (pass ``late.child_fd`` to the child and deliver them once it is spawned); otherwise
    they are made now and go on the command line. Append backend-specific arguments
    (``pid-namespace=1`` and the like)."""
    return [
        interpreter,
        "-I",
        "-S",
        "-u",
        *(
            request.bootstrap_command(interpreter, passed_fds)
            if directory is None
            else directory_arguments(request.bootstrap_source, *directory)
        ),
        f"channel={channel_spec}",
        late.argument() if late is not None else probe_argument(request),
    ]


def probe_argument(request: LaunchRequest) -> str:
    """The probe's targets as one bootstrap argument."""
    return "probe=" + json.dumps(request.probe.as_json_object())


async def read_some(
    stream: ByteReceiveStream, limit: int, seconds: float = STDERR_READ_SECONDS
) -> str:
    """Up to ``limit`` bytes of ``stream`` within ``seconds``, decoded and stripped: enough of
    a launcher's stderr to say why it failed, never a wait on a stream that stays open."""
    data = b""
    with anyio.move_on_after(seconds):
        while len(data) < limit:
            try:
                data += await stream.receive(limit - len(data))
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                break
    return data.decode("utf-8", "replace").strip()


async def wait_started(
    launched: Launched,
    until_started: Callable[[], Awaitable[None]],
    started: Callable[[], bool],
    *,
    seconds: float,
    failure: Callable[[ExitStatus, str], str],
    stderr_bytes: int = 4096,
) -> None:
    """Return once ``until_started()`` returns (the bootstrap reached the channel), or after
    ``seconds`` (the handshake's deadline then decides). If the child exits first and
    ``started()`` still says it never started, finish it and raise BackendUnavailable with
    ``failure(status, head of its stderr)``: the backend could not start here, which is not
    the program's failure."""
    exited = False
    with anyio.move_on_after(seconds):
        async with anyio.create_task_group() as tg:

            async def starting() -> None:
                await until_started()
                tg.cancel_scope.cancel()

            async def exiting() -> None:
                nonlocal exited
                # Most children start: this watcher is then cancelled, and must leave
                # nothing of the launch behind it (watchers.py).
                if await waited(launched.wait_exited):
                    exited = True
                    tg.cancel_scope.cancel()

            tg.start_soon(starting)
            tg.start_soon(exiting)
    # Both may have happened: a child that reached the channel did start.
    if not exited or started():
        return
    status = await launched.finish()
    message = await read_some(launched.stderr, stderr_bytes)
    raise BackendUnavailable(failure(status, message or "it printed nothing"))
