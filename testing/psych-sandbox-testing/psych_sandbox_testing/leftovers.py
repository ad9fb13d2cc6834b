"""State a program can leave without a process, planted once and looked for from the host.

One program plants every kind (SysV shared memory, message queue and semaphore set, files and
a directory tree in the shared temp directories, symlinks to a host file and directory, a POSIX
message queue, keys in its user, user-session and persistent keyrings) and reports what it
managed; another, run later under the same uid, reports what of it it can still find. The
host's own view (:func:`host_leftovers`) decides: /proc/sysvipc, the directories, an mqueue
filesystem mounted in a mount namespace of the test's own, /proc/key-users.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

from psych_sandbox_core.kit.posix.removal import remove_tree

# Whether the kernel charges any key to a uid, as the sweep asks it (an unreadable
# /proc/key-users counts as none): for a test's own check after an execution.
from psych_sandbox_core.kit.posix.sweep import has_keys as has_keys
from psych_sandbox_core.kit.posix.sweep import sweep

#: World-writable directories the planting program writes into, where it can.
PLANT_DIRECTORIES = ("/tmp", "/var/tmp", "/dev/shm")

_COMMON = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
MARK = {mark!r}
KEY = {key}
DIRS = {dirs!r}
KEYCTL, ADD_KEY = {{"x86_64": (250, 248), "aarch64": (219, 217)}}.get(os.uname().machine, (0, 0))
"""

_PLANT = """
done = {{}}
def record(kind, ok):
    done[kind] = bool(ok)
record("shm", libc.shmget(KEY, 4096, 0o1600) >= 0)
record("msg", libc.msgget(KEY + 1, 0o1600) >= 0)
record("sem", libc.semget(KEY + 2, 1, 0o1600) >= 0)
for d in DIRS:
    try:
        with open(f"{{d}}/{{MARK}}-file", "w") as fh:
            fh.write("left behind")
        os.makedirs(f"{{d}}/{{MARK}}-dir/a/b")
        with open(f"{{d}}/{{MARK}}-dir/a/b/deep", "w") as fh:
            fh.write("left behind")
        os.symlink({target!r}, f"{{d}}/{{MARK}}-link")
        os.symlink({target_dir!r}, f"{{d}}/{{MARK}}-dirlink")
        record(d, True)
    except OSError:
        record(d, False)
try:
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    rt.mq_open.restype = ctypes.c_int
    record("mqueue", rt.mq_open(("/" + MARK).encode(), os.O_CREAT | os.O_RDWR, 0o600, None) >= 0)
except OSError:
    record("mqueue", False)
if KEYCTL:
    for name, ring in (("user", -4), ("user_session", -5)):
        record("key_" + name, libc.syscall(ADD_KEY, b"user", f"{{MARK}}-{{name}}".encode(),
                                           b"left", 4, ctypes.c_long(ring)) > 0)
    persistent = libc.syscall(KEYCTL, 22, ctypes.c_long(-1), ctypes.c_long(-4))
    record("key_persistent", persistent > 0 and libc.syscall(
        ADD_KEY, b"user", f"{{MARK}}-persistent".encode(), b"left", 4,
        ctypes.c_long(persistent)) > 0)
json.dumps(done)
"""

_FIND = """
found = []
if libc.shmget(KEY, 0, 0) >= 0: found.append("shm")
if libc.msgget(KEY + 1, 0) >= 0: found.append("msg")
if libc.semget(KEY + 2, 0, 0) >= 0: found.append("sem")
for d in DIRS:
    for suffix in ("file", "dir", "link", "dirlink"):
        if os.path.lexists(f"{{d}}/{{MARK}}-{{suffix}}"):
            found.append(f"{{d}}/{{MARK}}-{{suffix}}")
try:
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    if rt.mq_open(("/" + MARK).encode(), os.O_RDONLY, 0, None) >= 0:
        found.append("mqueue")
except OSError:
    pass
if KEYCTL:
    for name, ring in (("user", -4), ("user_session", -5)):
        # KEYCTL_SEARCH the keyring (and below) for the planted key.
        if libc.syscall(KEYCTL, 10, ctypes.c_long(ring), b"user",
                        f"{{MARK}}-{{name}}".encode(), 0) > 0:
            found.append("key_" + name)
    persistent = libc.syscall(KEYCTL, 22, ctypes.c_long(-1), ctypes.c_long(-4))
    if persistent > 0 and libc.syscall(KEYCTL, 10, ctypes.c_long(persistent), b"user",
                                       f"{{MARK}}-persistent".encode(), 0) > 0:
        found.append("key_persistent")
json.dumps(found)
"""


