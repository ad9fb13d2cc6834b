"""The public API: a Sandbox runs one program per call under a named profile."""

from __future__ import annotations

import dataclasses
import difflib
import os
import uuid
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import anyio
from anyio.abc import TaskGroup

from .._bindings.bindings import BindingProvider, CallServer, ExecutionScope, ToolSpec
from .._bindings.catalogue import NAMESPACE_NAMES
from .._bindings.runlog import MemoryRunLog, RunLog, SQLiteRunLog
from .._engine.command import command_spec
from .._engine.host import ExecutionPlan, execute
from .._engine.inputs import Inputs, input_files
from .._engine.pool import AUTOMATIC_SIZE, WarmPool, WarmSettings, WarmStatus
from .._output.attachments import (
    DEFAULT_RUNS_IN_MEMORY,
    DEFAULT_WINDOW_BYTES,
    AttachmentLedger,
    Window,
)
from .._output.blobstore import BlobStore
from .._output.paging import DEFAULT_SEARCH_DEADLINE_SECONDS, SearchSettings
from .._output.pattern_search import SearchResult
from .._output.preservation import OutputContext
from .._output.streaming import OutputCallback, relaying
from .._policy.config import ConfigSource, check_config, create_backend, resolve_config
from .._policy.narrowing import (
    BackendCapability,
    ExecutionRequest,
    TenantPolicy,
    Terms,
    narrow,
    request_for,
    strictest_level,
)
from .._policy.profiles import DEFAULT_PROFILE, ProfileConfig
from .._policy.registry import BackendRegistry
from .._policy.selection import Selection
from .._policy.selection_cache import SelectionCache
from .._policy.state import state_directory
from .._policy.trials import remembered_or_selected, select_default
from ..errors import (
    ConfigurationError,
    ErrorKind,
    SandboxClosedError,
    UnknownBackendError,
    UnknownProfileError,
)
from ..grading import level_at_least
from ..kit.backend import Backend
from ..protocol.frames import CommandSpec, InputFile
from ..result import BackendIdentity, ExecutionFailure, ExecutionResult


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


#: How many different requests' terms a loaded profile keeps.
TERMS_KEPT = 64


