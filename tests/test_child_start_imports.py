"""What the child imports on its way to the program that the program did not ask for: the
network probe asks about interfaces other than loopback only where there are any (an isolated
child has loopback alone), so such a child imports nothing for it. Judged in a fresh isolated
interpreter from the modules it holds, never by timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from psych_sandbox_core.bootstrap_loader import bootstrap_source

_PROBE = """
import sys, _socket
names = [tuple(pair) for pair in INTERFACES]
_socket.if_nameindex = lambda: names
namespace = {"__name__": "bootstrap"}
exec(compile(SOURCE, "<bootstrap>", "exec"), namespace)
before = set(sys.modules)
up = namespace["_interfaces_up"]()
print(up, sorted(set(sys.modules) - before))
"""


@pytest.mark.parametrize(
    ("interfaces", "expected"),
    [
        ([(1, "lo")], "[] []"),
        # An interface the kernel does not know answers nothing: counted as up (the safe side).
        ([(1, "lo"), (7, "no-such-if0")], "['no-such-if0'] ['fcntl']"),
    ],
)
def test_the_network_probe_imports_only_where_there_is_more_than_loopback(
    tmp_path: Path, interfaces: list[tuple[int, str]], expected: str
) -> None:
    script = tmp_path / "probe.py"
    script.write_text(f"SOURCE = {bootstrap_source()!r}\nINTERFACES = {interfaces!r}\n" + _PROBE)
    completed = subprocess.run(
        [sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == expected
