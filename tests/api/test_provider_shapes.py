"""Provider-shaped results: golden files written from each provider's documented shape, and
the promises every shape keeps whatever the result holds (capped, never raising)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psych_sandbox_core import ErrorKind, ExecutionFailure, ExecutionResult, Sandbox
from psych_sandbox_core._api.provider_shapes import (
    anthropic_tool_result,
    cut_text,
    gemini_code_execution_result,
    report_text,
    shell_call_output,
)
from psych_sandbox_core._output.capture import StreamCapture, make_preview, omission_marker
from psych_sandbox_core.result import BackendIdentity, StreamOutput, Usage

from ..conftest import PROFILE, config

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def stream(text: str, *, omitted_bytes: int = 0, omitted_lines: int = 0) -> StreamOutput:
    size = len(text.encode())
    return StreamOutput(
        total_bytes=size + omitted_bytes,
        captured_bytes=size,
        dropped_bytes=omitted_bytes,
        shown_bytes=size,
        omitted_bytes=omitted_bytes,
        omitted_lines=omitted_lines,
    )


def result(
    stdout: str = "",
    stderr: str = "",
    *,
    return_value: Any = None,
    error: ExecutionFailure | None = None,
    stdout_info: StreamOutput | None = None,
) -> ExecutionResult:
    return ExecutionResult(
        stdout=stdout,
        stderr=stderr,
        stdout_info=stdout_info or stream(stdout),
        stderr_info=stream(stderr),
        return_value=return_value,
        error=error,
        level="isolated",
        usage=Usage(wall_seconds=0.1, cpu_seconds=None, peak_memory_bytes=None, measured_by="none"),
        profile="default",
        backend=BackendIdentity(id="subprocess", distribution=None, version=None),
    )


TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "<program>", line 2, in <module>\n'
    "    rows[10]\n"
    "IndexError: list index out of range\n"
)

#: The results every golden file answers, by name.
CASES: dict[str, ExecutionResult] = {
    "ok": result("hello\n", return_value={"answer": 42}),
    "exception": result(
        "",
        "warming up\n",
        error=ExecutionFailure.of(
            ErrorKind.EXCEPTION,
            "IndexError: list index out of range",
            traceback=TRACEBACK,
            line=2,
            exception_type="IndexError",
        ),
    ),
    "timeout": result(
        "partial\n",
        error=ExecutionFailure.of(
            ErrorKind.TIMEOUT, "the program exceeded its wall-clock limit of 2 s and was killed"
        ),
    ),
    "isolation_unavailable": result(
        error=ExecutionFailure.of(
            ErrorKind.ISOLATION_UNAVAILABLE, "the isolated level is required; reached process"
        ),
    ),
}


def golden(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / name).read_text())
    assert set(data["cases"]) == set(CASES), "every case has a golden answer"
    return data


# ---------------------------------------------------------------- the documented shapes


def check_anthropic(block: Any) -> None:
    """A tool_result content block as the Messages API documents it."""
    assert set(block) == {"type", "tool_use_id", "content", "is_error"}
    assert block["type"] == "tool_result"
    assert isinstance(block["tool_use_id"], str)
    assert isinstance(block["content"], str)
    assert isinstance(block["is_error"], bool)


def check_shell(item: Any) -> None:
    """A shell_call_output input item as the Responses API (OpenAI, xAI) documents it."""
    assert set(item) - {"max_output_length"} == {"type", "call_id", "output"}
    assert item["type"] == "shell_call_output" and isinstance(item["call_id"], str)
    if "max_output_length" in item:
        assert isinstance(item["max_output_length"], int) and item["max_output_length"] >= 0
    for chunk in item["output"]:
        assert set(chunk) == {"stdout", "stderr", "outcome"}
        assert isinstance(chunk["stdout"], str) and isinstance(chunk["stderr"], str)
        outcome = chunk["outcome"]
        assert outcome in ({"type": "timeout"},) or (
            set(outcome) == {"type", "exit_code"}
            and outcome["type"] == "exit"
            and isinstance(outcome["exit_code"], int)
        )


def check_gemini(part: Any) -> None:
    """A Part holding a codeExecutionResult as the Gemini REST API documents it."""
    assert set(part) == {"codeExecutionResult"}
    body = part["codeExecutionResult"]
    assert set(body) - {"id"} == {"outcome", "output"}
    assert body["outcome"] in ("OUTCOME_OK", "OUTCOME_FAILED", "OUTCOME_DEADLINE_EXCEEDED")
    assert isinstance(body["output"], str)


# ---------------------------------------------------------------- golden files


def test_anthropic_tool_result_matches_the_golden_file() -> None:
    data = golden("anthropic_tool_result.json")
    for name, expected in data["cases"].items():
        got = anthropic_tool_result(CASES[name], data["tool_use_id"])
        check_anthropic(got)
        assert got == expected, name
        # The content is one JSON object the model reads; the program cannot forge a field.
        assert json.loads(got["content"])["ok"] is (name == "ok")


def test_shell_call_output_matches_the_golden_file() -> None:
    data = golden("shell_call_output.json")
    for name, expected in data["cases"].items():
        got = shell_call_output(
            CASES[name], data["call_id"], max_output_length=data["max_output_length"]
        )
        check_shell(got)
        assert got == expected, name


def test_gemini_code_execution_result_matches_the_golden_file() -> None:
    data = golden("gemini_code_execution_result.json")
    for name, expected in data["cases"].items():
        got = gemini_code_execution_result(CASES[name], id=data["id"])
        check_gemini(got)
        assert got == expected, name


def test_one_shell_call_output_answers_every_command_of_the_call_in_order() -> None:
    item = shell_call_output([CASES["ok"], CASES["timeout"]], "call_2")
    check_shell(item)
    assert [chunk["outcome"]["type"] for chunk in item["output"]] == ["exit", "timeout"]
    assert "max_output_length" not in item  # the call carried none: nothing to pass back


# ---------------------------------------------------------------- caps


def test_every_shape_is_capped_and_counts_what_the_stream_preview_already_left_out() -> None:
    shown = "a" * 3000 + omission_marker(50_000, 700) + "z" * 3000
    big = result(
        shown,
        return_value=list(range(5000)),
        stdout_info=stream(shown, omitted_bytes=50_000, omitted_lines=700),
    )
    for limit in (300, 1000, 5000):
        content = anthropic_tool_result(big, "t", max_chars=limit)["content"]
        assert len(content) <= limit
        report = json.loads(content)
        assert report["return_value_truncated"] is True
        part = gemini_code_execution_result(big, max_chars=limit)
        assert len(part["codeExecutionResult"]["output"]) <= limit
        chunk = shell_call_output(big, "c", max_chars=limit)["output"][0]
        assert len(chunk["stdout"]) + len(chunk["stderr"]) <= limit
        # One marker, counting the preview's omission and this cut's together.
        stdout = report["stdout"]
        assert stdout.startswith("a") and stdout.rstrip("\n").endswith("z")
        assert stdout.count("\n[... ") == 1
        after = stdout.partition("\n[... ")[2]
        omitted = int(after.split(" bytes")[0])
        assert omitted == 50_000 + 6000 - stdout.count("a") - stdout.count("z")


def test_max_output_length_from_the_call_cuts_each_stream_and_is_passed_back() -> None:
    noisy = result("o" * 500 + "\n", "e" * 500 + "\n", error=CASES["exception"].error)
    item = shell_call_output(noisy, "call_9", max_output_length=120)
    assert item["max_output_length"] == 120
    chunk = item["output"][0]
    assert len(chunk["stdout"]) <= 120 and len(chunk["stderr"]) <= 120
    assert "omitted" in chunk["stdout"] and "omitted" in chunk["stderr"]
    assert chunk["outcome"] == {"type": "exit", "exit_code": 1}


@pytest.mark.parametrize("value", [None, -5, "many", True, float("nan"), float("inf"), [3], 1e300])
def test_a_max_output_length_that_is_not_a_length_is_ignored_never_raised(value: Any) -> None:
    item = shell_call_output(CASES["exception"], "call_3", max_output_length=value)
    check_shell(item)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
        if value in (float("inf"),):
            assert "max_output_length" not in item
        else:
            assert item["max_output_length"] == max(0, int(value))
    else:
        assert "max_output_length" not in item


def test_cut_text_is_head_and_tail_with_the_output_preview_marker() -> None:
    data = "".join(f"row {i}\n" for i in range(500))
    cut = cut_text(data, 200)
    assert len(cut) <= 200
    capture = StreamCapture(len(data))
    capture.feed(data.encode())
    # The same cut the stream preview makes, so every cut in the project reads alike.
    marker_room = len(omission_marker(len(data), data.count("\n")))
    assert cut == make_preview(capture, 200 - marker_room).text
    assert cut_text("short", 200) == "short"
    assert cut_text("x" * 50, 10) == "x" * 10  # no room for a count: the head


# ---------------------------------------------------------------- never raising


_texts = st.text(max_size=400)
_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    stdout=_texts,
    stderr=_texts,
    value=_values,
    kind=st.none() | st.sampled_from(list(ErrorKind)),
    message=_texts,
    traceback=st.none() | _texts,
    limit=st.integers(min_value=-10, max_value=3000),
    model_limit=st.none() | st.integers(min_value=-10, max_value=500),
)
def test_every_shape_is_valid_capped_and_never_raises(
    stdout: str,
    stderr: str,
    value: Any,
    kind: ErrorKind | None,
    message: str,
    traceback: str | None,
    limit: int,
    model_limit: int | None,
) -> None:
    error = None if kind is None else ExecutionFailure.of(kind, message, traceback=traceback)
    subject = result(stdout, stderr, return_value=value, error=error)
    cap = max(0, limit)
    block = anthropic_tool_result(subject, "id", max_chars=limit)
    check_anthropic(block)
    assert len(block["content"]) <= cap
    assert block["is_error"] is (error is not None)
    item = shell_call_output(subject, "id", max_output_length=model_limit, max_chars=limit)
    check_shell(item)
    chunk = item["output"][0]
    assert len(chunk["stdout"]) + len(chunk["stderr"]) <= cap
    if model_limit is not None:
        assert max(len(chunk["stdout"]), len(chunk["stderr"])) <= max(0, model_limit)
    part = gemini_code_execution_result(subject, max_chars=limit)
    check_gemini(part)
    assert len(part["codeExecutionResult"]["output"]) <= cap
    # Whatever the program wrote, the answer encodes for the wire.
    for shape in (block, item, part):
        json.dumps(shape, ensure_ascii=False).encode("utf-8")
    if cap >= 2000:
        json.loads(report_text(subject, max_chars=limit))  # room enough: always an object


def test_a_result_built_by_hand_with_a_value_that_is_not_json_still_answers() -> None:
    odd = result(return_value={1, 2}).model_copy(update={"stdout": "\udcff lone surrogate"})
    block = anthropic_tool_result(odd, "t")
    assert json.loads(block["content"])["return_value"] == "{1, 2}"
    json.dumps(block, ensure_ascii=False).encode("utf-8")
    assert shell_call_output(odd, "c")["output"][0]["stdout"].endswith('"{1, 2}"\n')


# ---------------------------------------------------------------- from a real execution


async def test_real_executions_through_each_shape(anyio_backend: str) -> None:
    async with Sandbox(config()) as sandbox:
        ok = await sandbox.run("print('hi')\n6 * 7", profile=PROFILE)
        failed = await sandbox.run("import sys\nsys.stderr.write('oops')\n1 / 0", profile=PROFILE)
        slow = await sandbox.run("while True:\n    pass", profile=PROFILE, timeout=1)
    assert anthropic_tool_result(ok, "t")["is_error"] is False
    assert json.loads(anthropic_tool_result(ok, "t")["content"])["return_value"] == 42
    block = anthropic_tool_result(failed, "t")
    assert block["is_error"] is True
    assert json.loads(block["content"])["error"]["kind"] == "exception"
    assert shell_call_output(ok, "c")["output"][0] == {
        "stdout": "hi\n42\n",
        "stderr": "",
        "outcome": {"type": "exit", "exit_code": 0},
    }
    chunk = shell_call_output(failed, "c")["output"][0]
    assert chunk["stderr"].startswith("oops\nTraceback") and chunk["outcome"]["exit_code"] == 1
    assert shell_call_output(slow, "c")["output"][0]["outcome"] == {"type": "timeout"}
    assert gemini_code_execution_result(ok) == {
        "codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "hi\n42\n"}
    }
    assert gemini_code_execution_result(failed)["codeExecutionResult"]["outcome"] == (
        "OUTCOME_FAILED"
    )
    assert gemini_code_execution_result(slow)["codeExecutionResult"]["outcome"] == (
        "OUTCOME_DEADLINE_EXCEEDED"
    )


def test_a_result_with_fields_of_the_wrong_type_still_answers_as_a_failure() -> None:
    broken = result().model_copy(update={"error": {"kind": "exception"}, "stdout": None})
    assert anthropic_tool_result(broken, "t")["is_error"] is True
    chunk = shell_call_output(broken, "c")["output"][0]
    assert chunk["outcome"] == {"type": "exit", "exit_code": 1}
    part = gemini_code_execution_result(broken)
    assert part["codeExecutionResult"]["outcome"] == "OUTCOME_FAILED"
