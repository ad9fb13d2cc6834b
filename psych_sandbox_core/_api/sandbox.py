"""The public API: a Sandbox runs one program per call under a named profile."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import anyio
from anyio.abc import TaskGroup

from .._bindings.bindings import BindingProvider
from .._bindings.runlog import MemoryRunLog, RunLog, SQLiteRunLog
from .._engine.host import execute
from .._engine.pool import AUTOMATIC_SIZE, WarmPool, WarmSettings, WarmStatus
from .._engine.program import Inputs, Program, command_program, python_program
from .._output.attachments import (
    DEFAULT_RUNS_IN_MEMORY,
    DEFAULT_WINDOW_BYTES,
    AttachmentLedger,
    Window,
)
from .._output.blobstore import BlobStore
from .._output.paging import DEFAULT_SEARCH_DEADLINE_SECONDS, SearchSettings
from .._output.pattern_search import SearchResult
from .._output.streaming import OutputCallback, relaying
from .._policy.config import ConfigSource, check_config, resolve_config
from .._policy.narrowing import ExecutionRequest, TenantPolicy, request_for
from .._policy.registry import BackendRegistry
from .._policy.selection import Selection
from .._policy.selection_cache import SelectionCache
from .._policy.state import state_directory
from ..errors import ConfigurationError, ErrorKind, SandboxClosedError
from ..grading import level_at_least
from ..result import ExecutionResult
from .loading import LoadedProfile, ProfileLoader
from .planning import plan_execution, with_notes


def default_run_log_path() -> str:
    """Where the embedded durable run log lives: $PSYCH_SANDBOX_RUN_LOG, else the user's
    state directory ($XDG_STATE_HOME or ~/.local/state)/psych-sandbox/run-log.sqlite."""
    explicit = os.environ.get("PSYCH_SANDBOX_RUN_LOG")
    if explicit:
        return explicit
    try:
        directory = state_directory()
    except OSError as exc:
        raise ConfigurationError(
            f"cannot create the run log directory {exc.filename}: {exc.strerror}; pass "
            "run_log= or set PSYCH_SANDBOX_RUN_LOG"
        ) from None
    return os.path.join(directory, "run-log.sqlite")


class Sandbox:
    """Runs untrusted programs. One fresh process per :meth:`run`; nothing survives a run.

    Use as ``async with Sandbox() as sandbox: result = await sandbox.run(source)``.
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
        selection_cache: SelectionCache | None = None,
    ) -> None:
        # Binding calls are counted per run in a run log. A run that spans executions (an
        # explicit run_id) is counted in a durable log, so a host that crashes and restarts
        # cannot hand the run a fresh allowance: run_log if given, else the embedded SQLite
        # file (see default_run_log_path). A run of one execution is counted in memory.
        # Results over the per-call ceiling are paged through blob_store when there is one.
        self._configured_run_log = run_log
        self._durable_run_log: RunLog | None = run_log
        self._ephemeral_run_log: RunLog = run_log or MemoryRunLog()
        self.blob_store = blob_store
        # Every run's attachment handles (streams, return values, artifacts); see attachments.py.
        # With a blob store they are durable there and memory keeps only the latest runs.
        try:
            self.attachments = AttachmentLedger(
                blob_store, runs_in_memory=attachment_runs_in_memory
            )
        except ValueError as error:
            raise ConfigurationError(str(error)) from None
        if not pattern_deadline_seconds > 0:
            raise ConfigurationError("pattern_deadline_seconds must be positive")
        self._search = SearchSettings(deadline_seconds=pattern_deadline_seconds)
        # A DeploymentConfig, a TOML path, or None (then $PSYCH_SANDBOX_CONFIG, if set).
        # Invalid configuration fails here, at construction, not at the first run.
        self.config = resolve_config(config)
        self.registry = registry or BackendRegistry()
        check_config(self.config, self.registry)
        self._profiles = ProfileLoader(self.config, self.registry, selection_cache)
        self._closed = False
        # Warm children live in a task group that exists only inside ``async with``.
        self._task_group: TaskGroup | None = None
        self._pools: dict[str, WarmPool] = {}

    async def __aenter__(self) -> Sandbox:
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
        task_group, self._task_group = self._task_group, None
        if task_group is not None:
            # Prepared children that never got a program are torn down here.
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._configured_run_log is None:
            # Ours to close: the in-memory log, and the durable one if a run opened it.
            await self._ephemeral_run_log.aclose()
            if self._durable_run_log is not None:
                await self._durable_run_log.aclose()
        self._pools.clear()

    def profile_names(self) -> list[str]:
        return self._profiles.profile_names()

    async def run(
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
        cancel: anyio.Event | None = None,
        require_preservation: bool = False,
        inputs: Inputs | None = None,
        on_output: OutputCallback | None = None,
        preamble: str | None = None,
        variables: Mapping[str, Any] | None = None,
        keep_variables: bool = False,
    ) -> ExecutionResult:
        """Run one program. Raises only for misuse (closed sandbox, inputs it cannot take:
        InvalidRequestError) or configuration, or what ``on_output`` raised.

        The terms are the intersection of the backend's capability, ``policy``, ``request``
        (``timeout`` is a shortcut that narrows its wall clock) and the profile's caps. A
        request that cannot be met is a refusal on the result, never an exception.
        ``inputs`` maps file names to bytes or host paths: those files are in the program's
        workspace when it starts (see docs/embedding.md).
        ``on_output`` is handed the program's stdout and stderr while it runs (see
        streaming.py and docs/streaming.md); the result is the same with or without it.

        ``preamble`` is code run ahead of the program in its namespace, compiled apart (its
        frames are left out of tracebacks, which show the program's own lines);
        ``variables`` are names given to the program (JSON data); with ``keep_variables``
        the result's ``variables`` holds the program's global names that hold JSON data,
        for the next program. Preamble and variables count toward the program size limit.
        See docs/preamble.md.
        """
        if self._closed:
            raise SandboxClosedError("run() called on a closed Sandbox")
        build = partial(
            python_program,
            source,
            inputs=inputs,
            preamble=preamble,
            variables=variables,
            keep_variables=keep_variables,
        )
        return await self._execute(
            await _built(build, inputs),
            request_for(request, profile, timeout),
            bindings=bindings,
            policy=policy,
            tenant=tenant,
            run_id=run_id,
            cancel=cancel,
            require_preservation=require_preservation,
            on_output=on_output,
        )

    async def exec(
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
        cancel: anyio.Event | None = None,
        require_preservation: bool = False,
        inputs: Inputs | None = None,
        on_output: OutputCallback | None = None,
    ) -> ExecutionResult:
        """Run one command where a program would run: the same containment, limits, grades,
        output caps and workspace (command mode, docs/command-mode.md). ``command`` is an
        argument vector run without a shell; only with ``shell=True`` is it one string run
        by ``/bin/sh -c``. The result's ``exit_status`` is the command's when it ran to its
        own exit; a timeout, a limit or a refusal is its ``error`` as for a program, and a
        profile whose backend does not run commands is refused (policy_refused). Raises only
        for misuse (InvalidRequestError for a command or inputs no run can take), or what
        ``on_output`` (as for run) raised."""
        if self._closed:
            raise SandboxClosedError("exec() called on a closed Sandbox")
        build = partial(command_program, command, shell=shell, inputs=inputs)
        return await self._execute(
            await _built(build, inputs),
            request_for(request, profile, timeout),
            bindings=None,
            policy=policy,
            tenant=tenant,
            run_id=run_id,
            cancel=cancel,
            require_preservation=require_preservation,
            on_output=on_output,
        )

    async def _execute(
        self,
        program: Program,
        request: ExecutionRequest,
        *,
        bindings: BindingProvider | None,
        policy: TenantPolicy | None,
        tenant: str,
        run_id: str | None,
        cancel: anyio.Event | None,
        require_preservation: bool,
        on_output: OutputCallback | None,
    ) -> ExecutionResult:
        loaded = await self._load(request.profile)
        run_log = self._ephemeral_run_log if run_id is None else self._durable_log()
        plan, scope = await plan_execution(
            loaded,
            program,
            request,
            bindings=bindings,
            policy=policy,
            tenant=tenant,
            run_id=run_id,
            cancel=cancel,
            require_preservation=require_preservation,
            run_log=run_log,
            attachments=self.attachments,
            blob_store=self.blob_store,
            search=self._search,
        )
        pool = self._pool(loaded)
        try:
            async with relaying(on_output) as relay:
                plan = dataclasses.replace(plan, relay=relay)
                result = await (
                    pool.run(plan)
                    if pool is not None
                    else execute(loaded.backend, plan, self._task_group)
                )
        finally:
            if run_id is None and isinstance(run_log, MemoryRunLog):
                # The execution's own run is over with it: nothing can count against it again.
                run_log.forget(scope.run_id)
        if self._forget_stale_choice(loaded, result):
            # The remembered backend no longer starts here, so the program did not run:
            # choose again with trials and run it, as if nothing had been remembered.
            return await self._execute(
                program,
                request,
                bindings=bindings,
                policy=policy,
                tenant=tenant,
                run_id=run_id,
                cancel=cancel,
                require_preservation=require_preservation,
                on_output=on_output,
            )
        return with_notes(result, loaded.selection)

    def _forget_stale_choice(self, loaded: LoadedProfile, result: ExecutionResult) -> bool:
        """Forget a remembered choice of default's that this execution showed wrong here;
        True when the program did not run, so it may run on a fresh choice."""
        selection = loaded.selection
        if selection is None:
            return False
        not_ready = result.error is not None and result.error.kind is ErrorKind.BACKEND_NOT_READY
        weaker = bool(result.grades) and not level_at_least(result.level, selection.chosen.claims)
        if not self._profiles.forget_stale_choice(loaded, not_ready, weaker):
            return False
        self._pools.pop(loaded.name, None)
        return not_ready

    async def warmed(self, profile: str) -> None:
        """Wait until ``profile`` has a prepared child waiting for its program (at once when
        the profile keeps none warm, or outside ``async with``)."""
        pool = self._pool(await self._load(profile))
        if pool is not None:
            await pool.wait_ready()

    def warm_status(self, profile: str) -> WarmStatus | None:
        """The warm pool of ``profile`` as it stands (children waiting, being prepared, the
        memory they hold, its bounds); None while it has none (no run of the profile yet,
        ``warm = 0``, or outside ``async with``)."""
        pool = self._pools.get(profile)
        return None if pool is None else pool.status()

    def _pool(self, loaded: LoadedProfile) -> WarmPool | None:
        config = loaded.config
        if self._task_group is None or config.warm == 0:
            return None
        if config.warm is None and not type(loaded.backend).prepared_by_default:
            return None
        pool = self._pools.get(loaded.name)
        if pool is None:
            settings = WarmSettings(
                size=AUTOMATIC_SIZE if config.warm is None else config.warm,
                memory_bytes=config.warm_memory_bytes,
                idle_seconds=config.warm_idle_seconds,
                automatic=config.warm is None,
            )
            pool = WarmPool(loaded.backend, config.limits, settings, self._task_group)
            self._pools[loaded.name] = pool
        return pool

    @property
    def run_log(self) -> RunLog:
        """The log that counts calls of runs spanning executions (durable)."""
        return self._durable_log()

    def _durable_log(self) -> RunLog:
        if self._durable_run_log is None:
            self._durable_run_log = SQLiteRunLog(default_run_log_path())
        return self._durable_run_log

    async def read_attachment(
        self,
        handle: str,
        *,
        run_id: str,
        tenant: str = "default",
        offset: int = 0,
        length: int = DEFAULT_WINDOW_BYTES,
    ) -> Window:
        """A window of an attachment this run recorded; raises AttachmentDenied otherwise."""
        return await self.attachments.read(
            handle, tenant=tenant, run_id=run_id, offset=offset, length=length
        )

    async def search_attachment(
        self,
        handle: str,
        pattern: str,
        *,
        run_id: str,
        tenant: str = "default",
        ignore_case: bool = False,
        max_matches: int = 100,
    ) -> SearchResult:
        """Regular-expression matches in an attachment, searched in a killable child process."""
        return await self.attachments.search(
            handle,
            pattern,
            tenant=tenant,
            run_id=run_id,
            ignore_case=ignore_case,
            max_matches=max_matches,
        )

    async def _load(self, name: str) -> LoadedProfile:
        return await self._profiles.load(name)

    async def strongest_working_backend(self) -> str:
        """The backend ``default`` runs on this host (see :meth:`default_selection`)."""
        return (await self.default_selection()).chosen.backend_id

    async def default_selection(self) -> Selection:
        """What ``default`` runs on this host (see trials.select_default), or what a
        selection cache remembers it ran on recently."""
        return await self._profiles.default_selection()


async def _built(build: partial[Program], inputs: Inputs | None) -> Program:
    """The caller's program, checked; with inputs, built off the event loop (host files are
    read then)."""
    if inputs:
        return await anyio.to_thread.run_sync(build)
    return build()
