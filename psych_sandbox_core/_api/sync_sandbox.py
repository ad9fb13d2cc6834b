"""The synchronous front door: a :class:`SyncSandbox` is a :class:`Sandbox` for code that
has no event loop of its own.

Each SyncSandbox runs one event loop, on one thread of its own (anyio's blocking portal), and
the Sandbox lives on it for the SyncSandbox's whole life; every call is handed to that loop
and waited for. Closing it (``close()``, the end of ``with``, or the finaliser when it is
dropped unclosed) cancels what is still running, waits for the teardown, stops the loop and
joins the thread, so nothing it started outlives it.

A Ctrl-C (KeyboardInterrupt) in the thread waiting on :meth:`SyncSandbox.run` cancels that
execution, waits until it is torn down (processes, workspace, everything; further Ctrl-Cs
meanwhile are absorbed, as the teardown is bounded), and is then re-raised.
"""

from __future__ import annotations

import functools
import signal
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.abc
from anyio.from_thread import BlockingPortal, start_blocking_portal

from .._bindings.bindings import BindingProvider
from .._bindings.runlog import RunLog
from .._engine.pool import WarmStatus
from .._engine.program import Inputs
from .._output.attachments import DEFAULT_RUNS_IN_MEMORY, DEFAULT_WINDOW_BYTES, Window
from .._output.blobstore import BlobStore
from .._output.paging import DEFAULT_SEARCH_DEADLINE_SECONDS
from .._output.pattern_search import SearchResult
from .._output.streaming import OutputChunk
from .._policy.config import ConfigSource
from .._policy.narrowing import ExecutionRequest, TenantPolicy
from .._policy.registry import BackendRegistry
from .._policy.selection import Selection
from ..errors import SandboxClosedError
from ..result import ExecutionResult
from .sandbox import Sandbox

T = TypeVar("T")


class Cancellation:
    """Cancels the executions it was passed to (``run(..., cancel=...)``), from any thread.

    Made by :meth:`SyncSandbox.cancellation`; an execution it cancels ends with the error
    kind ``cancelled``. Once cancelled it stays cancelled.
    """

    def __init__(self, loop: _Loop, event: anyio.Event) -> None:
        self._loop = loop
        self._event = event

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        self._loop.set(self._event)


@dataclass(eq=False)
class _Running:
    """One execution in flight: how to cancel it and how to wait for its end."""

    cancel: anyio.Event
    done: Future[ExecutionResult] | None = None