@dataclasses.dataclass
class _LoadedProfile:
    name: str
    config: ProfileConfig
    backend: Backend
    identity: BackendIdentity
    #: How ``default`` chose its backend on this host; None when the profile names one.
    selection: Selection | None = None
    #: The terms of the requests seen so far (see :meth:`terms`).
    _terms: dict[tuple[TenantPolicy | None, ExecutionRequest], Terms] = dataclasses.field(
        default_factory=dict, repr=False
    )

    def terms(self, policy: TenantPolicy | None, request: ExecutionRequest) -> Terms:
        """The terms of an execution of this profile (narrow). Kept for requests seen before:
        the same inputs give the same terms, and a caller sends the same request time after
        time. Refusals are not kept (each result gets a failure of its own), nor are the
        terms of more than TERMS_KEPT different requests (all are dropped then)."""
        key = (policy, request)
        try:
            kept, keepable = self._terms.get(key), True
        except TypeError:  # something unhashable in the policy or the request
            kept, keepable = None, False
        if kept is not None:
            return kept
        terms = narrow(
            BackendCapability.of(type(self.backend)),
            policy or TenantPolicy(),
            request,
            self.name,
            self.config,
        )
        if keepable and terms.refusal is None:
            if len(self._terms) >= TERMS_KEPT:
                self._terms.clear()
            self._terms[key] = terms
        return terms


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
        # Where default's choice is remembered across processes (selection_cache.py): for a
        # process that runs one program, as the CLI does. Without one, it is the process's.
        self._selection_cache = selection_cache
        self._remembered: Selection | None = None
        self._loaded: dict[str, _LoadedProfile] = {}
        self._lock = anyio.Lock()
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
        names = set(self.config.profiles) | {DEFAULT_PROFILE} | set(self.registry.ids())
        return sorted(names)

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
        if not isinstance(source, str):
            raise TypeError("source must be a str")
        if preamble is not None and not isinstance(preamble, str):
            raise TypeError("preamble must be a str")
        variables_json = None if variables is None else given_variables(variables)
        for given in (preamble, variables_json):
            # The caller's text, not the model's: a lone surrogate is a mistake said at once
            # (UnicodeEncodeError), where the program's own is refused on the result.
            if given is not None:
                given.encode("utf-8")
        return await self._execute(
            source,
            None,
            inputs,
            request_for(request, profile, timeout),
            bindings=bindings,
            policy=policy,
            tenant=tenant,
            run_id=run_id,
            cancel=cancel,
            require_preservation=require_preservation,
            on_output=on_output,
            preamble=preamble,
            variables_json=variables_json,
            keep_variables=keep_variables,
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
        spec = command_spec(command, shell=shell)
        return await self._execute(
            "",
            spec,
            inputs,
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
        source: str,
        command: CommandSpec | None,
        inputs: Inputs | None,
        request: ExecutionRequest,
        *,
        bindings: BindingProvider | None,
        policy: TenantPolicy | None,
        tenant: str,
        run_id: str | None,
        cancel: anyio.Event | None,
        require_preservation: bool,
        on_output: OutputCallback | None = None,
        preamble: str | None = None,
        variables_json: str | None = None,
        keep_variables: bool = False,
    ) -> ExecutionResult:
        loaded = await self._load(request.profile)
        terms = loaded.terms(policy, request)
        limits = terms.limits
        files: tuple[InputFile, ...] = ()
        if inputs:
            # Checked and read before anything starts (a host file read off the event loop).
            files = await anyio.to_thread.run_sync(
                partial(
                    input_files,
                    inputs,
                    file_size_bytes=limits.file_size_bytes,
                    workspace_bytes=loaded.backend.workspace_bytes(),
                )
            )
        refusal = terms.refusal
        if (
            loaded.selection is not None
            and refusal is not None
            and (refusal.kind is ErrorKind.ISOLATION_UNAVAILABLE)
        ):
            # default fell back to a weaker backend: say what would reach the level.
            refusal = refusal.model_copy(
                update={"message": f"{refusal.message}; {loaded.selection.fix()}"}
            )
        if command is not None and not type(loaded.backend).runs_commands:
            refusal = refusal or ExecutionFailure.of(
                ErrorKind.POLICY_REFUSED,
                f"the {loaded.identity.id} backend of profile {loaded.name!r} runs Python "
                "programs only, not commands; nothing was run",
            )
        budgets = loaded.config.budgets
        if policy is not None and policy.budgets is not None:
            budgets = budgets.narrowed(policy.budgets)
        execution_id = uuid.uuid4().hex
        # Asked at the start of every execution: a tool withdrawn since the last one is gone.
        specs, failure = await _listed_tools(bindings, limits.wall_seconds)
        scope = ExecutionScope(tenant, run_id or execution_id, execution_id)
        run_log = self._ephemeral_run_log if run_id is None else self._durable_log()
        outputs = self.attachments if loaded.config.output.read_output else None
        try:
            calls = CallServer(
                bindings if failure is None else None,
                specs,
                budgets=budgets,
                run_log=run_log,
                scope=scope,
                blob_store=self.blob_store if bindings is not None else None,
                search=self._search,
                outputs=outputs,
            )
        except ConfigurationError as exc:
            # What the provider listed cannot be offered (a name twice, too many): its fault,
            # reported on the result like any failure, never raised out of run().
            failure = _provider_failure(f"it listed tools that cannot be offered: {exc}")
            calls = CallServer(None, [], budgets=budgets, run_log=run_log, scope=scope)
        if failure is not None:
            refusal = refusal or failure
        plan = ExecutionPlan(
            source=source,
            limits=limits,
            profile=loaded.name,
            backend_identity=loaded.identity,
            claimed_level=type(loaded.backend).claims,
            required_level=terms.required_level,
            network_allowed=terms.network,
            refusal=refusal,
            calls=calls,
            cancel=cancel,
            output=self._output_context(
                loaded, tenant, run_id or execution_id, require_preservation
            ),
            command=command,
            inputs=files,
            preamble=preamble,
            variables_json=variables_json,
            keep_variables=keep_variables,
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
                source,
                command,
                inputs,
                request,
                bindings=bindings,
                policy=policy,
                tenant=tenant,
                run_id=run_id,
                cancel=cancel,
                require_preservation=require_preservation,
                on_output=on_output,
                preamble=preamble,
                variables_json=variables_json,
                keep_variables=keep_variables,
            )
        return _with_notes(result, loaded.selection)

    def _forget_stale_choice(self, loaded: _LoadedProfile, result: ExecutionResult) -> bool:
        """Forget a remembered choice of default's that this execution showed wrong here;
        True when the program did not run, so it may run on a fresh choice."""
        selection = loaded.selection
        if selection is None or not selection.remembered or self._selection_cache is None:
            return False
        not_ready = result.error is not None and result.error.kind is ErrorKind.BACKEND_NOT_READY
        weaker = bool(result.grades) and not level_at_least(result.level, selection.chosen.claims)
        if not (not_ready or weaker):
            return False
        self._selection_cache.forget()
        self._loaded.pop(loaded.name, None)
        self._pools.pop(loaded.name, None)
        self._remembered = None
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

    def _pool(self, loaded: _LoadedProfile) -> WarmPool | None:
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

    def _output_context(
        self, loaded: _LoadedProfile, tenant: str, run_id: str, require: bool
    ) -> OutputContext:
        policy = loaded.config.output
        if require and not policy.require_preservation:
            policy = policy.model_copy(update={"require_preservation": True})
        return OutputContext(policy, self.attachments, tenant, run_id)

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

    async def _load(self, name: str) -> _LoadedProfile:
        if name in self._loaded:
            return self._loaded[name]
        async with self._lock:
            if name in self._loaded:
                return self._loaded[name]
            config = self.config.profiles.get(name)
            if config is None:
                if name == DEFAULT_PROFILE:
                    config = ProfileConfig()
                elif self._installed(name):
                    config = ProfileConfig(backend=name)
                else:
                    close = difflib.get_close_matches(name, self.profile_names(), n=1)
                    raise UnknownProfileError(
                        f"no profile named {name!r} is configured"
                        + (f" (did you mean {close[0]!r}?)" if close else "")
                        + f"; known profiles: {', '.join(self.profile_names())}"
                    )
            selection: Selection | None = None
            if config.backend is None:
                if name != DEFAULT_PROFILE:
                    raise ConfigurationError(f"profile {name!r} names no backend")
                selection = await self.default_selection()
                unreachable = selection.below_required(name, config.required_level)
                if unreachable is not None:
                    raise ConfigurationError(unreachable)
                backend_id = selection.chosen.backend_id
            else:
                backend_id = config.backend
            backend = create_backend(self.registry, name, backend_id, dict(config.options))
            registered = self.registry.get(backend_id)
            # The deployment's floor narrows every profile: below it a run is refused.
            floor = strictest_level([config.required_level, self.config.required_level])
            loaded = _LoadedProfile(
                name,
                config.model_copy(update={"required_level": floor}),
                backend,
                BackendIdentity(
                    id=backend_id,
                    distribution=registered.distribution,
                    version=registered.version,
                ),
                selection,
            )
            self._loaded[name] = loaded
            return loaded

    def _installed(self, backend_id: str) -> bool:
        """Whether a backend of that id is installed, loading only its own plugin when the
        entry point is named for it (as it should be), not every installed one."""
        try:
            self.registry.get(backend_id)
        except UnknownBackendError:
            return False
        return True

    async def strongest_working_backend(self) -> str:
        """The backend ``default`` runs on this host (see :meth:`default_selection`)."""
        return (await self.default_selection()).chosen.backend_id

    async def default_selection(self) -> Selection:
        """What ``default`` runs on this host (see trials.select_default), or what a
        selection cache remembers it ran on recently."""
        preference = self.config.backend_preference
        cache = self._selection_cache
        if cache is None:
            return await select_default(self.registry, preference)
        if self._remembered is None:
            self._remembered = await remembered_or_selected(self.registry, preference, cache)
        return self._remembered


async def _listed_tools(
    bindings: BindingProvider | None, wall_seconds: float
) -> tuple[list[ToolSpec], ExecutionFailure | None]:
    """The tools ``bindings`` lists now, or why it could not (a failure, as data): a provider
    that raises or does not answer within the execution's wall clock fails the execution."""
    if bindings is None:
        return [], None
    try:
        with anyio.fail_after(wall_seconds):
            specs = list(await bindings.list_tools())
    except TimeoutError:
        return [], _provider_failure(f"listing the tools did not finish within {wall_seconds:g} s")
    except Exception as exc:
        return [], _provider_failure(f"listing the tools raised {type(exc).__name__}: {exc}")
    if not all(isinstance(spec, (ToolSpec, str)) for spec in specs):
        return [], _provider_failure("it listed something that is not a ToolSpec")
    return specs, None


def _provider_failure(why: str) -> ExecutionFailure:
    return ExecutionFailure.of(
        ErrorKind.PROVIDER_ERROR,
        f"the binding provider failed, so the program did not run: {why}"[:4096],
    )


def _with_notes(result: ExecutionResult, selection: Selection | None) -> ExecutionResult:
    """The result, noting a run below the isolated level that nothing asked for: the
    backend was chosen by ``default`` on this host, not named by a profile."""
    if selection is None or not result.grades:
        return result
    if result.error is not None and result.error.kind in _NOT_RUN:
        return result
    note = selection.note(result.level, result.grades)
    if note is None:
        return result
    return result.model_copy(update={"notes": [*result.notes, note]})


#: Failures that mean the program did not run, so there is nothing to note about how.
_NOT_RUN = frozenset(
    {
        ErrorKind.ISOLATION_UNAVAILABLE,
        ErrorKind.NETWORK_NOT_ALLOWED,
        ErrorKind.BACKEND_NOT_READY,
        ErrorKind.POLICY_REFUSED,
    }
)


def given_variables(variables: Mapping[str, Any]) -> str:
    """``variables`` as the JSON object text a run frame carries; raises TypeError or
    ValueError for a name that is not a plain identifier (or is the namespace's own, or
    starts with "_") or a value that is not JSON data: the caller's mistake, said at once."""
    import json
    import keyword

    for name in variables:
        if (
            not isinstance(name, str)
            or not name.isidentifier()
            or keyword.iskeyword(name)
            or name.startswith("_")
            or name in NAMESPACE_NAMES
        ):
            raise ValueError(f"variables: {name!r} cannot be given to a program as a name")
    try:
        return json.dumps(dict(variables), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"variables must be JSON data: {exc}") from None