def ipc_key(mark: str) -> int:
    """The SysV key the programs use for ``mark`` (positive, below 2**31, never IPC_PRIVATE)."""
    return 1 + zlib.crc32(mark.encode()) % (2**30)


def planting_program(mark: str, target: str, target_dir: str) -> str:
    """Plants every kind of leftover; returns (as JSON) which kinds it managed.
    ``target`` and ``target_dir`` are host paths its symlinks point at."""
    common = _COMMON.format(mark=mark, key=ipc_key(mark), dirs=PLANT_DIRECTORIES)
    return textwrap.dedent(common) + textwrap.dedent(
        _PLANT.format(target=target, target_dir=target_dir)
    )


def plant_as(uid: int, mark: str, target: str, target_dir: str) -> None:
    """Plant every kind of leftover from a process the host starts under ``uid`` (as one
    that escaped an execution would); raise unless each kind was planted."""
    script = planting_program(mark, target, target_dir).replace(
        "json.dumps(done)", "print(json.dumps(done))"
    )
    planted = subprocess.run(
        [
            *("setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"),
            *("/usr/bin/python3", "-I", "-c", script),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        timeout=60,
    )
    done = json.loads(planted.stdout)
    if not all(done.values()):
        raise AssertionError(f"not everything was planted: {planted.stdout}")


def finding_program(mark: str) -> str:
    """Looks for what :func:`planting_program` planted; returns (as JSON) what it found."""
    common = _COMMON.format(mark=mark, key=ipc_key(mark), dirs=PLANT_DIRECTORIES)
    return textwrap.dedent(common) + textwrap.dedent(_FIND.format())


def host_leftovers(mark: str, uid: int) -> list[str]:
    """What of the planted state the host can still see (must be empty after teardown):
    SysV objects owned or created by ``uid``, the planted paths, a queue named for ``mark``
    (through an mqueue filesystem mounted where only this check sees it), keys charged to
    ``uid``."""
    left: list[str] = []
    for kind in ("shm", "msg", "sem"):
        with open(f"/proc/sysvipc/{kind}") as fh:
            header, *rows = fh.read().splitlines()
        columns = {name: index for index, name in enumerate(header.split())}
        for row in rows:
            fields = row.split()
            if uid in (int(fields[columns["uid"]]), int(fields[columns["cuid"]])):
                left.append(f"sysv {kind} {fields[1]}")
    for directory in PLANT_DIRECTORIES:
        left += [f"{directory}/{name}" for name in os.listdir(directory) if mark in name]
    if mark in message_queues():
        left.append("mqueue")
    if uid_has_keys(uid):
        left.append("keys")
    return left


def message_queues() -> str:
    """The host's POSIX message queues, listed through an mqueue filesystem that the
    unshare(1) tool mounts in a mount namespace of its own (gone when it exits)."""
    listed = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t mqueue none /mnt && ls -a /mnt",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return listed.stdout


def uid_has_keys(uid: int) -> bool:
    with open("/proc/key-users") as fh:
        return any(line.split(":")[0].strip() == str(uid) for line in fh)


@contextmanager
def host_targets(mark: str) -> Iterator[tuple[str, str]]:
    """A root-owned file and directory outside every shared directory, for the planted
    symlinks to point at: both must survive the sweep."""
    base = f"/run/{mark}-targets"
    os.makedirs(f"{base}/dir", mode=0o755)
    with open(f"{base}/file", "w") as fh:
        fh.write("host data\n")
    with open(f"{base}/dir/inside", "w") as fh:
        fh.write("host data\n")
    try:
        yield f"{base}/file", f"{base}/dir"
    finally:
        remove_tree(base)


@contextmanager
def process_under(uid: int) -> Iterator[subprocess.Popen[bytes]]:
    """A process the host starts under ``uid``, as one that escaped an execution would run;
    yielded once it really runs as the uid. Killed and reaped on the way out."""
    process = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "/usr/bin/python3",
            "-I",
            "-c",
            "import sys; sys.stdout.write('up'); sys.stdout.flush(); import time; time.sleep(600)",
        ],
        cwd="/",
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        # It writes only once exec'd as the uid: no polling for the switch.
        assert process.stdout.read(2) == b"up", "the process under the uid did not start"
        yield process
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


@contextmanager
def own_uid(uid: int) -> Iterator[dict[str, int]]:
    """Backend options that lease ``uid`` alone to every execution (a one-uid range); on the
    way out whatever a failed test left under it is swept and the range's cursor removed."""
    from psych_sandbox_core.kit.posix.identity import IdentityRange

    try:
        yield {"identity_first_uid": uid, "identity_count": 1}
    finally:
        sweep(uid, uid)
        IdentityRange(uid, 1).forget()
