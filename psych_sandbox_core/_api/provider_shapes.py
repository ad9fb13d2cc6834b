"""An ExecutionResult in the shape each model provider's tool loop expects back.

Pure functions, no provider SDK: each returns plain JSON data (dicts, lists, strings, ints)
that an agent loop puts into its next request as it is.

- :func:`anthropic_tool_result`: an Anthropic Messages ``tool_result`` content block,
  ``is_error`` set when the execution failed, so the model re-plans.
- :func:`shell_call_output`: an OpenAI (and xAI, which uses the same shape) Responses API
  ``shell_call_output`` item: per command ``stdout``, ``stderr`` and an ``outcome`` that is
  ``{"type": "exit", "exit_code": N}`` or ``{"type": "timeout"}``; the call's
  ``max_output_length`` is honoured and passed back.
- :func:`gemini_code_execution_result`: a Gemini ``Part`` holding a ``codeExecutionResult``
  whose ``outcome`` is ``OUTCOME_OK``, ``OUTCOME_FAILED`` or ``OUTCOME_DEADLINE_EXCEEDED``.

Everything a program printed or returned is untrusted text, and the model reads it: every
function caps what it hands back (in characters, the unit the providers count in) whatever
the result holds, and none of them raises, whatever the result or the limits passed (a limit
that is not a non-negative number counts as absent; the model writes ``max_output_length``).
A cut keeps a head and a tail and says how much was left out between them.

A command's result (command mode, Sandbox.exec) carries its exit status: it is the
``exit_code`` of a shell_call_output, ``exit_status`` in a report, and a status other than 0 is
Gemini's ``OUTCOME_FAILED``; a command that did not exit on its own (a timeout, a limit) is
described as a program's failure is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._output.capture import omission_marker, preview_of
from ..errors import ErrorKind
from ..result import ExecutionResult

#: Characters one result may put in front of the model by default: room for both default
#: stream previews (16 KiB each, output.py) of ASCII text and a failure's traceback, small
#: enough that a few results do not crowd a context window.
DEFAULT_MAX_CHARS = 40_000

#: Exit codes in a shell_call_output outcome for a program: the CLI's statuses (0 succeeded,
#: 1 failed). A command's is its own exit status.
EXIT_OK = 0
EXIT_FAILED = 1


# ---------------------------------------------------------------- Anthropic


def anthropic_tool_result(
    result: ExecutionResult, tool_use_id: str, *, max_chars: int = DEFAULT_MAX_CHARS
) -> dict[str, Any]:
    """A ``tool_result`` block answering ``tool_use_id``; ``content`` is :func:`report_text`."""
    return {
        "type": "tool_result",
        "tool_use_id": str(tool_use_id),
        "content": report_text(result, max_chars=max_chars),
        "is_error": not _ok(result),
    }


def report_text(result: ExecutionResult, *, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """The result as one JSON object, at most ``max_chars`` characters: ``ok``, a command's
    ``exit_status``, ``stdout``, ``stderr``, then ``return_value`` when it succeeded or
    ``error`` (``kind``, ``message``, ``traceback``, ``guidance``) when it failed.

    JSON rather than labelled prose, because the program's text is untrusted: a program that
    prints ``error: none`` cannot pass it off as a field. When everything does not fit, each
    long field is cut to the same share (short ones stay whole); a return value too long to
    show whole becomes a cut string of its JSON text and ``return_value_truncated`` is set.
    """
    limit = _limit(max_chars, DEFAULT_MAX_CHARS)
    try:
        return _fit_report(_report_fields(result), limit)
    except Exception:  # an ExecutionResult built by hand can hold anything
        return _fit_report({"ok": _ok(result)}, limit)


def _report_fields(result: ExecutionResult) -> dict[str, Any]:
    fields: dict[str, Any] = {"ok": _ok(result)}
    if _exit_status(result) is not None:
        fields["exit_status"] = _exit_status(result)
    fields |= {
        "stdout": _Piece.of_stream(result.stdout, result.stdout_info),
        "stderr": _Piece.of_stream(result.stderr, result.stderr_info),
    }
    error = result.error
    if error is None:
        if result.return_value is not None:
            fields["return_value"] = _json_text(result.return_value)
    else:
        fields["error"] = {
            "kind": _kind(error.kind),
            "message": _clean(error.message),
            "traceback": _clean(error.traceback) if error.traceback else None,
            "guidance": _clean(error.guidance),
        }
    return fields


def _fit_report(fields: dict[str, Any], limit: int) -> str:
    """The largest equal share per long field at which the JSON text fits in ``limit``."""
    whole = _render_report(fields, limit)
    if len(whole) <= limit:
        return whole
    low, high = 0, limit
    best: str | None = None
    while low <= high:
        share = (low + high) // 2
        text = _render_report(fields, share)
        if len(text) <= limit:
            best, low = text, share + 1
        else:
            high = share - 1
    if best is not None:
        return best
    # Not even the fields' names fit: the verdict alone, else nothing but a cut.
    error = fields.get("error")
    verdict: dict[str, Any] = {"ok": fields.get("ok", False)}
    if isinstance(error, dict):
        verdict["error"] = {"kind": error.get("kind")}
    text = json.dumps(verdict, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit]


def _render_report(fields: dict[str, Any], share: int) -> str:
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if name == "return_value":
            encoded = str(value)
            if len(encoded) <= share:
                out[name] = json.loads(encoded)
            else:
                out[name] = cut_text(encoded, share)
                out["return_value_truncated"] = True
        elif name == "error" and isinstance(value, dict):
            out[name] = {
                key: cut_text(part, share) if isinstance(part, str) and key != "kind" else part
                for key, part in value.items()
            }
        elif isinstance(value, _Piece):
            out[name] = value.cut(share)
        elif isinstance(value, str):
            out[name] = cut_text(value, share)
        else:
            out[name] = value
    return json.dumps(out, ensure_ascii=False)


# ---------------------------------------------------------------- OpenAI and xAI


def shell_call_output(
    results: ExecutionResult | Sequence[ExecutionResult],
    call_id: str,
    *,
    max_output_length: Any = None,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> dict[str, Any]:
    """A ``shell_call_output`` item answering ``call_id``, one output per result (one per
    command of the ``shell_call``, in order), for OpenAI's and xAI's Responses API.

    ``max_output_length`` is the value the ``shell_call`` action carried: each stream is cut
    to it and it is passed back. ``max_chars`` caps one command's stdout and stderr together.
    A return value is echoed as its JSON text on a last line of stdout (as a notebook shows a
    final expression); a failure is described on stderr after what the program wrote there.
    """
    if isinstance(results, ExecutionResult):
        results = [results]
    model_limit = _optional_limit(max_output_length)
    limit = _limit(max_chars, DEFAULT_MAX_CHARS)
    outputs = []
    for result in results:
        stdout, stderr = _split(*_streams(result), limit, model_limit)
        outcome: dict[str, Any]
        if _kind_of(result) == ErrorKind.TIMEOUT.value:
            outcome = {"type": "timeout"}
        else:
            outcome = {"type": "exit", "exit_code": _exit_code(result)}
        outputs.append({"stdout": stdout, "stderr": stderr, "outcome": outcome})
    item: dict[str, Any] = {"type": "shell_call_output", "call_id": str(call_id), "output": outputs}
    if model_limit is not None:
        item["max_output_length"] = model_limit
    return item


# ---------------------------------------------------------------- Gemini


def gemini_code_execution_result(
    result: ExecutionResult, *, id: str | None = None, max_chars: int = DEFAULT_MAX_CHARS
) -> dict[str, Any]:
    """A ``Part`` holding a ``codeExecutionResult``, the REST API's camelCase JSON.

    ``output`` is what the API documents: stdout when the program succeeded, stdout and then
    stderr (with the failure described) otherwise. ``id`` is the ``executableCode`` part's
    id, when the model's part carried one.
    """
    kind = _kind_of(result)
    stdout, stderr = _streams(result)
    if kind is None and _exit_status(result) not in (None, 0):
        outcome = "OUTCOME_FAILED"  # a command that exited non-zero: stderr says why
    elif kind is None:
        outcome, stderr = "OUTCOME_OK", _Piece("")
    elif kind == ErrorKind.TIMEOUT.value:
        outcome = "OUTCOME_DEADLINE_EXCEEDED"
    else:
        outcome = "OUTCOME_FAILED"
    shown_out, shown_err = _split(stdout, stderr, _limit(max_chars, DEFAULT_MAX_CHARS))
    body: dict[str, Any] = {"outcome": outcome, "output": shown_out + shown_err}
    if id is not None:
        body["id"] = str(id)
    return {"codeExecutionResult": body}


# ---------------------------------------------------------------- shared pieces


def cut_text(text: str, limit: int, *, gap_bytes: int = 0, gap_lines: int = 0) -> str:
    """``text`` if it has at most ``limit`` characters, else a head and a tail of it with the
    omitted middle counted (output.py's preview, so every cut in the project reads alike),
    never longer than ``limit``. Below the room the count itself needs, just the head.

    ``gap_bytes`` and ``gap_lines``: ``text`` is a stream's preview that already left that
    much out. Its marker is found and the new one counts both omissions, so a preview cut
    shorter still says how much of the stream the model does not see.
    """
    limit = max(0, limit)
    if len(text) <= limit:
        return text
    head, tail = text, ""
    if gap_bytes > 0:
        marker = omission_marker(gap_bytes, gap_lines)
        at = text.find(marker)
        if at >= 0:
            head, tail = text[:at], text[at + len(marker) :]
        else:
            gap_bytes = gap_lines = 0
    head_bytes, tail_bytes = head.encode("utf-8", "replace"), tail.encode("utf-8", "replace")
    # The marker counting everything is at least as long as any marker of a shorter cut.
    widest = omission_marker(
        gap_bytes + len(head_bytes) + len(tail_bytes),
        gap_lines + head_bytes.count(b"\n") + tail_bytes.count(b"\n"),
    )
    room = limit - len(widest)
    if room <= 0:
        return text[:limit]
    # Bytes bound characters, so a byte budget of ``room`` shows at most ``room`` of them.
    return preview_of(head_bytes, tail_bytes, gap_bytes, gap_lines, room).text


@dataclass(frozen=True)
class _Piece:
    """Text to cut, and what its stream's preview already left out of it."""

    text: str
    gap_bytes: int = 0
    gap_lines: int = 0

    @classmethod
    def of_stream(cls, text: str, info: object) -> _Piece:
        gap_bytes = getattr(info, "omitted_bytes", 0)
        gap_lines = getattr(info, "omitted_lines", 0)
        if not isinstance(gap_bytes, int) or not isinstance(gap_lines, int):
            gap_bytes = gap_lines = 0
        return cls(_clean(text), gap_bytes, gap_lines)

    def plus(self, more: str) -> _Piece:
        return _Piece(self.text + more, self.gap_bytes, self.gap_lines)

    def cut(self, limit: int) -> str:
        return cut_text(self.text, limit, gap_bytes=self.gap_bytes, gap_lines=self.gap_lines)


def _streams(result: ExecutionResult) -> tuple[_Piece, _Piece]:
    """The stdout and stderr texts of a result (see :func:`shell_call_output`)."""
    try:
        return _stdout_text(result), _stderr_text(result)
    except Exception:  # an ExecutionResult built by hand can hold anything
        return _Piece(""), _Piece("[invalid_output] the result could not be shown\n")


def _stdout_text(result: ExecutionResult) -> _Piece:
    piece = _Piece.of_stream(result.stdout, result.stdout_info)
    if _ok(result) and result.return_value is not None:
        piece = piece.plus(_newline_after(piece.text) + _json_text(result.return_value) + "\n")
    return piece


def _stderr_text(result: ExecutionResult) -> _Piece:
    piece = _Piece.of_stream(result.stderr, result.stderr_info)
    error = result.error
    if error is None:
        return piece
    text = ""
    if error.traceback:
        text = _clean(error.traceback)
        text += _newline_after(text)
    text += f"[{_kind(error.kind)}] {_clean(error.message)}\n{_clean(error.guidance)}\n"
    return piece.plus(_newline_after(piece.text) + text)


def _newline_after(text: str) -> str:
    return "\n" if text and not text.endswith("\n") else ""


def _split(first: _Piece, second: _Piece, limit: int, each: int | None = None) -> tuple[str, str]:
    """Cut two texts to ``limit`` characters together and to ``each`` apiece: a short one
    stays whole and the other gets the rest; two long ones get half each."""
    size_a, size_b = len(first.text), len(second.text)
    if size_a + size_b <= limit:
        share_a, share_b = size_a, size_b
    elif size_a <= limit // 2:
        share_a, share_b = size_a, limit - size_a
    elif size_b <= limit // 2:
        share_a, share_b = limit - size_b, size_b
    else:
        share_a, share_b = limit // 2, limit - limit // 2
    if each is not None:
        share_a, share_b = min(share_a, each), min(share_b, each)
    return first.cut(share_a), second.cut(share_b)


def _json_text(value: Any) -> str:
    """A return value's JSON text. A value that is not JSON data (only possible in a result
    built by hand) is shown as its repr, as a JSON string."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except Exception:
        try:
            text = json.dumps(_clean(repr(value)), ensure_ascii=False)
        except Exception:
            text = '"<a value that cannot be shown>"'
    cleaned = _clean(text)
    if cleaned != text:
        # Lone surrogates cannot be encoded for the wire: replaced, the JSON still parses.
        try:
            json.loads(cleaned)
        except ValueError:
            cleaned = json.dumps(cleaned, ensure_ascii=False)
    return cleaned


def _clean(text: object) -> str:
    """A str that encodes to UTF-8 (lone surrogates replaced), whatever was there."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    return text.encode("utf-8", "replace").decode("utf-8")


def _ok(result: ExecutionResult) -> bool:
    return getattr(result, "error", None) is None


def _exit_status(result: ExecutionResult) -> int | None:
    """A command's exit status, when the result holds a valid one."""
    status = getattr(result, "exit_status", None)
    valid = isinstance(status, int) and not isinstance(status, bool) and 0 <= status <= 255
    return status if valid else None


def _exit_code(result: ExecutionResult) -> int:
    """A shell_call_output's exit code: a command's own status, else the CLI's."""
    status = _exit_status(result)
    if status is not None:
        return status
    return EXIT_OK if _ok(result) else EXIT_FAILED


def _kind(kind: object) -> str:
    return kind.value if isinstance(kind, ErrorKind) else _clean(kind)


def _kind_of(result: ExecutionResult) -> str | None:
    error = getattr(result, "error", None)
    return None if error is None else _kind(getattr(error, "kind", ""))


def _limit(value: object, default: int) -> int:
    found = _optional_limit(value)
    return default if found is None else found


def _optional_limit(value: object) -> int | None:
    """A non-negative whole number of characters, or None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, float) and math.isfinite(value):
        return max(0, int(value))
    return None
