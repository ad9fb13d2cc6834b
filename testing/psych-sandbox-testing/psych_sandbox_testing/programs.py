"""Programs the backends' tests run, and what the host must see of them, written once.

Every backend is asked the same questions (can one execution read another's workspace? do the
files a program leaves come back whole, and are the tricky ones skipped?), so the program and
the expected answer live here rather than in each plugin's tests.
"""

from __future__ import annotations

import hashlib
import textwrap

import anyio
from psych_sandbox_core import DeploymentConfig, ExecutionResult, FunctionBindings, Sandbox

from .host import cgroup_directories, cgroups_left


def secret_holder(mark: str, secret: str) -> str:
    """A program that keeps ``secret`` in its workspace while a process carrying ``mark``
    runs, so another execution can be set to look for it."""
    return textwrap.dedent(
        f"""
        import subprocess, sys
        with open("secret.txt", "w") as fh:
            fh.write({secret!r})
        subprocess.run([sys.executable, "-c", "import time; time.sleep(60)", {mark!r}])
        """
    ).lstrip("\n")


#: Looks for secret.txt through every process it can see, by each way /proc offers, and
#: returns what it read (the list must come back empty).
SECRET_SPY = textwrap.dedent(
    """
    import os
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        candidates = [f"/proc/{entry}/cwd/secret.txt", f"/proc/{entry}/root/workspace/secret.txt"]
        try:
            candidates.append(f"/proc/{entry}/root" + os.readlink(f"/proc/{entry}/cwd")
                              + "/secret.txt")
        except OSError:
            pass
        for path in candidates:
            try:
                with open(path) as fh:
                    found.append(fh.read())
            except OSError:
                pass
    print("looked at", len(os.listdir("/proc")), "entries")
    found
    """
).lstrip("\n")

#: Leaves files worth collecting and every kind of entry a collection must skip.
PLANTED_ARTIFACTS = """
import os
os.makedirs("out/deep")
open("out/report.txt", "w").write("hello\\n")
open("out/data.json", "w").write('{"a": [1, 2]}')
open("out/deep/image.png", "wb").write(b"\\x89PNG\\r\\n\\x1a\\n" + bytes(range(256)) * 8)
open("out/big.bin", "wb").write(bytes(range(256)) * 8192 + b"end")
open("out/original", "w").write("linked")
os.link("out/original", "out/hardlink")
os.symlink("/etc/passwd", "out/leak")
os.mkfifo("out/pipe")
os.chdir("/")
"done"
"""

#: What PLANTED_ARTIFACTS must hand back: path -> (bytes, sniffed content type).
PLANTED_EXPECTED: dict[str, tuple[bytes, str]] = {
    "out/report.txt": (b"hello\n", "text/plain; charset=utf-8"),
    "out/data.json": (b'{"a": [1, 2]}', "application/json"),
    "out/deep/image.png": (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8, "image/png"),
    "out/big.bin": (bytes(range(256)) * 8192 + b"end", "application/octet-stream"),
}

#: What PLANTED_ARTIFACTS must list as skipped, and why.
PLANTED_SKIPPED = {
    "out/leak": "symlink",
    "out/pipe": "fifo",
    "out/hardlink": "hard_link",
    "out/original": "hard_link",
}


async def check_planted_artifacts(
    sandbox: Sandbox,
    result: ExecutionResult,
    expected: dict[str, tuple[bytes, str]] = PLANTED_EXPECTED,
    skipped: dict[str, str] = PLANTED_SKIPPED,
) -> None:
    """Every expected file came back whole (digest, type, size, the stored bytes), nothing
    else did, and every trick was listed as skipped for its reason."""
    assert result.error is None, result.error
    got = {artifact.path: artifact for artifact in result.artifacts}
    assert set(got) == set(expected), sorted(got)
    for path, (data, kind) in expected.items():
        assert got[path].sha256 == hashlib.sha256(data).hexdigest(), path
        assert got[path].content_type == kind, path
        assert got[path].size_bytes == len(data), path
        kept = await sandbox.attachments.read_all(
            got[path].attachment, tenant=result.tenant or "default", run_id=result.run_id or ""
        )
        assert kept == data, path
    assert {entry.path: entry.reason for entry in result.skipped_artifacts} == skipped


async def cgroups_of_one_execution(
    config: DeploymentConfig, profile: str, source: str, *, cancel: bool = False
) -> tuple[ExecutionResult | None, list[str], list[str]]:
    """Run ``source``, which calls ``await seen()`` once it runs, in a sandbox of its own, and
    look at every cgroup hierarchy (v1 controllers and v2) from the host: the result (None
    when ``cancel`` cancelled the run at ``seen()``), the cgroup directories that were new
    while the program ran, and those still new after the sandbox closed."""
    before = cgroup_directories()
    during: list[str] = []
    reached = anyio.Event()

    def seen() -> None:
        during.extend(sorted(cgroup_directories() - before))
        reached.set()

    result: ExecutionResult | None = None
    with anyio.fail_after(120):
        async with Sandbox(config) as sandbox, anyio.create_task_group() as tg:

            async def execution() -> None:
                nonlocal result
                result = await sandbox.run(
                    source, profile=profile, bindings=FunctionBindings({"seen": seen})
                )

            tg.start_soon(execution)
            if cancel:
                await reached.wait()
                tg.cancel_scope.cancel()
    return result, during, cgroups_left(before)


#: A daemon that escapes the program's session and ignores SIGTERM: started, and known to be
#: running (it writes to a pipe), before the program goes on.
DAEMON = """
import os, sys, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
r, w = os.pipe()
os.set_inheritable(w, True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        code = "import os, sys, signal, time\\n" \\
               "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n" \\
               "os.write(int(sys.argv[1]), b'x')\\n" \\
               "while True: time.sleep(1)"
        os.execv(sys.executable, [sys.executable, "-c", code, str(w), {mark!r}])
    os._exit(0)
os.close(w)
assert os.read(r, 1) == b"x"
os.wait()
"""

#: What a program leaves on both streams and returns, warm or cold.
WARM_PROGRAM = """
import sys
print("out", 2 + 2)
print("err", file=sys.stderr)
{"answer": [1, 2, 3]}
"""

#: The program reaches the control channel the way a hostile one would: the bootstrap's own
#: channel object is in its interpreter, whatever transport the backend chose.
FORGE = """
import gc
channel = next(o for o in gc.get_objects()
               if type(o).__name__ == "Channel" and hasattr(o, "sock"))
channel.sock.sendall({payload!r})
import time
time.sleep(60)
"""

HOSTILE_FRAMES = {
    "junk-field": b'{"type":"call","id":0,"name":"t","arguments":{},"evil":"payload"}\n',
    "binary-garbage": bytes(range(256)) * 16 + b"\n",
    "reply-from-child": b'{"type":"reply","id":0,"carries":"value","value_json":"1"}\n',
}
