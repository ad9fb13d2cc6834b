"""The JSON form of a result is a wire format: pinned, key order and all, against golden files.

Each case runs a real program on the subprocess backend; only what differs from run to run or
from host to host (timings, random handles and ids, the core's version, the grades this host
earns) is replaced by a placeholder before the comparison, and only when it is a value of the
right kind, so every field's name, order and type, and every other value, is what the golden
file says.
Set PSYCH_SANDBOX_WRITE_GOLDEN=1 to write the files anew after a deliberate change.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import pytest

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core._bindings.bindings import FunctionBindings
from psych_sandbox_core._output.blobstore import FilesystemBlobStore
from psych_sandbox_core._policy.narrowing import ExecutionRequest
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_core.backends.subprocess import SubprocessBackend
from psych_sandbox_core.budgets import BindingBudgets
from psych_sandbox_core.grading import Grade, Guarantee, Level, Mechanisms
from psych_sandbox_core.kit.hookspecs import hookimpl
from psych_sandbox_core.result import CallRecord, ExecutionResult

pytestmark = pytest.mark.anyio

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "results"

LIMITS = ExecutionLimits(cpu_seconds=10, wall_seconds=30.0, grace_seconds=0.5)

_HANDLE = re.compile(r"att:x[0-9]+(?:-[A-Za-z0-9_-]+)?:[A-Za-z0-9_-]{24}")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


def _profiles(**limits: Any) -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            "pin": ProfileConfig(
                backend="subprocess",
                limits=LIMITS.model_copy(update=limits),
                budgets=BindingBudgets(result_bytes_per_call=64),
            )
        }
    )


_GRADES = {"enforced", "unverified", "unavailable"}
_LEVELS = {"isolated", "process", "none"}


def _normalised(data: Any, key: str = "", parent: str = "") -> Any:
    """``data`` with what differs between runs or hosts replaced by a placeholder."""
    if isinstance(data, dict):
        return {k: _normalised(v, k, key) for k, v in data.items()}
    if isinstance(data, list):
        return [_normalised(item, key, parent) for item in data]
    if parent == "grades" and data in _GRADES:
        return "<grade>"
    if key == "level" and data in _LEVELS:
        return "<level>"
    if key == "measured_by" and data in ("host", "none"):
        return "<measured by>"
    if key in ("wall_seconds", "cpu_seconds", "host_cpu_seconds") and isinstance(
        data, (float, type(None))
    ):
        return "<seconds>"
    if key == "peak_memory_bytes" and isinstance(data, (int, type(None))):
        return "<bytes>"
    if key == "version" and isinstance(data, str):
        return "<version>"
    if key == "run_id" and isinstance(data, str) and _HEX32.match(data):
        return "<run id>"
    if isinstance(data, str):
        return _HANDLE.sub("<handle>", data)
    return data


def _check(name: str, result: ExecutionResult) -> None:
    data = result.to_json_object()
    # The object is what json.dumps prints: nothing in it needs a custom encoder.
    text = json.dumps(_normalised(json.loads(json.dumps(data))), indent=1, ensure_ascii=False)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("PSYCH_SANDBOX_WRITE_GOLDEN") == "1":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n", encoding="utf-8")
    # What the placeholders hide, to tell a slow machine from a wrong result on failure.
    facts = (result.usage.wall_seconds, result.error, result.stdout_info)
    assert text + "\n" == path.read_text(encoding="utf-8"), facts


async def test_a_success_is_pinned() -> None:
    async with Sandbox(_profiles()) as sandbox:
        result = await sandbox.run(
            "import sys\nprint('out')\nprint('err', file=sys.stderr)\n"
            "return {'answer': 42, 'items': [1, 2.5, None, 'x']}",
            profile="pin",
        )
    assert result.error is None, result.error
    _check("success", result)


async def test_an_exception_is_pinned() -> None:
    async with Sandbox(_profiles()) as sandbox:
        result = await sandbox.run(
            "print('before')\ndef f():\n    raise ValueError('boom')\nf()", profile="pin"
        )
    assert result.error is not None
    _check("exception", result)


async def test_a_timeout_is_pinned() -> None:
    # A prepared child: its launch and handshake are behind it, so the program's clock starts
    # as it is given. (This test once failed when another test's program, scanning the
    # host's loopback ports, reached this execution's probe listener: see
    # test_probe_attribution.py.)
    async with Sandbox(_profiles(wall_seconds=1.0)) as sandbox:
        await sandbox.warmed("pin")
        result = await sandbox.run(
            "import sys, time\nprint('started', flush=True)\ntime.sleep(120)", profile="pin"
        )
    assert result.error is not None
    _check("timeout", result)


async def test_a_refused_run_is_pinned() -> None:
    async with Sandbox(_profiles()) as sandbox:
        result = await sandbox.run(
            "print('never')",
            request=ExecutionRequest(profile="pin", minimum_level=Level.ISOLATED),
        )
    assert result.error is not None
    _check("refused", result)


class _MisreportingBackend(SubprocessBackend):
    """Claims the isolated level and a filesystem boundary the evidence contradicts."""

    id: ClassVar[str] = "misreporting_pin"
    claims: ClassVar[Level] = Level.ISOLATED

    def mechanisms(self) -> Mechanisms:
        return Mechanisms(
            filesystem_boundary=True,
            network_namespace=True,
            ipc_namespace=True,
            process_tree_boundary=True,
            unprivileged_identity=True,
        )


class _MisreportingPlugin:
    @staticmethod
    @hookimpl
    def psych_sandbox_register_backends(registry: Any) -> None:
        registry.add(_MisreportingBackend)


async def test_a_withheld_run_is_pinned() -> None:
    registry = BackendRegistry()
    registry.register_plugin(_MisreportingPlugin(), "misreporting-pin", "example-dist", "1.2")
    deployment = DeploymentConfig(
        profiles={"liar": ProfileConfig(backend="misreporting_pin", limits=LIMITS)}
    )
    async with Sandbox(deployment, registry=registry) as sandbox:
        result = await sandbox.run("print('never shown')\nreturn 1", profile="liar")
    assert result.error is not None and result.stdout == ""
    # The message lists the grades this host earned; its kind and everything else is pinned.
    assert "claimed the isolated level" in result.error.message
    result = result.model_copy(
        update={"error": result.error.model_copy(update={"message": "<message>"})}
    )
    _check("withheld", result)


async def test_attachments_artifacts_and_calls_are_pinned() -> None:
    source = """
