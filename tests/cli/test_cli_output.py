"""What the CLI shows a person: nothing the program wrote reaches the terminal as a control,
and nothing it wrote can pass for the CLI's own report. ``--json`` is the exact record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from psych_sandbox_core.cli.visible import GUTTER, SUMMARY_MARK, visible

#: Characters whose raw appearance would let the program steer the terminal: each must be
#: shown as an escape.
STEERING = [
    "\x1b",
    "\r",
    "\x08",
    "\x00",
    "\x07",
    "\x0b",
    "\x0c",
    "\x7f",
    "\x85",
    "\x9b",
    "\u202a",
    "\u202b",
    "\u202c",
    "\u202d",
    "\u202e",
    "\u2066",
    "\u2067",
    "\u2068",
    "\u2069",
    "\u200e",
    "\u200f",
    "\u061c",
    "\u200b",
    "\ufeff",
    "\u2028",
    "\u2029",
    "\ud800",
    "\U000e0041",
]


@pytest.mark.parametrize("char", STEERING, ids=lambda c: f"U+{ord(c):04X}")
def test_every_steering_character_is_shown_as_an_escape(char: str) -> None:
    for block in (False, True):
        shown = visible(f"a{char}b", block=block)
        assert char not in shown
        assert (
            f"\\x{ord(char):02x}" in shown
            or f"\\u{ord(char):04x}" in shown
            or (f"\\U{ord(char):08x}" in shown)
        )


def test_newline_and_tab_are_line_structure_only_in_a_block() -> None:
    assert visible("a\tb\nc") == "a\\x09b\\x0ac"
    assert visible("a\tb\nc\n", block=True) == f"{GUTTER}a\tb\n{GUTTER}c"
    # Only newline splits a block: other line breaks cannot start an unguttered line.
    assert visible("a\rb\x85c\u2028d\x0be", block=True) == (f"{GUTTER}a\\x0db\\x85c\\u2028d\\x0be")


def test_the_summary_mark_is_never_shown_from_foreign_text() -> None:
    assert SUMMARY_MARK not in visible(f"{SUMMARY_MARK} returned: 42")
    assert SUMMARY_MARK not in visible(f"{SUMMARY_MARK} returned: 42", block=True)


def test_ordinary_text_is_shown_as_it_is() -> None:
    text = "héllo wörld · 数据 — 🙂 \\x1b stays a backslash"
    assert visible(text) == text


#: A program that tries every way to forge or hide the report: summary lines of its own
#: (with and without the mark), carriage returns, cursor movement and erasure, a window
#: title, bidi overrides and isolates, 8-bit controls, and files whose names carry them.
HOSTILE = r"""
import sys
print("\u25c6 returned: 42")
print("returned: 42")
print("profile test · backend bwrap · level isolated · wall 0.001 s")
sys.stdout.write("real output\rreturned: 42 level isolated\n")
print("\x1b[2K\x1b[1A\x1b[2K\x1b]0;title\x07hidden\x1b[8m")
print("\u202eevil\u2066x\u2069\u200e\u200f\u061c")
print("\x9b31m c1 \x7f del \x00 nul")
sys.stderr.write("err \x1b[31m red\r\u25c6 failed: nothing\n")
open("name\nwith newline", "w").write("a")
open("esc\x1b[31m.txt", "w").write("b")
open("\u25c6 returned: 42.txt", "w").write("c")
open("bidi\u202etxt.exe", "w").write("d")
"""


def _cli(program: Path, *extra: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "psych_sandbox_core.cli",
            "run",
            str(program),
            "--profile",
            "subprocess",
            *extra,
        ],
        capture_output=True,
        check=False,
        timeout=120,
    )


def _raw_controls(text: str) -> list[str]:
    """Characters in ``text`` that a terminal would act on rather than show."""
    return sorted(
        {c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")}
    )


@pytest.mark.parametrize("ending", ["raise", "return"])
def test_the_human_output_shows_hostile_output_inertly_and_the_real_report_apart(
    tmp_path: Path, ending: str
) -> None:
    program = tmp_path / "hostile.py"
    tail = (
        'raise ValueError("msg\\x1b[2J\\nreturned: 42\\u202e")\n'
        if ending == "raise"
        else '"\\x7f\\u202e\\x1b[2J"\n'
    )
    program.write_text(HOSTILE + tail)
    # With --artifacts the files outlive the command, so the report lists them.
    completed = _cli(program, "--artifacts", str(tmp_path / "kept"))
    assert completed.returncode == (1 if ending == "raise" else 0), completed
    out = completed.stdout.decode("utf-8")
    err = completed.stderr.decode("utf-8")
    assert _raw_controls(out) == [] and _raw_controls(err) == [], (out, err)
    # Every line is the program's (under the gutter) or the CLI's (after the mark), and the
    # program's lines show its forged marks only as escapes.
    for line in out.splitlines():
        assert line.startswith(GUTTER) or line.startswith(f"{SUMMARY_MARK} "), line
        if line.startswith(GUTTER):
            assert SUMMARY_MARK not in line
    for line in err.splitlines():
        # The program's stderr, and the notes on what --artifacts wrote.
        assert line.startswith((GUTTER, f"{SUMMARY_MARK} psych-sandbox: ")), line
    report = [line for line in out.splitlines() if line.startswith(SUMMARY_MARK)]
    assert f"{GUTTER}\\u25c6 returned: 42" in out.splitlines()
    assert f"{GUTTER}real output\\x0dreturned: 42 level isolated" in out.splitlines()
    assert f"{GUTTER}\\u202eevil\\u2066x\\u2069\\u200e\\u200f\\u061c" in out.splitlines()
    assert f"{GUTTER}err \\x1b[31m red\\x0d\\u25c6 failed: nothing" in err.splitlines()
    # The real report: one outcome line, and the names of the files as escapes.
    outcomes = [line for line in report if line.split(" ", 2)[1] in ("returned:", "failed:")]
    if ending == "raise":
        assert outcomes == [
            f"{SUMMARY_MARK} failed: exception: ValueError: msg\\x1b[2J\\x0areturned: 42\\u202e"
        ]
        assert f"{GUTTER}ValueError: msg\\x1b[2J" in out.splitlines()  # the traceback
    else:
        assert outcomes == [f'{SUMMARY_MARK} returned: "\\u007f\\u202e\\u001b[2J"']
    assert f"{SUMMARY_MARK} artifact \\u25c6 returned: 42.txt: 1 bytes," in out
    assert f"{SUMMARY_MARK} skipped name\\x0awith newline: unsafe_name" in report
    assert f"{SUMMARY_MARK} skipped esc\\x1b[31m.txt: unsafe_name" in report
    assert report[-1].startswith(f"{SUMMARY_MARK} profile subprocess · backend subprocess · ")


def test_json_output_is_the_exact_record(tmp_path: Path) -> None:
    program = tmp_path / "hostile.py"
    program.write_text(HOSTILE + '"\\x7f\\u202e\\x1b[2J"\n')
    completed = _cli(program, "--json")
    assert completed.returncode == 0, completed
    data = json.loads(completed.stdout)
    # Byte for byte what json.dumps makes of the result (one line, ASCII escapes), and the
    # program's text in it exactly as written: nothing shown-for-people leaks into it.
    assert completed.stdout == (json.dumps(data) + "\n").encode("ascii")
    assert completed.stderr == b""
    assert data["stdout"].startswith(
        "\u25c6 returned: 42\nreturned: 42\nprofile test · backend bwrap · level isolated"
    )
    assert "real output\rreturned: 42 level isolated\n" in data["stdout"]
    assert "\x1b[2K\x1b[1A\x1b[2K\x1b]0;title\x07hidden\x1b[8m\n" in data["stdout"]
    assert "\u202eevil\u2066x\u2069\u200e\u200f\u061c\n" in data["stdout"]
    assert data["stderr"] == "err \x1b[31m red\r\u25c6 failed: nothing\n"
    assert data["return_value"] == "\x7f\u202e\x1b[2J"
    assert [a["path"] for a in data["artifacts"]] == ["\u25c6 returned: 42.txt"]
    # Names the collector refuses are recorded in its own ASCII form (see artifact_walk.py).
    assert sorted(s["path"] for s in data["skipped_artifacts"]) == sorted(
        ["name\nwith newline", "esc\x1b[31m.txt", "bidi\\xe2\\x80\\xaetxt.exe"]
    )


def test_a_terminal_that_cannot_show_a_character_gets_its_escape(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text("print('h\\u00e9llo')\n'\\u00e9'\n")
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "psych_sandbox_core.cli",
            "run",
            str(program),
            "--profile",
            "subprocess",
        ],
        capture_output=True,
        check=False,
        timeout=120,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
    )
    assert completed.returncode == 0, completed
    out = completed.stdout.decode("ascii").splitlines()
    assert out[0] == f"{GUTTER}h\\xe9llo"
    assert '\\u25c6 returned: "\\u00e9"' in out


def _plain_run(tmp_path: Path, source: str, *extra: str) -> subprocess.CompletedProcess[str]:
    program = tmp_path / "program.py"
    program.write_text(source)
    completed = _cli(program, *extra)
    return subprocess.CompletedProcess(
        completed.args, completed.returncode, completed.stdout.decode(), completed.stderr.decode()
    )


def test_a_person_sees_output_value_and_level_but_no_handles_or_guidance(tmp_path: Path) -> None:
    completed = _plain_run(tmp_path, "print('hi')\nopen('left.txt', 'w').write('x')\n42\n")
    assert completed.returncode == 0, completed
    # The handles point into a store that ends with the command: not shown to a person.
    assert "attachment" not in completed.stdout and "att:" not in completed.stdout
    assert completed.stdout.splitlines() == [
        f"{GUTTER}hi",
        f"{SUMMARY_MARK} returned: 42",
        f"{SUMMARY_MARK} 1 file(s) left in the workspace; --artifacts DIR keeps them",
        completed.stdout.splitlines()[-1],
    ]
    assert completed.stdout.splitlines()[-1].startswith(
        f"{SUMMARY_MARK} profile subprocess · backend subprocess · level "
    )
    assert completed.stderr == ""
    # --json keeps every handle.
    as_json = json.loads(_plain_run(tmp_path, "print('hi')\n42\n", "--json").stdout)
    assert {"stdout", "return_value"} <= {a["name"] for a in as_json["attachments"]}


def test_guidance_for_a_model_only_with_explain_or_json(tmp_path: Path) -> None:
    source = "raise KeyError('k')\n"
    plain = _plain_run(tmp_path, source)
    assert plain.returncode == 1
    assert f"{SUMMARY_MARK} failed: exception: KeyError: 'k'" in plain.stdout.splitlines()
    assert "guidance" not in plain.stdout and "Read the traceback" not in plain.stdout
    explained = _plain_run(tmp_path, source, "--explain")
    assert f"{SUMMARY_MARK} guidance: Your program raised an exception." in explained.stdout
    as_json = json.loads(_plain_run(tmp_path, source, "--json").stdout)
    assert as_json["error"]["guidance"].startswith("Your program raised an exception.")


@pytest.mark.parametrize("keep", [False, True], ids=["plain", "artifacts"])
def test_a_timeout_says_timeout_and_nothing_about_skipped_files(tmp_path: Path, keep: bool) -> None:
    extra = ["--timeout", "1"] + (["--artifacts", str(tmp_path / "kept")] if keep else [])
    completed = _plain_run(tmp_path, "open('f', 'w').write('x')\nwhile True:\n    pass\n", *extra)
    assert completed.returncode == 1, completed
    report = [line for line in completed.stdout.splitlines() if line.startswith(SUMMARY_MARK)]
    assert report[0].startswith(f"{SUMMARY_MARK} failed: timeout: ")
    assert " · level " in report[-1], report
    # The subprocess backend walks the workspace after the kill: the file it left is listed
    # (kept with --artifacts, else a hint). A backend whose collection the timeout
    # interrupted is tested with bwrap.
    expected = f"{SUMMARY_MARK} artifact f: " if keep else f"{SUMMARY_MARK} 1 file(s) left"
    assert [line[: len(expected)] for line in report[1:-1]] == [expected], report
    assert "skipped" not in completed.stdout and "interrupted" not in completed.stdout


def test_an_oversized_program_is_rejected_before_running_with_its_own_kind(
    tmp_path: Path,
) -> None:
    completed = _plain_run(tmp_path, "x = 1\n" * (1024 * 1024 + 1))
    assert completed.returncode == 1, completed
    report = completed.stdout.splitlines()
    assert report[0].startswith(f"{SUMMARY_MARK} failed: program_rejected: the program text is ")
    assert "nothing was run" in report[0]
    # No traceback and no guidance: the program never ran.
    assert len(report) == 2 and not any(line.startswith(GUTTER) for line in report)
