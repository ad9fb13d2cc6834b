"""The frame reader and codec under libFuzzer, through atheris: coverage-guided bytes fed to
:func:`~psych_sandbox_testing.reader_fuzz.feed_reader`, from a seed corpus of
interesting lines. atheris comes with the test extra where it has wheels (Linux x86_64).

libFuzzer exits the process it runs in, so it runs in a child (``python -m`` this module with
libFuzzer's own flags); a crash (any exception but the documented ProtocolViolation path), an
input slower than its timeout or an allocation past its limit is a finding, written to the
scratch directory and reported with the child's output.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Outcome", "available", "fuzz"]


def available() -> bool:
    """Whether atheris can be imported here."""
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class Outcome:
    """What one libFuzzer run found: nothing (``ok``), or its findings and the child's words."""

    ok: bool
    #: libFuzzer's closing statistics (its DONE line, the number of inputs run).
    stats: list[str]
    #: Each finding's file name and its first bytes.
    findings: list[tuple[str, bytes]]
    #: The end of the child's output, where it failed.
    output: str


def fuzz(bounds: Sequence[str], *, input_seconds: int = 10, rss_limit_mib: int = 2048) -> Outcome:
    """Run libFuzzer on the reader and codec, bounded by ``bounds`` (libFuzzer's own flags:
    ``-max_total_time=S`` or ``-runs=N``, with ``-seed=N`` for a repeatable run)."""
    from .reader_fuzz import interesting_seeds

    with tempfile.TemporaryDirectory(prefix="psych-fuzz-") as scratch:
        corpus = Path(scratch, "corpus")
        corpus.mkdir()
        for index, seed in enumerate(interesting_seeds()):
            (corpus / f"seed-{index}").write_bytes(seed)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                __name__,
                *bounds,
                f"-timeout={input_seconds}",
                f"-rss_limit_mb={rss_limit_mib}",
                f"-malloc_limit_mb={rss_limit_mib}",
                "-max_len=1048576",
                f"-artifact_prefix={scratch}/",
                "-print_final_stats=1",
                str(corpus),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        stats = [
            line
            for line in done.stderr.splitlines()
            if "DONE" in line or "ERROR" in line or line.startswith("stat::number_of")
        ]
        findings = sorted(
            (path.name, path.read_bytes()[:400])
            for path in Path(scratch).iterdir()
            if path.name != "corpus"
        )
    ok = done.returncode == 0 and not findings
    return Outcome(ok, stats, findings, "" if ok else done.stderr[-4000:])


def _child(argv: list[str]) -> None:
    import atheris

    # Instrumented for coverage: what is imported inside this block.
    with atheris.instrument_imports(include=["psych_sandbox_core"]):
        from psych_sandbox_testing import reader_fuzz
    atheris.Setup([sys.argv[0], *argv], reader_fuzz.feed_reader)
    atheris.Fuzz()


if __name__ == "__main__":
    _child(sys.argv[1:])