with open("report.txt", "w") as fh:
    fh.write("a report\\n")
with open("data.json", "w") as fh:
    fh.write('{"k": [1, 2]}')
import os
os.symlink("/etc/passwd", "link")
print("x" * 60)
total = await add(a=2, b=3)
big = await call_tool("big", {})
try:
    await call_tool("missing", {})
except ToolError as exc:
    missing = exc.kind
return {"total": total, "big": type(big).__name__, "missing": missing}
"""
    tools = FunctionBindings({"add": lambda a, b: a + b, "big": lambda: {"text": "y" * 200}})
    with tempfile.TemporaryDirectory(prefix="psych-pin-") as store:
        async with Sandbox(_profiles(), blob_store=FilesystemBlobStore(store)) as sandbox:
            result = await sandbox.run(source, profile="pin", bindings=tools, run_id="pinned")
    assert result.error is None, result.error
    assert result.attachments and result.artifacts and result.skipped_artifacts
    assert [call.outcome for call in result.calls] == ["ok", "ok", "unknown_tool"]
    _check("attachments_and_calls", result)


async def test_a_result_is_typed_for_its_readers() -> None:
    tools = FunctionBindings({"add": lambda a, b: a + b})
    async with Sandbox(_profiles()) as sandbox:
        result = await sandbox.run("return await add(a=1, b=2)", profile="pin", bindings=tools)
    assert result.error is None, result.error
    assert isinstance(result.level, Level)
    # Printed as the JSON form spells it, as the plain string it used to be.
    assert str(result.level) == f"{result.level}" == result.to_json_object()["level"]
    assert result.grades and all(
        isinstance(guarantee, Guarantee) and isinstance(grade, Grade)
        for guarantee, grade in result.grades.items()
    )
    assert list(result.grades) == [g for g in Guarantee if g in result.grades]
    (call,) = result.calls
    assert isinstance(call, CallRecord) and (call.name, call.outcome) == ("add", "ok")
    assert call.stored_bytes is None and "stored_bytes" not in call.model_dump(mode="json")


def _core_modules_imported_by(module: str) -> set[str]:
    code = (
        f"import sys, {module}\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('psych_sandbox_core.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(done.stdout.split())


def test_the_result_models_depend_on_no_ledger_collection_or_rendering() -> None:
    """The models are what every reader imports: they import none of the modules that
    build, store or show a result (so no cycle can run through them)."""
    builders = {
        "psych_sandbox_core._output.attachments",
        "psych_sandbox_core._output.artifacts",
        "psych_sandbox_core._output.artifact_walk",
        "psych_sandbox_core._output.artifact_channel",
        "psych_sandbox_core._output.artifact_export",
        "psych_sandbox_core._output.preservation",
        "psych_sandbox_core.cli.render",
        "psych_sandbox_core._engine.host",
    }
    assert _core_modules_imported_by("psych_sandbox_core.result") & builders == set()
    # The ledger stores attachments; it neither builds a result nor shows one.
    ledger = _core_modules_imported_by("psych_sandbox_core._output.attachments")
    assert ledger & (builders - {"psych_sandbox_core._output.attachments"}) == set()
