"""Command mode and inputs in the core: what a command and inputs may be (checked before
anything starts), a command's exit status through the conversation and onto the result and
its provider shapes, the refusal of a backend that does not run commands, a warm child, the
synchronous API and the CLI. Every backend's own behaviour (argv, caps, a timeout killing the
whole tree, the shell form) is the conformance suite's."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from psych_sandbox_core import (
    DeploymentConfig,
    ErrorKind,
    ExecutionLimits,
    InvalidRequestError,
    ProfileConfig,
    Sandbox,
    SyncSandbox,
)
from psych_sandbox_core._api.provider_shapes import (
    gemini_code_execution_result,
    report_text,
    shell_call_output,
)
from psych_sandbox_core._engine.conversation import Close, Conversation, State
from psych_sandbox_core._engine.program import Program, command_spec, input_files
from psych_sandbox_core.backends.subprocess import SubprocessBackend
from psych_sandbox_core.child.loader import bootstrap_module
from psych_sandbox_core.cli import main
from psych_sandbox_core.grading import Mechanisms
from psych_sandbox_core.protocol import ResultFrame
from psych_sandbox_core.protocol.limits import MAX_INPUT_BYTES, MAX_INPUT_NAME_CHARS, MAX_INPUTS

from ..conftest import FAST_LIMITS, PROFILE, config
from .test_conversation import hello, perform_sends, terms

#: The child's functions and constants, from the source the child runs.
bootstrap = bootstrap_module()

#: An interpreter the child's own (leased) uid can run: the test's may live where it cannot.
PYTHON = shutil.which("python3", path=os.defpath) or "/usr/bin/python3"


@pytest.fixture
def anyio_backend() -> str:
    # The command path has no loop-specific code of its own: one loop is enough here.
    return "asyncio"


# ------------------------------------------------------------------ checked before anything


def checked_inputs(
    inputs: Any, *, file_size_bytes: int | None, workspace_bytes: int | None
) -> None:
    """Inputs read as Sandbox.run reads them, then held to one execution's limits."""
    program = Program(inputs=input_files(inputs))
    program.check_inputs(file_size_bytes=file_size_bytes, workspace_bytes=workspace_bytes)


@pytest.mark.parametrize(
    ("command", "shell"),
    [
        ("ls -l", False),  # a string is a shell's to split: only with shell=True
        (["ls"], True),
        ([], False),
        ([""], False),
        (["ls", 3], False),
        (["ls", "a\0b"], False),
        (["x" * (256 * 1024 + 1)], False),
    ],
)
def test_a_command_no_child_could_run_is_refused_by_the_call(command: Any, shell: bool) -> None:
    with pytest.raises(InvalidRequestError):
        command_spec(command, shell=shell)


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "/etc/passwd", "..\\x", "a\0b", "x" * 256, "é" * 128, 7]
)
def test_an_input_name_that_is_not_one_plain_file_name_is_refused(name: Any) -> None:
    with pytest.raises(InvalidRequestError):
        checked_inputs({name: b"x"}, file_size_bytes=None, workspace_bytes=None)


def test_inputs_are_bounded_in_count_and_size(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="at most"):
        checked_inputs(
            {f"f{i}": b"" for i in range(MAX_INPUTS + 1)},
            file_size_bytes=None,
            workspace_bytes=None,
        )
    with pytest.raises(InvalidRequestError, match="file-size limit"):
        checked_inputs({"a": b"12345"}, file_size_bytes=4, workspace_bytes=None)
    # Counted together against the workspace's cap (and the frame's own ceiling).
    with pytest.raises(InvalidRequestError, match="together"):
        checked_inputs({"a": b"123", "b": b"456"}, file_size_bytes=None, workspace_bytes=5)
    big = tmp_path / "big"
    with big.open("wb") as file:
        file.truncate(MAX_INPUT_BYTES + 1)
    with pytest.raises(InvalidRequestError, match="together"):
        checked_inputs({"big": big}, file_size_bytes=None, workspace_bytes=None)
    # Only a regular file is read (a FIFO would block the host; a directory is no file).
    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path / "fifo", tmp_path, tmp_path / "missing"):
        with pytest.raises(InvalidRequestError):
            checked_inputs({"x": path}, file_size_bytes=None, workspace_bytes=None)


@pytest.mark.anyio
async def test_a_bad_input_raises_before_any_child_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    launched: list[object] = []
    monkeypatch.setattr(SubprocessBackend, "launch", lambda self, request: launched.append(1))
    async with Sandbox(config()) as sandbox:
        with pytest.raises(InvalidRequestError):
            await sandbox.run("1", profile=PROFILE, inputs={"../escape": b"x"})
    assert launched == []


def test_the_bootstraps_copy_agrees() -> None:
    assert bootstrap.MAX_INPUT_NAME_CHARS == MAX_INPUT_NAME_CHARS


# ------------------------------------------------------------------ the conversation


def test_only_a_commands_result_says_exited_and_a_command_never_returns() -> None:
    def ended(command: bool, frame: ResultFrame) -> Conversation:
        conversation = Conversation(Mechanisms(), host_uid=0)
        conversation.receive(hello())
        spec = command_spec(["true"]) if command else None
        perform_sends(conversation, conversation.start(terms(command=spec, source="")))
        assert isinstance(conversation.receive(frame)[-1], Close)
        return conversation

    def frame(outcome: str, status: int | None) -> ResultFrame:
        return ResultFrame(
            type="result",
            outcome=outcome,  # type: ignore[arg-type]
            value_json=None,
            error=None,
            detail=None,
            exit_status=status,
        )

    assert ended(True, frame("exited", 3)).state is State.DONE
    for is_command, forged in [
        (False, frame("exited", 0)),  # a program writing a command's result itself
        (True, frame("returned", None)),  # a bootstrap that ran the empty source instead
        (True, frame("exited", None)),
        (True, frame("invalid_output", 1)),
    ]:
        assert ended(is_command, forged).state is State.VIOLATED, forged


