"""The bwrap backend: each execution in fresh Linux namespaces made by bubblewrap.

User, pid, ipc, uts, mount, network (and cgroup where the kernel has it) namespaces are
unshared; nothing of the host is mounted except the system directories the interpreter needs,
read-only; the workspace, /tmp and /dev/shm are size-capped tmpfs mounts that vanish with the
mount namespace. The program runs as an unprivileged uid with no capabilities and no new
privileges. When the host runs as root, bwrap itself is started as an unprivileged host uid:
a user namespace made by root maps the sandbox onto host root, which owns (and may write)
the kernel's settings under /proc/sys even without capabilities. That host uid is leased per
execution (psych_sandbox_core.kit.posix.identity): the host uid that made a user namespace
holds every capability in it, so a host process sharing it could enter a running sandbox through
/proc/<pid>/root, and every sandbox under one uid would share that uid's process count.

bwrap's monitor learns the exit status of its pid-namespace init through an eventfd and
exits without reaping it, so the kernel's accounting of the tree never reaches the host's
wait4. Where the host can create cgroups (root, cgroup v1 or v2 with the needed controllers),
each execution runs in a cgroup of its own (psych_sandbox_core.kit.posix.cgroups): usage is read
from it and memory and process count are capped by it. Elsewhere usage is not measured (see
README.md).
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import replace
from functools import lru_cache
from typing import Annotated

import anyio
from psych_sandbox_core.kit import (
    BackendRegistrar,
    BackendUnavailable,
    ConfigurationError,
    ErrorKind,
    ExitStatus,
    InheritedSocketChannel,
    InterpreterOptions,
    Launched,
    LaunchRequest,
    Level,
    Mechanisms,
    ProcessLaunched,
    bootstrap_argv,
    child_environment,
    hookimpl,
    spawn,
    wait_started,
)
from psych_sandbox_core.kit.posix import (
    SYSTEM_CANDIDATES,
    ExecutionCgroup,
    ExecutionIdentity,
    LateTerms,
    LeasedIdentityBackend,
    LeasedIdentityOptions,
    ManagedProcess,
    execution_cgroup,
    interpreter_prefixes,
)
from pydantic import Field

MiB = 1024 * 1024
#: The unprivileged identity inside the sandbox (nobody/nogroup on Debian).
NOBODY = 65534
#: Where the program runs inside the sandbox, and the temporary directory it is given.
WORKSPACE = "/workspace"
TMP = "/tmp"
#: How long bwrap may take to set the sandbox up before the bootstrap speaks. Generous: a
#: loaded host may be slow to start an interpreter, and nothing waits on it but this run.
STARTUP_SECONDS = 30.0
#: How much of bwrap's stderr a startup failure quotes.
STARTUP_STDERR_BYTES = 4096
#: After the tree is killed, how long to wait for the pid namespace to empty.
NAMESPACE_EXIT_SECONDS = 5.0
#: Host directories that must never be bound into the sandbox, nor any directory above them.
FORBIDDEN = (
    "/root",
    "/home",
    "/tmp",
    "/var/tmp",
    "/run",
    "/var/run",
    "/var",
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/boot",
)
#: Merged-/usr symlinks (or, on older layouts, directories) the dynamic loader needs.
HOST_CONFIG_UNDER_USR = "/usr/local/etc"
SYSTEM_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: What the sandbox mounts of its own, over anything bound there.
SANDBOX_MOUNTS = (WORKSPACE, TMP, "/proc", "/dev", HOST_CONFIG_UNDER_USR)
PR_SET_PDEATHSIG = 1
#: The execution's memory cgroup holds more than the program's address-space budget: the
#: workspace, /tmp and /dev/shm tmpfs pages the tree writes are charged to it (so their caps
#: are added), and so are bwrap's monitor and init (about 1-2 MiB each) and the tree's kernel
#: memory (page tables, socket buffers). This headroom covers the last two.
MEMORY_CGROUP_HEADROOM = 32 * MiB
#: The pids cgroup counts every task in the tree: bwrap's monitor and the namespace's init
#: run beside the program, which itself counts against the process limit.
PIDS_CGROUP_HEADROOM = 4
#: Without a process limit in the profile, the cgroup still bounds a fork bomb.
DEFAULT_PIDS = 256

Uid = Annotated[int, Field(ge=1, le=2**32 - 2)]
Size = Annotated[int, Field(ge=64 * 1024)]


class BwrapOptions(LeasedIdentityOptions, InterpreterOptions):
    # interpreter: a path or a name on PATH; None prefers the system's own python3 under
    # /usr, falling back to the host's interpreter with its prefix bound. Or environment: a
    # virtual environment or prefix, bound read-only whole, with its base interpreter's.
    #: The bubblewrap executable: a path or a name on PATH.
    bwrap: str = "bwrap"
    #: The program's uid and gid inside the sandbox.
    sandbox_uid: Uid = NOBODY
    sandbox_gid: Uid = NOBODY
    #: When the host runs as root, bwrap runs as an unprivileged host uid/gid of its own,
    #: leased per execution from the identity range (identity_first_uid, identity_count; the
    #: sandbox's uid maps onto it), so no two executions, nor any other host process, share it.
    #: Setting host_uid/host_gid instead runs every execution's bwrap as that one identity:
    #: weaker (whatever else runs as it holds every capability in the running sandboxes and
    #: shares their process count), only for hosts that cannot spare a range.
    host_uid: Uid | None = None
    host_gid: Uid | None = None
    #: Size caps of the memory-backed filesystems: a file-size limit alone does not stop a
    #: program from filling RAM through many files.
    workspace_bytes: Size = 128 * MiB
    tmp_bytes: Size = 64 * MiB
    shm_bytes: Size = 16 * MiB
    #: More host directories to bind read-only, at the same path (absolute; never the
    #: host's home, /root, /tmp, /var, /etc or the like).
    extra_ro_binds: list[str] = Field(default_factory=list)


class BwrapBackend(
    LeasedIdentityBackend[BwrapOptions],
    id="bwrap",
    claims=Level.ISOLATED,
    # Commands run in the same child as programs (command mode).
    runs_commands=True,
    shared_identity=("host_uid", "host_gid"),
):
    # A root host drops bwrap to a leased identity, or to the one configured; elsewhere bwrap
    # runs as the host's own uid.

    def __init__(self, options: BwrapOptions) -> None:
        super().__init__(options)
        if not self.drops_identity:
            # Only root starts bwrap as another uid: a configured one cannot apply here.
            self.fixed_identity = None
        self.bwrap = shutil.which(options.bwrap) if sys.platform.startswith("linux") else None
        interpreter = options.child_interpreter(
            reachable_by_any_uid=self.is_root,
            runner="the unprivileged host uid that runs bubblewrap",
            # The system's own interpreter first: /usr is bound anyway, so no bind.
            candidates=[*SYSTEM_CANDIDATES, os.path.realpath(sys.executable)],
            bound_read_only=True,
        )
        self.interpreter = interpreter.executable
        binds: list[str] = []
        if interpreter.environment is not None:
            # The environment as-is, at its own path (its pyvenv.cfg and scripts name it).
            binds.append(checked_bind(interpreter.environment, "environment"))
        # The interpreter the executable leads to.
        binds.extend(interpreter_binds(interpreter.base))
        for extra in options.extra_ro_binds:
            binds.append(checked_bind(extra, "extra_ro_binds"))
        self.binds = tuple(dict.fromkeys(binds))

    def unavailable_reason(self) -> str | None:
        if not sys.platform.startswith("linux"):
            return "bubblewrap needs Linux namespaces"
        if self.bwrap is None:
            return (
                f"bubblewrap ({self.options.bwrap!r}) is not on PATH; install it "
                "(e.g. apt-get install bubblewrap)"
            )
        return None

    def mechanisms(self, cgroup: ExecutionCgroup | None = None) -> Mechanisms:
        return Mechanisms.boundary(
            # Only caps that were actually written to the execution's cgroup.
            memory_cgroup=cgroup is not None and cgroup.memory_limited,
            pids_cgroup=cgroup is not None and cgroup.pids_limited,
        )

    def memory_cgroup_bytes(self, request: LaunchRequest) -> int | None:
        """The tree's memory cap: the program's budget plus what else is charged to it."""
        memory = request.limits.memory_bytes
        if memory is None:
            return None
        s = self.options
        return memory + s.workspace_bytes + s.tmp_bytes + s.shm_bytes + MEMORY_CGROUP_HEADROOM

    async def execution_cgroup(self, request: LaunchRequest) -> ExecutionCgroup | None:
        """A fresh cgroup, capped and ready to be joined, or None where there can be none."""
        processes = request.limits.processes
        pids = (processes if processes is not None else DEFAULT_PIDS) + PIDS_CGROUP_HEADROOM
        return await execution_cgroup(
            self.id, memory_bytes=self.memory_cgroup_bytes(request), pids=pids
        )

    def command(
        self,
        request: LaunchRequest,
        channel_spec: str,
        info_fd: int,
        passed_fds: list[int] | None = None,
        late: LateTerms | None = None,
    ) -> list[str]:
        """The bwrap command line for one execution (``passed_fds``, ``late``: as
        bootstrap_argv's)."""
        argv = self._sandbox_argv(request.environment)
        argv += [
            "--info-fd",
            str(info_fd),
            "--",
        ]
        # The same binary runs inside, bound read-only: precompiling for it is valid.
        return argv + bootstrap_argv(
            self.interpreter, request, channel_spec, passed_fds=passed_fds, late=late
        )

    def bare_command(self) -> list[str]:
        """bubblewrap with this backend's namespaces, mounts and environment running the
        interpreter's start-up (``-I -c pass``), as the host's own uid, without the host's
        identity lease, cgroup, probes or protocol: what bubblewrap and the interpreter alone
        cost, the floor a cold execution is compared with in benchmarks."""
        return [*self._sandbox_argv({}), "--", self.interpreter, "-I", "-c", "pass"]

    def _sandbox_argv(self, environment: Mapping[str, str]) -> list[str]:
        """bwrap and its options for one sandbox, up to the command it runs."""
        assert self.bwrap is not None
        s = self.options
        argv = [
            self.bwrap,
            "--unshare-all",
            # --unshare-all only tries the user namespace; without one the uid below could
            # not be honoured, so it is required.
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--uid",
            str(s.sandbox_uid),
            "--gid",
            str(s.sandbox_gid),
            "--hostname",
            "sandbox",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for name in SYSTEM_TOP_LEVEL:
            path = "/" + name
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                argv += ["--ro-bind", path, path]
        for path in self.binds:
            argv += ["--ro-bind", path, path]
        if os.path.isdir(HOST_CONFIG_UNDER_USR):
            # /usr is bound whole for the interpreter, but /usr/local/etc holds this host's
            # own configuration (package-manager settings, tokens): hidden under an empty,
            # read-only tmpfs.
            argv += [
                "--perms",
                "0555",
                "--size",
                "4096",
                "--tmpfs",
                HOST_CONFIG_UNDER_USR,
                "--remount-ro",
                HOST_CONFIG_UNDER_USR,
            ]
        argv += [
            "--proc",
            "/proc",
            # Nothing under /proc/sys is the sandbox's to change, even what its own
            # namespaces would allow.
            "--ro-bind",
            "/proc/sys",
            "/proc/sys",
            "--dev",
            "/dev",
            "--perms",
            "0700",
            "--size",
            str(s.workspace_bytes),
            "--tmpfs",
            WORKSPACE,
            "--perms",
            "0700",
            "--size",
            str(s.tmp_bytes),
            "--tmpfs",
            TMP,
            "--perms",
            "0700",
            "--size",
            str(s.shm_bytes),
            "--tmpfs",
            "/dev/shm",
            # The root and /dev are bwrap's own tmpfs mounts, owned by the sandbox's uid and
            # without a size cap: once every mount point exists, nothing more is written there.
            "--remount-ro",
            "/dev",
            "--remount-ro",
            "/",
            "--chdir",
            WORKSPACE,
            "--clearenv",
        ]
        for key, value in {**child_environment(TMP), **environment}.items():
            argv += ["--setenv", key, value]
        return argv

    @asynccontextmanager
    async def launch_as(
        self, request: LaunchRequest, identity: ExecutionIdentity
    ) -> AsyncIterator[Launched]:
        if self.bwrap is None:
            raise BackendUnavailable(self.unavailable_reason() or "bubblewrap is missing")
        # No workspace of the host's: bwrap mounts the child's own. The probe's targets are
        # made once bubblewrap is spawned, while it sets up the sandbox and the interpreter
        # starts, and handed to the bootstrap then (late terms).
        async with spawn(workspace=False) as child:
            info_read, info_write = os.pipe()
            child.callback(os.close, info_read)
            # bwrap's end, given at spawn and closed by the host once spawned.
            child.passed_fds.append(info_write)
            # The cgroup is joined before bwrap runs: it must hold bubblewrap's own processes
            # too. Removed after the tree is gone (stragglers are killed first), the kernel's
            # proof that the tree is gone spares the lease's sweep its scan of the host's
            # processes; everything else it sweeps either way.
            cgroup = await self.execution_cgroup(request)
            child.adopt_cgroup(cgroup, identity.proven_empty)
            os.set_blocking(info_read, False)
            argv = self.command(
                request, child.channel.child_spec, info_write, child.passed_fds, child.late
            )
            prefix = _spawn_prefix(identity.ids, cgroup)
            process = await child.start(
                [*prefix, *argv] if prefix is not None else argv,
                env={},
                cwd="/",
                failure="could not start bubblewrap",
                preexec_fn=_prepare(identity.ids, cgroup) if prefix is None else None,
            )
            child.deliver(request.probe)
            launched = _Launched(
                process,
                child.channel,
                self.mechanisms(cgroup),
                cgroup,
                self.memory_cgroup_bytes(request),
            )
            # The namespace killed and seen empty before the process is reaped.
            child.push_async_callback(launched.finish)
            await launched.started(info_read)
            yield launched


class _Launched(ProcessLaunched[InheritedSocketChannel]):
    def __init__(
        self,
        process: ManagedProcess,
        channel: InheritedSocketChannel,
        mechanisms: Mechanisms,
        cgroup: ExecutionCgroup | None = None,
        memory_cap: int | None = None,
    ) -> None:
        super().__init__(process, channel, mechanisms, cgroup)
        self.memory_cap = memory_cap
        # A warm result may be handed back before teardown: the pipes carry exactly what
        # the child wrote, the pid namespace ends every process whatever the program did
        # (its grade does not wait on the teardown), and the cgroup measures usage so far.
        # Without a cgroup, usage is only known once the tree is reaped.
        self.early_result_ok = cgroup is not None
        #: A pidfd on the pid namespace's init, once bwrap has said which host pid it is;
        #: used and closed under the lock (the wall clock's thread may signal it).
        self._init_fd: int | None = None
        self._init_lock = threading.Lock()
        self._status: ExitStatus | None = None

    async def started(self, info_read: int) -> None:
        """Return once the bootstrap has spoken; raise BackendUnavailable, quoting bwrap,
        if bwrap exits first."""

        async def spoke() -> None:
            info = await self._read_info(info_read)
            child = info.get("child-pid")
            if isinstance(child, int) and child > 1:
                with suppress(OSError):
                    self._init_fd = os.pidfd_open(child)
            await self.channel.wait_spoken()

        await wait_started(
            self,
            spoke,
            self.channel.spoken,
            seconds=STARTUP_SECONDS,
            stderr_bytes=STARTUP_STDERR_BYTES,
            failure=lambda status, said: (
                f"bubblewrap could not start the sandbox ({status.describe()}): {said}"
            ),
        )

    async def _read_info(self, fd: int) -> dict[str, object]:
        # bwrap writes one JSON object and closes its end; a failure before that is EOF.
        data = b""
        while len(data) < 65536:
            await anyio.wait_readable(fd)
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                continue
            if not chunk:
                break
            data += chunk
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}

    async def terminate(self, grace_seconds: float) -> None:
        # The program gets no polite signal: the pid namespace's init ignores SIGTERM, and
        # nothing in an untrusted tree is worth a grace window. Kill it whole at once.
        self._kill_namespace()
        await self.process.terminate(grace_seconds)

    async def finish(self) -> ExitStatus:
        if self._status is not None:
            return self._status
        self._kill_namespace()
        raw = await self.process.kill_and_reap()
        ended: bool | None = None
        if self._init_fd is not None:
            # bwrap's monitor exits without reaping the init; wait until the kernel has
            # emptied the namespace so no process outlives the run, even for a moment (the
            # init exits only once every other process in it has).
            ended = _exited(self._init_fd)
            if not ended:
                with anyio.CancelScope(shield=True), anyio.move_on_after(NAMESPACE_EXIT_SECONDS):
                    await anyio.wait_readable(self._init_fd)
                    ended = True
            with self._init_lock:
                os.close(self._init_fd)
                self._init_fd = None
        status = _as_inner_status(raw)
        if self.cgroup is not None:
            status = await self._measured(status)
        self._status = replace(status, tree_ended=ended)
        return self._status

    async def _measured(self, status: ExitStatus) -> ExitStatus:
        """``status`` with the cgroup's usage and, after an OOM kill, a memory_limit hint."""
        assert self.cgroup is not None
        cpu, peak = await self.cgroup.final_usage()
        hint: tuple[ErrorKind, str] | None = None
        if self.cgroup.memory_limited and self.cgroup.oom_killed():
            cap = f" of {self.memory_cap // MiB} MiB" if self.memory_cap is not None else ""
            hint = (
                ErrorKind.MEMORY_LIMIT,
                f"the program's process tree reached the sandbox's memory cap{cap} "
                "(its memory cgroup) and the kernel's out-of-memory killer ended it",
            )
        return ExitStatus(
            code=status.code,
            signal=status.signal,
            cpu_seconds=cpu,
            peak_memory_bytes=peak,
            failure_hint=hint,
        )

    def terminate_from_thread(self) -> None:
        # What terminate does first, from the wall clock's thread: the whole tree killed.
        self._kill_namespace()
        self.process.ask_to_end()

    def _kill_namespace(self) -> None:
        with self._init_lock:
            if self._init_fd is not None:
                with suppress(OSError):
                    signal.pidfd_send_signal(self._init_fd, signal.SIGKILL)


def _exited(pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` has exited (readable), without waiting."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _as_inner_status(status: ExitStatus) -> ExitStatus:
    """The program's fate from bwrap's: bwrap exits 128+N when its child died of signal N."""
    code, sig = status.code, status.signal
    if code is not None and 128 < code < 128 + 65:
        sig, code = code - 128, None
    # Not measured here: bwrap's monitor never reaps the tree, so wait4 saw only bwrap
    # itself. The execution's cgroup, where there is one, measures it instead.
    return ExitStatus(code=code, signal=sig, cpu_seconds=None, peak_memory_bytes=None)


#: Moves itself into the cgroups whose ``tasks``/``cgroup.procs`` files precede ``--`` (as
#: root: the caller's), then execs the rest.
_JOIN = 'while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; exec "$@"'


def _spawn_prefix(
    runner: tuple[int, int] | None, cgroup: ExecutionCgroup | None
) -> list[str] | None:
    """The commands bwrap is started through so the host's fork runs no Python: join the
    execution's cgroup (before bwrap can fork, and while still root), drop root, then die with
    the host. A Python pre-exec step costs the host a full fork and its at-fork work, about 5 to
    13 ms per execution on the event loop's thread, measured; these cost it a vfork. None
    where setpriv (util-linux) with --pdeathsig is missing: then the pre-exec step does it."""
    setpriv = _setpriv()
    if setpriv is None:
        return None
    joins = [] if cgroup is None else [str(path) for path in cgroup.join_files()]
    prefix = ["/bin/sh", "-c", _JOIN, "join", *joins, "--"] if joins else []
    prefix.append(setpriv)
    if runner is not None:
        uid, gid = runner
        prefix += [f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    # After the uid change, which clears it (setpriv sets it last).
    return [*prefix, "--pdeathsig=SIGKILL", "--"]


@lru_cache(maxsize=1)
def _setpriv() -> str | None:
    found = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if found is None or not os.path.exists("/bin/sh"):
        return None
    try:
        usage = subprocess.run(
            [found, "--help"], capture_output=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return found if b"--pdeathsig" in usage else None


def _prepare(runner: tuple[int, int] | None, cgroup: ExecutionCgroup | None) -> Callable[[], None]:
    """Work done in the forked child before exec where setpriv is missing: join the
    execution's cgroup (before bwrap can fork, and while still root), drop root, then die with
    the host."""
    libc = _libc()

    def prepare() -> None:
        if cgroup is not None:
            cgroup.join_current_process()
        if runner is not None:
            uid, gid = runner
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        # After the uid change, which clears it.
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return prepare


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


# ---------------------------------------------------------------- interpreter and binds


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


@lru_cache(maxsize=8)
def interpreter_binds(interpreter: str) -> tuple[str, ...]:
    """Host directories to bind read-only so ``interpreter`` runs inside: none for one under
    /usr, else its installation prefix (e.g. a pyenv version), never anything wider."""
    if _under(interpreter, "/usr"):
        return ()
    prefixes = [
        checked_bind(prefix, "interpreter prefix")
        for prefix in interpreter_prefixes(interpreter)
        if not _under(prefix, "/usr")
    ]
    directory = os.path.dirname(interpreter)
    if not any(_under(directory, p) for p in prefixes) and not _under(directory, "/usr"):
        prefixes.append(checked_bind(directory, "interpreter directory"))
    return tuple(dict.fromkeys(prefixes))


def checked_bind(path: str, what: str) -> str:
    """``path`` made real, if binding it read-only exposes nothing it must not."""
    if not os.path.isabs(path):
        raise ConfigurationError(f"{what}: {path!r} is not an absolute path")
    real = os.path.realpath(path)
    if not os.path.isdir(real) and not os.path.isfile(real):
        raise ConfigurationError(f"{what}: {path!r} does not exist")
    home = os.path.realpath(os.path.expanduser("~"))
    cwd = os.path.realpath(os.getcwd())
    # The path itself, or any directory above it, being one of these would expose it.
    exposed = [d for d in (*FORBIDDEN, home, cwd) if d != "/" and _under(d, real)]
    if real == "/" or exposed:
        raise ConfigurationError(
            f"{what}: binding {real} would expose {', '.join(exposed) or 'the whole host'} "
            "to the sandbox; bind a narrower directory"
        )
    shadowed = [d for d in SANDBOX_MOUNTS if _under(real, d)]
    if shadowed:
        raise ConfigurationError(
            f"{what}: {real} is under {shadowed[0]}, which the sandbox mounts afresh, so it "
            "would not be there; place it elsewhere (e.g. under /opt)"
        )
    return real


@hookimpl
def psych_sandbox_register_backends(registry: BackendRegistrar) -> None:
    registry.add(BwrapBackend)
