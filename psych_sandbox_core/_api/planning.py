"""One execution's plan, made from a loaded profile, the caller's program and request: its
narrowed terms, what refuses it before launch, and the bindings it is offered."""

from __future__ import annotations

import uuid

import anyio

from .._bindings.bindings import BindingProvider, ToolSpec
from .._bindings.call_server import CallServer, ExecutionScope
from .._bindings.runlog import RunLog
from .._engine.plan import ExecutionPlan
from .._engine.program import Program
from .._output.attachments import AttachmentLedger
from .._output.blobstore import BlobStore
from .._output.paging import SearchSettings
from .._output.preservation import OutputContext
from .._policy.narrowing import ExecutionRequest, TenantPolicy
from .._policy.selection import Selection
from ..errors import ConfigurationError, ErrorKind
from ..result import ExecutionFailure, ExecutionResult
from .loading import LoadedProfile


async def plan_execution(
    loaded: LoadedProfile,
    program: Program,
    request: ExecutionRequest,
    *,
    bindings: BindingProvider | None,
    policy: TenantPolicy | None,
    tenant: str,
    run_id: str | None,
    cancel: anyio.Event | None,
    require_preservation: bool,
    run_log: RunLog,
    attachments: AttachmentLedger,
    blob_store: BlobStore | None,
    search: SearchSettings,
) -> tuple[ExecutionPlan, ExecutionScope]:
    """The plan of one execution of ``program`` under ``loaded``, and the scope its calls
    are counted in. Raises InvalidRequestError for inputs the execution cannot take."""
    terms = loaded.terms(policy, request)
    limits = terms.limits
    # Checked before anything starts: the backend and limits differ between executions.
    program.check_inputs(
        file_size_bytes=limits.file_size_bytes, workspace_bytes=loaded.backend.workspace_bytes()
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
    if program.command is not None and not type(loaded.backend).runs_commands:
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
    outputs = attachments if loaded.config.output.read_output else None
    try:
        calls = CallServer(
            bindings if failure is None else None,
            specs,
            budgets=budgets,
            run_log=run_log,
            scope=scope,
            blob_store=blob_store if bindings is not None else None,
            search=search,
            outputs=outputs,
        )
    except ConfigurationError as exc:
        # What the provider listed cannot be offered (a name twice, too many): its fault,
        # reported on the result like any failure, never raised out of run().
        failure = _provider_failure(f"it listed tools that cannot be offered: {exc}")
        calls = CallServer(None, [], budgets=budgets, run_log=run_log, scope=scope)
    if failure is not None:
        refusal = refusal or failure
    output_policy = loaded.config.output
    if require_preservation and not output_policy.require_preservation:
        output_policy = output_policy.model_copy(update={"require_preservation": True})
    plan = ExecutionPlan(
        program=program,
        limits=limits,
        profile=loaded.name,
        backend_identity=loaded.identity,
        claimed_level=type(loaded.backend).claims,
        required_level=terms.required_level,
        network_allowed=terms.network,
        refusal=refusal,
        calls=calls,
        cancel=cancel,
        output=OutputContext(output_policy, attachments, tenant, scope.run_id),
    )
    return plan, scope


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


def with_notes(result: ExecutionResult, selection: Selection | None) -> ExecutionResult:
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
