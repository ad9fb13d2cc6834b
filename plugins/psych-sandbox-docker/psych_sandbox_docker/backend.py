"""The docker backend: each execution in a fresh container, with runc or gVisor's runsc.

The container has no network, no capabilities, no new privileges, a read-only root with
size-capped tmpfs mounts for the workspace and /tmp, a non-root identity, and memory and
process-count limits. On a root host that identity is a uid/gid leased for the execution
(psych_sandbox_core.kit.posix.identity): runc maps no user namespace, so the container's uid is
a host uid, and containers sharing one would share its process count and, for any host program
under it, their /proc/<pid>/root. The only host path inside is a per-execution directory holding the
control Unix socket. ``--init`` makes the engine's tiny init PID 1, so the program runs below
it, where the CPU limit's signal still kills it. The container is removed at teardown
whatever happened; its labels let a restarted host reap containers a crashed one left.

Usage is read from a per-execution cgroup parent (cgroup v1, cgroupfs driver, host root):
it outlives the container, so CPU time and peak memory are read after the container ended.
The parent is made in every mounted hierarchy before the container starts and removed from
all of them after it is gone. Elsewhere usage is reported as not measured.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Annotated, Literal

import anyio
from anyio.abc import ByteReceiveStream
from psych_sandbox_core.kit import (
    BackendRegistrar,
    BackendUnavailable,
    ConfigurationError,
    ErrorKind,
    ExitStatus,
    Launched,
    LaunchRequest,
    Level,
    Mechanisms,
    MemoryNow,
    UsageSoFar,
    bootstrap_argv,
    child_environment,
    hookimpl,
    wait_started,
)
from psych_sandbox_core.kit.posix import (
    EXECUTION_CPU_SHARES,
    ExecutionIdentity,
    LeasedIdentityBackend,
    LeasedIdentityOptions,
    UnixSocketChannel,
    make_owned_directory,
    mark,
    remove_tree,
)
from pydantic import Field, field_validator

from . import api
from . import engine as eng
from .container_init import ContainerInit
from .image import DEFAULT_TAG

MiB = 1024 * 1024
#: The unprivileged identity a host that cannot lease one runs containers as (nobody/nogroup
#: in the built image).
NOBODY = 65534
WORKSPACE = "/workspace"
TMP = "/tmp"
#: Where the per-execution socket directory appears inside the container.
CHILD_RUN_DIR = "/run/psych"
INTERPRETER = "/usr/bin/python3.11"
#: How long a container may take to start and its bootstrap to connect. Cold gVisor start
#: on a loaded host is the slowest case seen (about a second); the margin is for load.
STARTUP_SECONDS = 30.0
#: How long teardown waits for the engine to report the exit of a container it killed, or
#: for the container's init to exit once the host killed it itself.
EXIT_REPORT_SECONDS = 10.0
#: Deadline of the inspection that names the container's init (made while the bootstrap
#: starts, so on a quiet host nobody waits for it); past it the container is killed through
#: the engine instead.
INIT_LOOKUP_SECONDS = 5.0
#: Deadlines of the kill and removal requests (the engine unmounts and deletes the
#: container's layer during removal; under load that can take seconds).
KILL_SECONDS = 10.0
REMOVE_SECONDS = 30.0
#: Output one stream's reader may leave unread while the other's reader reads on (the
#: engine's frames are at most 32 KiB; the core reads both streams all the time).
PENDING_OUTPUT_BYTES = 1024 * 1024
#: The wait endpoint's answer is one small JSON object.
WAIT_BODY_BYTES = 64 * 1024
#: How much of the engine's stderr a start-up failure quotes.
STARTUP_STDERR_BYTES = 4096
#: runc: the pids cgroup is the process limit; the engine's init and the bootstrap itself
#: count against it, so they get room of their own.
RUNC_PIDS_HEADROOM = 4
#: runsc: the pids cgroup counts gVisor's own host tasks (about 43 for one idle process and
#: 6-7 per guest process), and reaching it crashes the whole sandbox. The guest's process
#: count is limited by RLIMIT_NPROC, which gVisor enforces per sandbox; the cgroup is only a
#: backstop sized well above what that many guest processes need.
RUNSC_PIDS_BASE = 128
RUNSC_PIDS_PER_PROCESS = 8
#: Without a process limit in the profile, the cgroup still bounds a fork bomb.
DEFAULT_PROCESSES = 256
#: gVisor's Sentry lives in the container's memory cgroup; the program's budget is on top.
RUNSC_MEMORY_OVERHEAD = 96 * MiB
#: The status runsc exits with when its sandbox crashed (verified here).
RUNSC_CRASHED = 2

Size = Annotated[int, Field(ge=1 * MiB)]
_IMAGE_REF = re.compile(r"^[a-z0-9][a-z0-9._/:@-]{0,254}$")
#: A container id as the engine's create answer gives it (64 hex digits).
_CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")


class DockerOptions(LeasedIdentityOptions):
    #: The image: a local tag, or ``name@sha256:...`` to pin it. Never pulled.
    image: str = DEFAULT_TAG
    #: The engine CLI; None picks Docker where it answers, else Podman.
    engine: Literal["docker", "podman"] | None = None
    #: The OCI runtime, by the name the engine knows it under.
    runtime: Literal["runc", "runsc"] = "runc"
    #: CPU share (number of cores); the CPU-time limit comes from the profile's limits.
    cpus: Annotated[float, Field(gt=0, le=1024)] | None = 1.0
    #: Size caps of the memory-backed filesystems.
    workspace_bytes: Size = 128 * MiB
    tmp_bytes: Size = 64 * MiB
    shm_bytes: Size = 16 * MiB
    #: On a root host each container runs as a uid/gid of its own, leased per execution from
    #: the identity range (identity_first_uid, identity_count: a range no account uses).
    #: Setting container_uid/container_gid instead runs every container as that one
    #: identity: weaker (see the README), only for hosts that cannot spare a range.
    container_uid: Annotated[int, Field(ge=1, le=2**32 - 2)] | None = None
    container_gid: Annotated[int, Field(ge=1, le=2**32 - 2)] | None = None

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str) -> str:
        if not _IMAGE_REF.match(value):
            raise ValueError(
                f"{value!r} is not an image reference (lower-case name[:tag] or name@sha256:...)"
            )
        return value


class GvisorOptions(DockerOptions):
    runtime: Literal["runc", "runsc"] = "runsc"

    @field_validator("runtime")
    @classmethod
    def _only_runsc(cls, value: str) -> str:
        if value != "runsc":
            raise ValueError("the gvisor backend always runs runsc; use the docker backend")
        return value


class DockerBackend(
    LeasedIdentityBackend[DockerOptions],
    id="docker",
    claims=Level.ISOLATED,
    # Commands run in the same child as programs (command mode).
    runs_commands=True,
    shared_identity=("container_uid", "container_gid"),
):
    # Only a root host can lease (the lock directory is root's) and give the control socket
    # to the container's uid; a rootless one runs every container as nobody, or as the
    # identity configured.

    def __init__(self, options: DockerOptions) -> None:
        if sys.platform == "win32":
            # The channel is a Unix socket bind-mounted into a Linux container; a Windows
            # host cannot offer that, and nothing weaker is substituted.
            raise ConfigurationError(
                f"the {self.id} backend does not run on a Windows host; run the host on Linux"
            )
        super().__init__(options)
        detected = eng.detect_engine(options.engine)
        self.engine: str = detected[0] if detected else (options.engine or "docker")
        self.cli: str | None = detected[1] if detected else None
        #: The engine's API socket: every container of an execution is driven through it
        #: (the CLI is only used off the hot path: availability, reaping, image builds).
        self.socket_path = api.engine_socket(self.engine)
        self.client = api.EngineClient(self.socket_path) if self.socket_path is not None else None
        #: The host's copy of the interpreter the image is built from: the physical floor a
        #: benchmark compares against.
        self.interpreter = INTERPRETER if os.path.exists(INTERPRETER) else sys.executable
        #: Containers this host could not remove (the engine was away at their teardown):
        #: removed before the next launch, since their owner lives on and the reaper spares
        #: a live owner's containers.
        self.unremoved: set[str] = set()
        if self.cli is not None:
            _reap_once(self.cli, self.engine)

    # ------------------------------------------------------------------ availability

    def _engine(self, *args: str) -> subprocess.CompletedProcess[str]:
        assert self.cli is not None
        return subprocess.run(
            [self.cli, *args],
            env=eng.engine_environment(),
            capture_output=True,
            text=True,
            timeout=eng.ENGINE_COMMAND_SECONDS,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    def unavailable_reason(self) -> str | None:
        if not sys.platform.startswith("linux"):
            return "the control socket is bind-mounted into the container: needs a Linux host"
        if self.cli is None:
            return (
                f"no container engine CLI ({self.options.engine or 'docker or podman'}) on PATH; "
                "install one (e.g. apt-get install docker.io) and start the engine"
            )
        if self.socket_path is None:
            return (
                f"no Unix socket of the {self.engine} engine's API here (DOCKER_HOST must be "
                "unix://... if set); start the engine or point DOCKER_HOST at its socket"
            )
        try:
            inspected = self._engine("image", "inspect", "--format", "{{.Id}}", self.options.image)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"the {self.engine} engine did not answer: {exc}"
        if inspected.returncode != 0:
            err = inspected.stderr.strip()
            if "no such image" in err.lower() or "image not known" in err.lower():
                return image_missing(self.options.image, self.engine)
            return f"the {self.engine} engine did not answer: {err or 'no reason given'}"
        if self.options.runtime == "runsc" and self.engine == "docker":
            info = self._engine("info", "--format", "{{json .Runtimes}}")
            try:
                runtimes = json.loads(info.stdout or "{}") or {}
            except ValueError:
                runtimes = {}
            if "runsc" not in runtimes:
                return (
                    "the docker engine has no 'runsc' runtime registered; install gVisor and "
                    "register it in /etc/docker/daemon.json (see the plugin's ci/install-engine.sh)"
                )
        return None

    def container_memory(self, memory_bytes: int | None) -> int | None:
        """The container's memory cap for a program's ``memory_bytes`` (gVisor's own sentry
        and gofer are charged to it too), or None for none."""
        if memory_bytes is None:
            return None
        return memory_bytes + (RUNSC_MEMORY_OVERHEAD if self.options.runtime == "runsc" else 0)

    def bare_command(self) -> list[str]:
        """A bare ``run`` of the interpreter's start-up (``-I -c pass``) in the same image and
        runtime, without any of the backend's hardening or protocol: what the engine and the
        interpreter alone cost, the floor a cold execution is compared with in benchmarks."""
        assert self.cli is not None
        return [
            self.cli,
            "run",
            "--rm",
            "--pull",
            "never",
            "--network",
            "none",
            "--runtime",
            self.options.runtime,
            self.options.image,
            INTERPRETER,
            "-I",
            "-c",
            "pass",
        ]

    # ------------------------------------------------------------------ mechanisms and container

    def mechanisms(self, limits_memory: bool) -> Mechanisms:
        return Mechanisms.boundary(
            memory_cgroup=limits_memory,
            # Under runsc the cgroup counts gVisor's host tasks, not the program's processes:
            # the guest's RLIMIT_NPROC is the limit there, graded as the rlimit it is.
            pids_cgroup=self.options.runtime == "runc",
        )

    def create_request(
        self,
        request: LaunchRequest,
        *,
        execution: str,
        socket_dir: Path,
        channel_spec: str,
        cgroup_parent: str | None,
        identity: tuple[int, int] = (NOBODY, NOBODY),
    ) -> dict[str, object]:
        """The engine API's container-create body for one execution (what ``docker run``'s
        hardening flags amount to); writes the bootstrap into ``socket_dir`` for it."""
        s = self.options
        limits = request.limits
        runsc = s.runtime == "runsc"
        uid, gid = identity
        host: dict[str, object] = {
            "NetworkMode": "none",
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges"],
            "ReadonlyRootfs": True,
            "Init": True,
            # Output goes through the attached stream only: nothing piles up in engine logs.
            "LogConfig": {"Type": "none", "Config": {}},
            "Tmpfs": {
                WORKSPACE: f"rw,nosuid,nodev,size={s.workspace_bytes},uid={uid},"
                f"gid={gid},mode=0700",
                TMP: f"rw,nosuid,nodev,noexec,size={s.tmp_bytes},mode=1777",
            },
            "ShmSize": s.shm_bytes,
            "Binds": [f"{socket_dir}:{CHILD_RUN_DIR}:ro"],
        }
        if runsc or self.engine == "docker":
            # Podman's default runtime is its own choice (often crun): name only gVisor there.
            host["Runtime"] = s.runtime
        memory = self.container_memory(limits.memory_bytes)
        if memory is not None:
            host["Memory"] = memory
            host["MemorySwap"] = memory
        # The weight every execution gets (cgroups.py): the host that supervises it, and the
        # machine's other work, come first on a busy machine (the engine maps it to cgroup v2).
        host["CpuShares"] = EXECUTION_CPU_SHARES
        if s.cpus is not None:
            host["NanoCpus"] = round(s.cpus * 1e9)
        processes = limits.processes or DEFAULT_PROCESSES
        if runsc:
            host["PidsLimit"] = RUNSC_PIDS_BASE + RUNSC_PIDS_PER_PROCESS * processes
            host["Ulimits"] = [{"Name": "nproc", "Soft": processes, "Hard": processes}]
        else:
            host["PidsLimit"] = processes + RUNC_PIDS_HEADROOM
        if cgroup_parent is not None:
            host["CgroupParent"] = cgroup_parent
        environment = {**child_environment(TMP), **request.environment}
        return {
            "Image": s.image,
            # The image's interpreter is not the host's to run: the bootstrap is written to
            # the read-only run directory, compiled here (run where the image's interpreter
            # has the host's bytecode magic) and as source (anywhere else).
            "Cmd": bootstrap_argv(
                INTERPRETER, request, channel_spec, directory=(str(socket_dir), CHILD_RUN_DIR)
            ),
            "Entrypoint": [],
            "User": f"{uid}:{gid}",
            "Hostname": "sandbox",
            "WorkingDir": WORKSPACE,
            "Env": [f"{key}={value}" for key, value in environment.items()],
            "Labels": {**eng.owner_label_map(), eng.EXECUTION_LABEL: execution},
            # No network sandbox from the engine (NetworkMode none already gives it no
            # interface): the runtime still gives the container a network namespace of its
            # own, holding only lo, and the engine's create and start cost about half
            # (NOTES.md). Checked from the host by test_containment.py.
            "NetworkDisabled": True,
            "AttachStdin": False,
            "AttachStdout": True,
            "AttachStderr": True,
            "OpenStdin": False,
            "Tty": False,
            "HostConfig": host,
        }

    # ------------------------------------------------------------------ launch

    @asynccontextmanager
    async def launch_as(
        self, request: LaunchRequest, leased: ExecutionIdentity
    ) -> AsyncIterator[Launched]:
        # After the container's removal nothing should run as its uid; whatever does is swept
        # with the lease, unless the removed cgroup parent proves there is none.
        client = self.client
        if client is None:
            raise BackendUnavailable(self.unavailable_reason() or "no container engine")
        await self._remove_unremoved(client)
        #: A rootless host runs every container as nobody.
        identity = leased.ids or (NOBODY, NOBODY)
        owner = eng.current_owner()
        execution = uuid.uuid4().hex
        name = f"psych-sandbox-{execution[:20]}"
        cgroup_name = f"{owner.token}-{execution[:12]}"
        measured = self.is_root and self.engine == "docker" and bool(eng.cgroup_controllers())
        cgroup_made = measured
        socket_dir = Path(make_owned_directory(eng.SOCKET_DIR_PREFIX))
        channel = _ContainerChannel(socket_dir, child_path=f"{CHILD_RUN_DIR}/control.sock")
        container: _Container | None = None
        try:
            # The directory stays the host's, and the container may only traverse it: a
            # program that could write there would be writing to the host's disk. Only the
            # socket is the container's (and root's) to connect to.
            os.chmod(socket_dir, 0o711)
            if measured:
                try:
                    eng.create_cgroup_parent(cgroup_name)
                except OSError:
                    # Without its parent the container's usage cannot be read: run unmeasured.
                    measured = False
            await channel.open(0o600 if self.is_root else 0o666)
            if self.is_root:
                os.chown(channel.path, *identity)
            body = self.create_request(
                request,
                execution=execution,
                socket_dir=socket_dir,
                channel_spec=channel.child_spec,
                cgroup_parent=f"/{eng.CGROUP_ROOT}/{cgroup_name}" if measured else None,
                identity=identity,
            )
            container = _Container(
                self,
                client,
                channel,
                name,
                mechanisms=self.mechanisms(request.limits.memory_bytes is not None),
                memory_bytes=request.limits.memory_bytes,
                cgroup_name=cgroup_name if measured else None,
            )
            await container.start(body)
            mark("spawned")
            await container.started()
            yield container
        finally:
            with anyio.CancelScope(shield=True):
                if container is not None:
                    # Whatever failed above, the container (if it was created) is gone.
                    try:
                        await container.finish()
                    finally:
                        await container.remove()
                    await container.close_streams()
                await channel.aclose()
                _remove_tree(socket_dir)
                if cgroup_made:
                    # After the container is gone: the runtime removes only the container's
                    # own cgroups, not the parent made above (in the unified hierarchy of a
                    # hybrid host it did not even use it). Its removal proves the container's
                    # tree gone where the container ran in it.
                    proof = eng.remove_cgroup_parent(cgroup_name)
                    if measured:
                        leased.proven_empty(proof)

    async def _remove_unremoved(self, client: api.EngineClient) -> None:
        for container in sorted(self.unremoved):
            try:
                await client.request(
                    "DELETE",
                    f"/containers/{api.path_segment(container)}",
                    query={"force": "1", "v": "1"},
                    timeout=REMOVE_SECONDS,
                )
            except api.EngineStatusError as exc:
                if exc.status != 404:
                    continue
            except api.EngineError:
                return  # still away: the next launch tries again
            self.unremoved.discard(container)

    async def engine_command(self, *args: str) -> tuple[int, str, str]:
        """Run one engine CLI command; (status, stdout, stderr). Never raises for failure.
        Only off the hot path (a fallback removal)."""
        assert self.cli is not None
        try:
            with anyio.fail_after(eng.ENGINE_COMMAND_SECONDS):
                done = await anyio.run_process(
                    [self.cli, *args],
                    env=eng.engine_environment(),
                    check=False,
                    stdin=subprocess.DEVNULL,
                )
        except (OSError, TimeoutError) as exc:
            return -1, "", str(exc)
        return (
            done.returncode,
            done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"),
        )


def image_missing(image: str, engine: str) -> str:
    build = "python -m psych_sandbox_docker.image"
    if engine != "docker":
        build += f" --engine {engine}"
    if image != DEFAULT_TAG:
        build += f" --tag {image}" if "@" not in image else ""
    return (
        f"the image {image!r} is not present in the {engine} engine, and images are never "
        f"pulled implicitly; build the local one with `{build}`, or pull/load {image!r} "
        "yourself"
    )


class _ContainerChannel(UnixSocketChannel):
    """The core's Unix socket channel, accepted early: the bootstrap's connection is the sign
    the container started, and is handed to the core when it asks."""

    def __init__(self, directory: Path, *, child_path: str) -> None:
        super().__init__(directory, child_path=child_path)
        self.early: socket.socket | None = None

    async def accept_early(self) -> None:
        self.early = await super().accept()

    async def accept(self) -> socket.socket:
        if self.early is not None:
            connection, self.early = self.early, None
            return connection
        return await super().accept()

    async def aclose(self) -> None:
        if self.early is not None:
            self.early.close()  # never handed over: nothing waits on it
            self.early = None
        await super().aclose()


class _Demux:
    """Splits the engine's multiplexed output into stdout and stderr, on demand: whichever
    reader needs bytes reads the next frame and keeps what belongs to the other. No task of
    its own, so nothing outlives the launch context; reads are safe to cancel.

    Once given the seals (container_init.py: one per output pipe, written after the
    container's end), each stream ends where one of them arrives: until then the last bytes
    that could be the start of one are held back, and the seal is not output."""

    def __init__(self) -> None:
        self.attached: api.OpenResponse | None = None
        self._pending = {api.STDOUT: bytearray(), api.STDERR: bytearray()}
        self._closed: set[int] = set()
        self._seals: list[bytes] = []
        #: Streams whose seal arrived: what is pending there is all that is left of them.
        self._sealed: set[int] = set()
        self._lock = anyio.Lock()
        self._changed = anyio.Event()
        self.ended = False
        #: Why the output ended early, if the engine broke the stream's format.
        self.error: str | None = None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def seal(self, tokens: list[bytes]) -> None:
        """End each stream where one of ``tokens`` (all of one length) arrives."""
        self._seals = tokens
        self._notify()

    def _available(self, kind: int) -> int:
        """How many pending bytes of stream ``kind`` may be handed over now."""
        pending = self._pending[kind]
        if not self._seals or kind in self._sealed or self.ended:
            return len(pending)
        found = [at for at in map(pending.find, self._seals) if at >= 0]
        if found:
            # Nothing of the container was left to write after it.
            del pending[min(found) :]
            self._sealed.add(kind)
            return len(pending)
        # A seal may have begun to arrive.
        return max(0, len(pending) - len(self._seals[0]) + 1)

    async def receive(self, kind: int, max_bytes: int) -> bytes:
        other = api.STDERR if kind == api.STDOUT else api.STDOUT
        while True:
            pending = self._pending[kind]
            available = min(self._available(kind), max_bytes)
            if available:
                data = bytes(pending[:available])
                del pending[:available]
                self._notify()
                return data
            if self.ended or self.attached is None or kind in self._sealed:
                raise anyio.EndOfStream
            if self._lock.locked() or len(self._pending[other]) >= PENDING_OUTPUT_BYTES:
                # Another reader is reading a frame, or the other stream's reader has not
                # caught up: wait for either to change rather than buffer without bound.
                await self._changed.wait()
                continue
            async with self._lock:
                try:
                    frame = await self.attached.read_frame()
                except api.EngineError as exc:
                    self.error = str(exc)
                    frame = None
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    frame = None
                if frame is None:
                    self.ended = True
                elif frame[0] not in self._closed and frame[0] not in self._sealed:
                    self._pending[frame[0]] += frame[1]
            self._notify()

    def close(self, kind: int) -> None:
        self._closed.add(kind)
        self._pending[kind].clear()
        self._notify()


class _OutputStream(ByteReceiveStream):
    """One of the container's two output streams."""

    def __init__(self, demux: _Demux, kind: int) -> None:
        self._demux = demux
        self._kind = kind

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._demux.receive(self._kind, max_bytes)

    async def aclose(self) -> None:
        self._demux.close(self._kind)


class _Container(Launched, UsageSoFar, MemoryNow):
    """One container, driven through the engine's API: created, attached, started, watched
    for its exit, then removed."""

    #: The attached streams carry exactly what the container wrote, in order, so the end
    #: markers say when the output is complete; the engine's exit report and removal
    #: (tens of milliseconds) then happen after a warm result was handed back.
    early_result_ok = True

    def __init__(
        self,
        backend: DockerBackend,
        client: api.EngineClient,
        channel: _ContainerChannel,
        name: str,
        *,
        mechanisms: Mechanisms,
        memory_bytes: int | None,
        cgroup_name: str | None,
    ) -> None:
        self.backend = backend
        self.client = client
        self.channel: _ContainerChannel = channel
        self.name = name
        self.mechanisms = mechanisms
        self._memory_bytes = memory_bytes
        self._cgroup_name = cgroup_name
        #: Where a kill gives the container the dying weight (engine.hasten).
        self._dying_weight = [] if cgroup_name is None else eng.dying_weight_files(cgroup_name)
        self._id: str | None = None
        #: Whether a create request went out: the container may exist under its name even
        #: though its id never came back (the request cancelled while the engine answered).
        self._create_sent = False
        self._status: ExitStatus | None = None
        self._killed = False
        self._removed = False
        self._exited = anyio.Event()
        self._wait_lock = anyio.Lock()
        #: The exit code the engine reported, when it reported one.
        self._exit_code: int | None = None
        self._wait_error: str | None = None
        #: Why the engine could not be reached at teardown, if it could not: it went away
        #: (stopped, restarted, crashed) during the execution.
        self._engine_lost: str | None = None
        self._waiter: api.OpenResponse | None = None
        #: The container's init, held by a pidfd once verified (root host, Docker engine):
        #: the host kills the container through it, and sees it ended, without the engine.
        self._init: ContainerInit | None = None
        #: Whether the host saw the init end after killing it (the whole container with it).
        self._ended_by_host = False
        self._demux = _Demux()
        self.stdout = _OutputStream(self._demux, api.STDOUT)
        self.stderr = _OutputStream(self._demux, api.STDERR)

    @property
    def _ref(self) -> str:
        return api.path_segment(self._id or self.name)

    async def start(self, body: dict[str, object]) -> None:
        """Create the container, attach to its output and register for its exit before it
        starts (so neither a byte nor the exit can be missed), then start it."""
        engine = self.backend.engine
        self._create_sent = True
        try:
            # Not cut short (the request has its own deadline): a create cancelled midway
            # may still be completed by the engine after a removal by name found nothing.
            with anyio.CancelScope(shield=True):
                created = await self.client.request(
                    "POST", "/containers/create", query={"name": self.name}, body=body
                )
        except api.EngineStatusError as exc:
            if exc.status == 404 or "no such image" in exc.message.lower():
                raise BackendUnavailable(image_missing(self.backend.options.image, engine)) from exc
            raise BackendUnavailable(
                f"the {engine} engine could not create the container: {exc.message}"
            ) from exc
        except api.EngineError as exc:
            raise BackendUnavailable(f"the {engine} engine did not answer: {exc}") from exc
        parsed = created.json()
        ident = parsed.get("Id") if isinstance(parsed, dict) else None
        if not isinstance(ident, str) or not _CONTAINER_ID.fullmatch(ident):
            raise BackendUnavailable(
                f"the {engine} engine's create answer names no container id: {created.body[:200]!r}"
            )
        self._id = ident
        mark("container created")
        try:
            self._demux.attached = await self.client.open(
                "POST",
                f"/containers/{self._ref}/attach",
                query={"stream": "1", "stdout": "1", "stderr": "1"},
                upgrade=True,
            )
            self._waiter = await self.client.open(
                "POST", f"/containers/{self._ref}/wait", query={"condition": "next-exit"}
            )
            await self.client.request("POST", f"/containers/{self._ref}/start")
        except api.EngineError as exc:
            raise BackendUnavailable(
                f"the {engine} engine could not start the container: {exc}"
            ) from exc

    async def wait_exited(self) -> None:
        """Return once the engine reported the container's exit. Any number of tasks may
        wait; the first reads the engine's answer, and a cancelled reader loses nothing."""
        async with self._wait_lock:
            if self._exited.is_set():
                return
            if self._waiter is None:
                # Never started: nothing will exit.
                self._exited.set()
                return
            try:
                body = await self._waiter.read_body(limit=WAIT_BODY_BYTES)
                parsed = json.loads(body)
                code = parsed.get("StatusCode") if isinstance(parsed, dict) else None
                if isinstance(code, int) and not isinstance(code, bool) and -1 <= code < 2**31:
                    self._exit_code = code
                else:
                    self._wait_error = f"the engine's wait answer has no exit code: {body[:200]!r}"
            except (api.EngineError, ValueError) as exc:
                self._wait_error = str(exc)
            self._exited.set()

    async def started(self) -> None:
        """Return once the bootstrap has connected and the container's init is held (or
        could not be); raise BackendUnavailable, quoting the engine, if the container ended
        first."""
        async with anyio.create_task_group() as group:
            # While the interpreter starts: on a quiet host the lookup is over first.
            group.start_soon(self._take_init)
            await wait_started(
                self,
                self.channel.accept_early,
                lambda: self.channel.early is not None,
                seconds=STARTUP_SECONDS,
                stderr_bytes=STARTUP_STDERR_BYTES,
                failure=lambda status, said: (
                    f"the {self.backend.engine} engine's container ended before the sandboxed "
                    f"interpreter connected ({status.describe()}): {said}"
                ),
            )

    async def _take_init(self) -> None:
        """Hold the container's init by a pidfd, before any program exists. Only a root
        host may signal the container's processes; the pid is the Docker engine's word,
        checked against the kernel's (container_init.py). Without it the engine kills."""
        if not self.backend.is_root or self.backend.engine != "docker" or self._id is None:
            return
        try:
            inspected = (
                await self.client.request(
                    "GET", f"/containers/{self._ref}/json", timeout=INIT_LOOKUP_SECONDS
                )
            ).json()
        except api.EngineError:
            return
        state = inspected.get("State") if isinstance(inspected, dict) else None
        pid = state.get("Pid") if isinstance(state, dict) else None
        if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
            self._init = ContainerInit.take(
                pid, self._id, namespace_init=self.backend.options.runtime == "runc"
            )

    def terminate_from_thread(self) -> None:
        # At the deadline itself, whatever the event loop is doing.
        if self._init is not None:
            self._init.kill()
            eng.hasten(self._dying_weight)

    async def terminate(self, grace_seconds: float) -> None:
        # Nothing in an untrusted container is worth a grace window: kill it whole.
        await self._kill()

    async def _kill(self) -> None:
        if self._killed or self._id is None:
            return
        self._killed = True
        if self._init is not None:
            # The host's own kill, at once; the engine learns of the exit by itself, and its
            # removal at teardown follows after the result was handed back.
            self._init.kill()
        else:
            await self._engine_kill()
        eng.hasten(self._dying_weight)

    async def _engine_kill(self) -> None:
        # 404 (gone) and 409 (not running) both mean there is nothing left to kill.
        try:
            await self.client.request(
                "POST",
                f"/containers/{self._ref}/kill",
                query={"signal": "KILL"},
                timeout=KILL_SECONDS,
            )
        except api.EngineUnreachable as exc:
            self._engine_lost = self._engine_lost or str(exc)
        except api.EngineError:
            pass

    async def finish(self) -> ExitStatus:
        if self._status is not None:
            return self._status
        with anyio.CancelScope(shield=True):
            state: dict[str, object] = {}
            try:
                if self._id is not None and not self._exited.is_set():
                    await self._kill()
                    if self._init is not None and await self._init.wait_ended(EXIT_REPORT_SECONDS):
                        # Killed by the host and seen ended by it: no process of the
                        # container is left, and the engine's report would add nothing the
                        # result needs (an out-of-memory end cannot outrank the kill).
                        self._ended_by_host = True
                        self._seal_output()
                        self._status = self._interpret({})
                        return self._status
                    if self._init is not None:
                        await self._engine_kill()  # never seen to end: the engine's turn
                    with anyio.move_on_after(EXIT_REPORT_SECONDS):
                        await self.wait_exited()
                # A clean exit needs no inspection (the bootstrap exits 0 only after its
                # result or an abort); anything else may be an OOM kill only the engine saw.
                if self._id is not None and (self._exit_code != 0 or self._killed):
                    try:
                        inspected = (
                            await self.client.request("GET", f"/containers/{self._ref}/json")
                        ).json()
                    except api.EngineUnreachable as exc:
                        self._engine_lost = str(exc)
                    except api.EngineError:
                        pass
                    else:
                        found = inspected.get("State") if isinstance(inspected, dict) else None
                        if isinstance(found, dict):
                            state = found
            except BaseException:
                await self.remove()
                raise
            # Removed by the launch's teardown: a timed-out result need not wait for it.
            status = self._interpret(state)
        self._status = status
        return status

    def _seal_output(self) -> None:
        """End each output stream at a seal written after the container's end (see
        container_init.py), instead of when the engine gets round to closing it."""
        assert self._init is not None
        tokens = self._init.seal()
        if tokens:
            self._demux.seal(tokens)

    async def remove(self) -> None:
        """Force-remove the container with its anonymous volumes; the engine kills whatever
        still runs. Idempotent."""
        if self._removed or (self._id is None and not self._create_sent):
            return
        self._removed = True
        try:
            await self.client.request(
                "DELETE",
                f"/containers/{self._ref}",
                query={"force": "1", "v": "1"},
                timeout=REMOVE_SECONDS,
            )
        except api.EngineStatusError as exc:
            if exc.status != 404:
                await self._remove_by_cli()
        except api.EngineError as exc:
            if isinstance(exc, api.EngineUnreachable):
                self._engine_lost = self._engine_lost or str(exc)
            await self._remove_by_cli()

    async def _remove_by_cli(self) -> None:
        # The API refused or broke: the engine's own client is the last resort; if even that
        # fails the backend removes it before its next launch, and the labels let the reaper
        # finish the job once this host is gone.
        ref = self._id or self.name
        if self.backend.cli is not None:
            code, _, _ = await self.backend.engine_command("rm", "-f", "--volumes", ref)
            if code != 0:
                self.backend.unremoved.add(ref)

    async def close_streams(self) -> None:
        if self._init is not None:
            self._init.close()
        for opened in (self._demux.attached, self._waiter):
            if opened is not None:
                await opened.aclose()

    def _interpret(self, state: dict[str, object]) -> ExitStatus:
        code = state.get("ExitCode")
        if not isinstance(code, int) or isinstance(code, bool):
            code = self._exit_code
        hint: tuple[ErrorKind, str] | None = None
        if code is None:
            # The engine never reported an exit (the container was never created, or the
            # engine failed): killed if we killed it, else unknown — and the engine's own
            # words say why.
            code = 128 + signal.SIGKILL if self._killed else -1
            if not self._killed and self._wait_error is not None:
                hint = (
                    ErrorKind.WORKER_EXIT,
                    f"the container engine did not report how the container ended: "
                    f"{self._wait_error}",
                )
        cpu, peak = self._usage()
        sig: int | None = None
        cap = self.backend.container_memory(self._memory_bytes)
        if state.get("OOMKilled") is True or (not self._killed and out_of_memory(code, cap, peak)):
            limit = f" of {self._memory_bytes // MiB} MiB" if self._memory_bytes is not None else ""
            hint = (
                ErrorKind.MEMORY_LIMIT,
                f"the program exhausted the container's memory limit{limit} and the kernel's "
                "out-of-memory killer ended it",
            )
            sig = signal.SIGKILL
        elif 128 < code < 128 + 65:
            # The engine's init exits 128+N when the program died of signal N.
            sig = code - 128
        elif code == RUNSC_CRASHED and self.backend.options.runtime == "runsc" and not self._killed:
            hint = (
                ErrorKind.WORKER_EXIT,
                "the gVisor sandbox ended with status 2 before the program returned: runsc "
                "exits so when the sandbox itself crashes (for example at its host task "
                "limit), though a program calling os._exit(2) looks the same",
            )
        if self._engine_lost is not None:
            # Whatever the exit looked like (the engine stops its containers as it goes),
            # it was the engine's doing, not the program's.
            hint = (
                ErrorKind.BACKEND_NOT_READY,
                f"the {self.backend.engine} engine went away during the execution (it could "
                f"not be reached at teardown: {self._engine_lost})",
            )
        return ExitStatus(
            code=None if sig is not None else code,
            signal=sig,
            cpu_seconds=cpu,
            peak_memory_bytes=peak,
            failure_hint=hint,
            # The engine reports the exit once the container's init is gone, and with it its
            # pid namespace: every process of the container (so does the init's pidfd).
            tree_ended=True
            if self._ended_by_host or (self._exited.is_set() and self._exit_code is not None)
            else None,
        )

    def usage_so_far(self) -> tuple[float | None, int | None] | None:
        # The per-execution cgroup parent is readable while the container lives.
        cpu, peak = self._usage()
        return None if cpu is None else (cpu, peak)

    def memory_bytes_now(self) -> int | None:
        if self._cgroup_name is None:
            return None
        path = eng.CGROUP_MOUNT / "memory" / eng.CGROUP_ROOT / self._cgroup_name
        try:
            return int((path / "memory.usage_in_bytes").read_text())
        except (OSError, ValueError):
            return None

    def _usage(self) -> tuple[float | None, int | None]:
        """CPU seconds and peak memory of the container's cgroup (the runtime's own
        overhead included), read from the per-execution parent that outlived it."""
        if self._cgroup_name is None:
            return None, None
        base = eng.CGROUP_MOUNT
        try:
            cpu_ns = int(
                (
                    base / "cpuacct" / eng.CGROUP_ROOT / self._cgroup_name / "cpuacct.usage"
                ).read_text()
            )
            peak = int(
                (
                    base
                    / "memory"
                    / eng.CGROUP_ROOT
                    / self._cgroup_name
                    / "memory.max_usage_in_bytes"
                ).read_text()
            )
        except (OSError, ValueError):
            return None, None
        return cpu_ns / 1e9, peak


#: How close to its cap the container's peak must have come for a SIGKILL nobody here sent to
#: be the out-of-memory killer's (a cgroup's usage is never charged past its limit).
OOM_PEAK_SLACK = 1 * MiB


def out_of_memory(code: int, cap: int | None, peak: int | None) -> bool:
    """Whether an exit the engine did not flag as an out-of-memory kill was one: SIGKILL
    (128+9 from the container's init) with the container's memory at its cap. The engine's
    flag comes from an event that can lose the race with the exit's (seen under gVisor); the
    cgroup's own peak, read from the per-execution parent that outlives the container, does
    not."""
    if code != 128 + signal.SIGKILL or cap is None or peak is None:
        return False
    return peak >= cap - OOM_PEAK_SLACK


def _remove_tree(directory: Path) -> None:
    with suppress(OSError):
        remove_tree(str(directory))


_REAPED: set[str] = set()


def _reap_once(cli: str, engine: str) -> None:
    """Reap orphans of dead hosts the first time this process configures an engine."""
    if cli in _REAPED:
        return
    _REAPED.add(cli)
    eng.reap_orphans(engine)


class GvisorBackend(DockerBackend, id="gvisor", options=GvisorOptions):
    """The docker backend with gVisor's runsc, as a backend of its own so profiles and
    ``doctor`` name it (registered by the ``gvisor`` entry point, see gvisor.py)."""


@hookimpl
def psych_sandbox_register_backends(registry: BackendRegistrar) -> None:
    registry.add(DockerBackend)
