"""What the child imports on its way to the program that the program did not ask for: the
network probe asks about interfaces other than loopback only where there are any (an isolated
child has loopback alone), so such a child imports nothing for it; containment calls the C
library without the ctypes package; asyncio is prepared only while a warm child waits idle.
Judged in a fresh isolated interpreter from the modules it holds, never by timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from psych_sandbox_core.child.loader import bootstrap_source


def _in_fresh_interpreter(tmp_path: Path, body: str, *args: str, **constants: object) -> str:
    """What ``body`` prints in a fresh isolated interpreter, run with ``args``, the bootstrap's
    source as ``SOURCE`` and each of ``constants`` defined ahead of it (it must exit 0)."""
    script = tmp_path / "child.py"
    defined = "".join(f"{name} = {value!r}\n" for name, value in constants.items())
    script.write_text(f"SOURCE = {bootstrap_source()!r}\n{defined}{body}")
    completed = subprocess.run(
        [sys.executable, "-I", str(script), *args], capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


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
    printed = _in_fresh_interpreter(tmp_path, _PROBE, INTERFACES=interfaces)
    assert printed.strip() == expected


_LIBC = """
import sys
if BROKEN:
    # The bootstrap's own call (no mode) fails as on an interpreter whose _ctypes differs;
    # the ctypes package's (with one) goes through.
    import _ctypes
    dlopen = _ctypes.dlopen
    def refuse(name, *mode):
        if not mode:
            raise TypeError("not this _ctypes")
        return dlopen(name, *mode)
    _ctypes.dlopen = refuse
namespace = {"__name__": "bootstrap"}
exec(compile(SOURCE, "<bootstrap>", "exec"), namespace)
before = set(sys.modules)
libc = namespace["_load_libc"]()
# PR_GET_DUMPABLE (3), and unshare of nothing: both answer 0 or more only if really called.
print(libc.prctl(3, 0, 0, 0, 0), libc.unshare(0), "ctypes" in set(sys.modules) - before)
"""


@pytest.mark.parametrize(("broken", "imports_ctypes"), [(False, False), (True, True)])
def test_containment_calls_the_c_library_without_the_ctypes_package(
    tmp_path: Path, broken: bool, imports_ctypes: bool
) -> None:
    # The ctypes package costs a cold child milliseconds for two calls; where _ctypes is not
    # what the bootstrap expects, ctypes itself still makes them.
    printed = _in_fresh_interpreter(tmp_path, _LIBC, BROKEN=broken)
    assert printed.split() == ["1", "0", str(imports_ctypes)]


_PREPARE = """
import sys, _socket
namespace = {"__name__": "bootstrap"}
exec(compile(SOURCE, "<bootstrap>", "exec"), namespace)
mine, host = _socket.socketpair()
if sys.argv[1] == "program-waiting":
    host.sendall(b'{"type":"run"}\\n')
built = []
build = namespace["build_program"]
namespace["build_program"] = lambda source: built.append(source) or build(source)
namespace["_prepare_while_idle"](mine)
waiting = mine.recv(64, _socket.MSG_PEEK) if sys.argv[1] == "program-waiting" else b""
# The warm-up text is built, never run: nothing of it is defined anywhere.
ran = "warmed_up" in namespace or "warmed_up" in vars(sys.modules["builtins"])
warmed = built == [namespace["WARM_UP_SOURCE"]]
print("asyncio" in sys.modules, "logging" in sys.modules, waiting, warmed, ran)
"""


@pytest.mark.parametrize(("state", "prepared"), [("idle", True), ("program-waiting", False)])
def test_a_child_imports_asyncio_only_while_it_waits_idle_for_its_program(
    tmp_path: Path, state: str, prepared: bool
) -> None:
    # An idle (warm) child prepares asyncio and builds (never runs) a text of its own, which
    # warms the compiler's path; a child whose program is already there (cold) does neither
    # and leaves the program's frame unread.
    printed = _in_fresh_interpreter(tmp_path, _PREPARE, state)
    waiting = b'{"type":"run"}\n' if state == "program-waiting" else b""
    expected = [str(prepared), str(prepared), repr(waiting), str(prepared), "False"]
    assert printed.split() == expected