class _Loop:
    """The event loop thread, the Sandbox entered on it, and the executions in flight.

    Holds no reference to the SyncSandbox, so the SyncSandbox's finaliser can close it."""

    def __init__(self, backend: str) -> None:
        self.lock = threading.Lock()
        self.closed = False
        self.in_flight: list[_Running] = []
        self._serving: Future[None] | None = None
        self._stop_serving: anyio.Event | None = None
        self._portal_cm = start_blocking_portal(backend, name="psych-sandbox-loop")
        self.portal: BlockingPortal = self._portal_cm.__enter__()
        try:
            self.thread: threading.Thread = self.portal.call(threading.current_thread)
            self.thread_id = self.thread.ident
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise

    def enter(self, sandbox: Sandbox) -> None:
        """Enter ``sandbox`` in a task of its own that holds it open until close."""
        self._serving, self._stop_serving = self.portal.start_task(_serve, sandbox)

    def set(self, event: anyio.Event) -> None:
        if threading.get_ident() == self.thread_id:
            event.set()
            return
        try:
            self.portal.call(event.set)
        except RuntimeError:
            pass  # the loop has stopped: nothing is left running to cancel

    def close(self) -> None:
        """Cancel what runs, wait for it and for the Sandbox's exit, stop the loop. A Ctrl-C
        meanwhile does not cut that short: it is raised once everything is closed."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            running = list(self.in_flight)
        if threading.get_ident() == self.thread_id:
            # Dropped on the loop thread itself (from a binding, say): a thread cannot wait
            # for its own end, so a short-lived helper closes it and then ends too.
            threading.Thread(
                target=self._shutdown, args=(running,), name="psych-sandbox-close"
            ).start()
            return
        with _interrupts_deferred() as deferred:
            if self._shutdown(running):
                deferred.append(True)

    def _shutdown(self, running: list[_Running]) -> bool:
        interrupted = False
        for run in running:
            interrupted |= _absorbing(functools.partial(self.set, run.cancel))
            if run.done is not None:
                interrupted |= _absorbing(run.done.result)
        stop, serving = self._stop_serving, self._serving
        if stop is not None and serving is not None:
            # The Sandbox's exit tears down its warm children.
            interrupted |= _absorbing(functools.partial(self.set, stop))
            interrupted |= _absorbing(serving.result)
        # Stops the loop (nothing is left running on it) and joins its thread; joined again
        # in case a Ctrl-C cut the first join short.
        interrupted |= _absorbing(functools.partial(self._portal_cm.__exit__, None, None, None))
        interrupted |= _absorbing(self.thread.join)
        return interrupted


async def _serve(sandbox: Sandbox, *, task_status: anyio.abc.TaskStatus[anyio.Event]) -> None:
    async with sandbox:
        stop = anyio.Event()
        task_status.started(stop)
        await stop.wait()


@contextmanager
def _interrupts_deferred() -> Iterator[list[bool]]:
    """Inside, a Ctrl-C is recorded rather than raised, and raised on leaving (once), so a
    cleanup is never cut off between two of its steps. Only where Python's own SIGINT handler
    is installed and this is the main thread (elsewhere, and for a handler the application
    installed, nothing changes; the steps still absorb interrupts one by one)."""
    seen: list[bool] = []
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield seen
        if seen:
            raise KeyboardInterrupt
        return
    signal.signal(signal.SIGINT, lambda signum, frame: seen.append(True))
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if seen:
        raise KeyboardInterrupt


def _absorbing(wait: Callable[[], object]) -> bool:
    """Run a blocking step to its end, whatever Ctrl-Cs arrive meanwhile (it is retried; each
    step is idempotent or a wait); True if one did. Other failures end the step."""
    interrupted = False
    while True:
        try:
            wait()
            return interrupted
        except KeyboardInterrupt:
            interrupted = True
        except BaseException:
            return interrupted


class SyncSandbox:
    """Runs untrusted programs from synchronous code, with :class:`Sandbox`'s semantics.

    Use as ``with SyncSandbox() as sandbox: result = sandbox.run(source)``. Safe to call from
    several threads at once: their executions run concurrently on the SyncSandbox's loop.
    ``async_backend`` is the event loop it runs (``"asyncio"`` or ``"trio"``); every other
    argument is :class:`Sandbox`'s.
    """

    def __init__(
        self,
        config: ConfigSource = None,
        *,
        registry: BackendRegistry | None = None,
        run_log: RunLog | None = None,
        blob_store: BlobStore | None = None,
        pattern_deadline_seconds: float = DEFAULT_SEARCH_DEADLINE_SECONDS,
        attachment_runs_in_memory: int = DEFAULT_RUNS_IN_MEMORY,
        async_backend: str = "asyncio",
    ) -> None:
        loop = _Loop(async_backend)
        self._loop = loop
        self._finalizer = weakref.finalize(self, loop.close)
        try:
            # Made on the loop, where its locks and events belong. Invalid configuration
            # raises here, as Sandbox's constructor does.
            self._sandbox: Sandbox = loop.portal.call(
                functools.partial(
                    Sandbox,
                    config,
                    registry=registry,
                    run_log=run_log,
                    blob_store=blob_store,
                    pattern_deadline_seconds=pattern_deadline_seconds,
                    attachment_runs_in_memory=attachment_runs_in_memory,
                )
            )
            loop.enter(self._sandbox)
        except BaseException:
            self._finalizer()
            raise

    def __enter__(self) -> SyncSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancel what is still running, wait for its teardown, stop the loop thread."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._loop.closed

    def cancellation(self) -> Cancellation:
        """A handle that cancels, from any thread, the runs it is passed to."""
        return Cancellation(self._loop, self._call(_new_event))

    def run(
        self,
        source: str,
        *,
        profile: str | None = None,
        timeout: float | None = None,
        bindings: BindingProvider | None = None,
        request: ExecutionRequest | None = None,
        policy: TenantPolicy | None = None,
        tenant: str = "default",
        run_id: str | None = None,
        cancel: Cancellation | None = None,
        require_preservation: bool = False,
        inputs: Inputs | None = None,
        on_output: Callable[[OutputChunk], None] | None = None,
        preamble: str | None = None,
        variables: Mapping[str, Any] | None = None,
        keep_variables: bool = False,
    ) -> ExecutionResult:
        """Run one program and wait for its result (see :meth:`Sandbox.run`).
        ``on_output`` is called in a worker thread, never in the caller's.

        A KeyboardInterrupt while waiting cancels the execution, waits for its teardown and
        is re-raised.
        """
        return self._execution(
            "run",
            functools.partial(
                self._sandbox.run,
                source,
                profile=profile,
                timeout=timeout,
                bindings=bindings,
                request=request,
                policy=policy,
                tenant=tenant,
                run_id=run_id,
                require_preservation=require_preservation,
                inputs=inputs,
                on_output=on_output,
                preamble=preamble,
                variables=variables,
                keep_variables=keep_variables,
            ),
            cancel,
        )

    def exec(
        self,
        command: str | Sequence[str],
        *,
        shell: bool = False,
        profile: str | None = None,
        timeout: float | None = None,
        request: ExecutionRequest | None = None,
        policy: TenantPolicy | None = None,
        tenant: str = "default",
        run_id: str | None = None,
        cancel: Cancellation | None = None,
        require_preservation: bool = False,
        inputs: Inputs | None = None,
        on_output: Callable[[OutputChunk], None] | None = None,
    ) -> ExecutionResult:
        """Run one command and wait for its result (see :meth:`Sandbox.exec`); a
        KeyboardInterrupt cancels it as it does a run, and ``on_output`` is called as for
        :meth:`run`."""
        return self._execution(
            "exec",
            functools.partial(
                self._sandbox.exec,
                command,
                shell=shell,
                profile=profile,
                timeout=timeout,
                request=request,
                policy=policy,
                tenant=tenant,
                run_id=run_id,
                require_preservation=require_preservation,
                inputs=inputs,
                on_output=on_output,
            ),
            cancel,
        )

    def _execution(
        self,
        name: str,
        start: Callable[..., Awaitable[ExecutionResult]],
        cancel: Cancellation | None,
    ) -> ExecutionResult:
        """Run one execution on the loop's thread and wait for it, cancelling it (and
        waiting for its teardown) on a KeyboardInterrupt."""
        loop = self._loop
        if threading.get_ident() == loop.thread_id:
            # An async binding blocking its own loop on a run that loop must drive.
            raise RuntimeError(f"SyncSandbox.{name}() cannot be called from its own event loop")
        if cancel is None:
            cancel = self.cancellation()
        elif cancel._loop is not self._loop:
            raise ValueError("that Cancellation belongs to another SyncSandbox")
        event = cancel._event
        call = functools.partial(start, cancel=event)
        running = _Running(event)
        try:
            with loop.lock:
                if loop.closed:
                    raise SandboxClosedError(f"{name}() called on a closed SyncSandbox")
                # Registered and started under the lock: close() either sees it and cancels
                # it, or came first and it never starts.
                loop.in_flight.append(running)
                running.done = loop.portal.start_task_soon(call)
            return running.done.result()
        except KeyboardInterrupt:
            if running.done is not None:
                # Cancel it and wait until it is torn down; then the interrupt goes on.
                with _interrupts_deferred():
                    _absorbing(cancel.cancel)
                    _absorbing(running.done.result)
            raise
        finally:
            with loop.lock:
                if running in loop.in_flight:
                    loop.in_flight.remove(running)

    def warmed(self, profile: str) -> None:
        """Wait until ``profile`` has a prepared child waiting (see :meth:`Sandbox.warmed`)."""
        self._call(functools.partial(self._sandbox.warmed, profile))

    def warm_status(self, profile: str) -> WarmStatus | None:
        """The warm pool of ``profile`` as it stands (see :meth:`Sandbox.warm_status`)."""

        async def read() -> WarmStatus | None:
            return self._sandbox.warm_status(profile)

        return self._call(read)

    def profile_names(self) -> list[str]:
        return self._sandbox.profile_names()

    def default_selection(self) -> Selection:
        """What ``default`` runs on this host (see :meth:`Sandbox.default_selection`)."""
        return self._call(self._sandbox.default_selection)

    def read_attachment(
        self,
        handle: str,
        *,
        run_id: str,
        tenant: str = "default",
        offset: int = 0,
        length: int = DEFAULT_WINDOW_BYTES,
    ) -> Window:
        """A window of an attachment this run recorded (see :meth:`Sandbox.read_attachment`)."""
        return self._call(
            functools.partial(
                self._sandbox.read_attachment,
                handle,
                run_id=run_id,
                tenant=tenant,
                offset=offset,
                length=length,
            )
        )

    def search_attachment(
        self,
        handle: str,
        pattern: str,
        *,
        run_id: str,
        tenant: str = "default",
        ignore_case: bool = False,
        max_matches: int = 100,
    ) -> SearchResult:
        """Pattern matches in an attachment (see :meth:`Sandbox.search_attachment`)."""
        return self._call(
            functools.partial(
                self._sandbox.search_attachment,
                handle,
                pattern,
                run_id=run_id,
                tenant=tenant,
                ignore_case=ignore_case,
                max_matches=max_matches,
            )
        )

    def _call(self, func: Callable[[], Awaitable[T]]) -> T:
        loop = self._loop
        if loop.closed:
            raise SandboxClosedError("called on a closed SyncSandbox")
        try:
            return loop.portal.call(func)
        except RuntimeError:
            if loop.closed:
                raise SandboxClosedError("called on a closed SyncSandbox") from None
            raise


async def _new_event() -> anyio.Event:
    return anyio.Event()  # on the loop, where it is waited for