# ------------------------------------------------------------------ results


@pytest.mark.anyio
async def test_inputs_are_the_childs_own_files_before_the_program_starts(tmp_path: Path) -> None:
    on_host = tmp_path / "data.csv"
    on_host.write_bytes(b"a,b\n1,2\n")
    async with Sandbox(config()) as sandbox:
        result = await sandbox.run(
            "import os\n"
            "[(n, open(n, 'rb').read().hex(), os.stat(n).st_uid == os.getuid())"
            " for n in sorted(os.listdir('.'))]",
            profile=PROFILE,
            inputs={"raw.bin": bytes(range(256)), "data.csv": on_host},
        )
    assert result.error is None, result.error
    assert result.return_value == [
        ["data.csv", b"a,b\n1,2\n".hex(), True],
        ["raw.bin", bytes(range(256)).hex(), True],
    ]


@pytest.mark.anyio
async def test_a_command_result_carries_its_exit_status_and_its_shapes() -> None:
    async with Sandbox(config()) as sandbox:
        result = await sandbox.exec(
            [PYTHON, "-c", "import sys; print(open('in').read()); sys.exit(3)"],
            profile=PROFILE,
            inputs={"in": b"given"},
        )
    assert result.error is None, result.error
    assert (result.exit_status, result.stdout, result.ok) == (3, "given\n", True)
    data = result.to_json_object()
    assert data["exit_status"] == 3
    assert list(data).index("exit_status") == list(data).index("return_value") + 1
    assert result.for_model().startswith("exit status 3\nstdout:\ngiven")
    output = shell_call_output(result, "call_1")["output"][0]
    assert output["outcome"] == {"type": "exit", "exit_code": 3}
    assert json.loads(report_text(result))["exit_status"] == 3
    gemini = gemini_code_execution_result(result)["codeExecutionResult"]
    assert gemini["outcome"] == "OUTCOME_FAILED"
    # A program's result has no exit status, in its JSON form either.
    async with Sandbox(config()) as sandbox:
        program = await sandbox.run("1", profile=PROFILE)
    assert program.exit_status is None and "exit_status" not in program.to_json_object()


@pytest.mark.anyio
async def test_a_command_past_its_cpu_limit_is_a_timeout_as_a_program_is() -> None:
    # Killed by its own CPU limit's signal, the command takes the bootstrap with it by the
    # same signal: the host reads the ending as it reads a program's.
    async with Sandbox(config(cpu_seconds=1)) as sandbox:
        result = await sandbox.exec([PYTHON, "-c", "while True: pass"], profile=PROFILE)
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT, result.error
    assert "command exceeded its CPU limit" in result.error.message
    assert result.exit_status is None


@pytest.mark.anyio
async def test_a_backend_that_does_not_declare_commands_refuses_them_as_data(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(SubprocessBackend, "runs_commands", False)
    async with Sandbox(config()) as sandbox:
        result = await sandbox.exec([PYTHON, "-c", "print('ran')"], profile=PROFILE)
    assert result.error is not None and result.error.kind is ErrorKind.POLICY_REFUSED
    assert "not commands" in result.error.message
    assert (result.stdout, result.exit_status) == ("", None)


@pytest.mark.anyio
async def test_a_warm_child_runs_a_command() -> None:
    warm = DeploymentConfig(
        profiles={
            "warm": ProfileConfig(
                backend="subprocess", warm=1, limits=ExecutionLimits(**FAST_LIMITS)
            )
        }
    )
    async with Sandbox(warm) as sandbox:
        await sandbox.warmed("warm")
        result = await sandbox.exec(
            [PYTHON, "-c", "import os; print(os.listdir('.'))"],
            profile="warm",
            inputs={"in.txt": b""},
        )
    assert (result.error, result.exit_status, result.stdout) == (None, 0, "['in.txt']\n")


def test_the_sync_sandbox_runs_a_command() -> None:
    with SyncSandbox(config()) as sandbox:
        result = sandbox.exec("exit 7", shell=True, profile=PROFILE)
    assert (result.error, result.exit_status) == (None, 7)


# ------------------------------------------------------------------ the CLI


def test_exec_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    given = tmp_path / "given.txt"
    given.write_text("hello")
    settings = tmp_path / "config.toml"
    settings.write_text(f'[profiles.{PROFILE}]\nbackend = "subprocess"\n')
    status = main(
        [
            *("exec", "--json", "--config", str(settings), "--profile", PROFILE),
            *("--input", f"{given}=in"),
            *("--", PYTHON, "-c", "import sys; print(open('in').read()); sys.exit(4)"),
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert (status, data["exit_status"], data["stdout"]) == (4, 4, "hello\n")


@pytest.mark.parametrize(
    "argv",
    [
        ["exec"],
        ["exec", "--"],
        ["exec", "--shell", "--", "echo", "two"],
        ["exec", "--input", "=name", "--", "true"],
        ["exec", "--input", "/nonexistent/file", "--", "true"],
    ],
)
def test_exec_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "psych-sandbox" in capsys.readouterr().err
