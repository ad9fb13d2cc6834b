"""Artifacts sent over the control channel, for backends whose workspace the host cannot reach.

The frames round-trip; the host-side collector refuses every frame an honest bootstrap would
not send; and end to end, on the subprocess mechanism with its workspace hidden from the host
(so the channel is the only way back), files return with the right digest and type, links and
FIFOs are listed as skipped, caps hold, and a program forging artifact frames gets
protocol_error with the host healthy and nothing written anywhere.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psych_sandbox_testing.programs import check_planted_artifacts

from psych_sandbox_core import DeploymentConfig, ErrorKind, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core._output.artifact_channel import ChannelCollector
from psych_sandbox_core._output.artifacts import collection_problem
from psych_sandbox_core._output.capture import OutputPolicy
from psych_sandbox_core._output.preservation import OutputContext, collect_artifacts
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_core.backends.subprocess import SubprocessBackend
from psych_sandbox_core.child.loader import bootstrap_module
from psych_sandbox_core.cli.render import export_note
from psych_sandbox_core.errors import ProtocolViolation
from psych_sandbox_core.kit.backend import Launched, LaunchRequest
from psych_sandbox_core.kit.hookspecs import hookimpl
from psych_sandbox_core.protocol import (
    ArtifactFrame,
    ArtifactRequest,
    ArtifactSkippedFrame,
    ChildLimits,
    RunFrame,
    decode_child_frame,
    decode_host_frame,
    encode_host_frame,
)
from psych_sandbox_core.protocol import limits as protocol_limits
from psych_sandbox_core.protocol.limits import ARTIFACT_CHUNK_BYTES
from psych_sandbox_core.result import SkippedEntry

from ..conftest import FAST_LIMITS, open_fds

#: The child's functions and constants, from the source the child runs.
bootstrap = bootstrap_module()

CHUNK = ARTIFACT_CHUNK_BYTES
PROFILE = "hidden"

# ---------------------------------------------------------------- frames


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# Paths are text the bootstrap has already checked: no separator, NUL or lone surrogate (a
# name that is not UTF-8 is sent escaped, never raw).
name_characters = st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",))
paths = st.lists(st.text(name_characters, min_size=1, max_size=12), min_size=1, max_size=4).map(
    "/".join
)


@given(
    st.builds(
        ArtifactFrame,
        type=st.just("artifact"),
        path=paths,
        offset=st.integers(0, 2**53 - 1),
        data=st.binary(max_size=64).map(b64),
        last=st.booleans(),
    )
    | st.builds(
        ArtifactSkippedFrame,
        type=st.just("artifact_skipped"),
        path=paths,
        reason=st.sampled_from(["symlink", "fifo", "hard_link", "too_large", "unreadable"]),
    )
)
@settings(max_examples=200)
def test_artifact_frames_round_trip(frame: Any) -> None:
    line = frame.model_dump_json().encode()
    assert decode_child_frame(line) == frame


@given(
    folder=st.sampled_from(["", "out", "out/sub"]),
    numbers=st.tuples(*(st.integers(1, 2**31) for _ in range(3))),
)
@settings(max_examples=50)
def test_run_frame_with_a_collection_request_round_trips(
    folder: str, numbers: tuple[int, int, int]
) -> None:
    request = ArtifactRequest(
        folder=folder, max_files=numbers[0], file_bytes=numbers[1], total_bytes=numbers[2]
    )
    frame = RunFrame(
        source="1",
        tools=[],
        artifacts=request,
        limits=ChildLimits(
            cpu_seconds=None,
            memory_bytes=None,
            file_size_bytes=None,
            processes=None,
            return_value_bytes=10,
        ),
    )
    encoded = encode_host_frame(frame)
    assert decode_host_frame(encoded) == frame
    # What the bootstrap reads.
    assert bootstrap.json_loads(encoded.decode())["artifacts"]["folder"] == folder


def test_artifact_frame_fields_are_bounded_before_decoding() -> None:
    too_long = "A" * (protocol_limits.ARTIFACT_CHUNK_BASE64_CHARS + 4)
    for bad in (
        {"path": "a", "offset": 0, "data": too_long, "last": True},
        {"path": "", "offset": 0, "data": "", "last": True},
        {"path": "a" * 5000, "offset": 0, "data": "", "last": True},
        {"path": "a", "offset": -1, "data": "", "last": True},
        {"path": "a", "offset": 0.0, "data": "", "last": True},
        {"path": "a", "offset": 0, "data": "", "last": 1},
        {"path": "a", "offset": 0, "data": "", "last": True, "sha256": "x"},
    ):
        with pytest.raises(ProtocolViolation):
            decode_child_frame(json.dumps({"type": "artifact", **bad}).encode())
    with pytest.raises(ProtocolViolation):
        decode_child_frame(b'{"type":"artifact_skipped","path":"a","reason":"because"}')
    with pytest.raises(ProtocolViolation, match="surrogate"):
        decode_child_frame(
            b'{"type":"artifact","path":"a\\udcff","offset":0,"data":"","last":true}'
        )


def test_bootstrap_copies_of_artifact_constants_match() -> None:
    assert bootstrap.ARTIFACT_CHUNK_BYTES == protocol_limits.ARTIFACT_CHUNK_BYTES
    assert bootstrap.MAX_ARTIFACT_ENTRIES == protocol_limits.MAX_ARTIFACT_ENTRIES
    assert bootstrap.MAX_ARTIFACT_DEPTH == protocol_limits.MAX_ARTIFACT_DEPTH
    assert bootstrap.MAX_ARTIFACT_PATH_CHARS == protocol_limits.MAX_ARTIFACT_PATH_CHARS


# ---------------------------------------------------------------- the host's collector


def collector(**caps: Any) -> ChannelCollector:
    values: dict[str, Any] = {
        "folder": "",
        "max_files": 10,
        "file_bytes": 4 * CHUNK,
        "total_bytes": 8 * CHUNK,
    }
    values.update(caps)
    return ChannelCollector(ArtifactRequest(**values))


def chunk(path: str, data: bytes, offset: int = 0, last: bool = True) -> ArtifactFrame:
    return ArtifactFrame(type="artifact", path=path, offset=offset, data=b64(data), last=last)


def raw(text: str, path: str = "a") -> ArtifactFrame:
    """A chunk whose data field holds exactly ``text``."""
    return ArtifactFrame(type="artifact", path=path, offset=0, data=text, last=True)


def skipped(path: str, reason: str = "symlink") -> ArtifactSkippedFrame:
    return ArtifactSkippedFrame(type="artifact_skipped", path=path, reason=reason)  # type: ignore[arg-type]


def test_collector_builds_the_same_collection_as_the_host_walk() -> None:
    c = collector()
    big = bytes(range(256)) * (CHUNK // 256) + b"tail"
    c.receive(chunk("dir/big.bin", big[:CHUNK], last=False))
    c.receive(chunk("dir/big.bin", big[CHUNK:], offset=CHUNK))
    c.receive(chunk("empty", b""))
    c.receive(chunk("img.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 8))
    c.receive(skipped("link"))
    c.at_result()
    result = c.collection()
    files = {f.path: f for f in result.files}
    assert files["dir/big.bin"].data == big
    assert files["dir/big.bin"].sha256 == hashlib.sha256(big).hexdigest()
    assert files["img.png"].content_type == "image/png"
    assert files["empty"].data == b""
    assert result.total_bytes == len(big) + 16
    assert result.skipped == [SkippedEntry(path="link", reason="symlink")]


BAD_SEQUENCES: dict[str, list[Any]] = {
    "traversal": [chunk("../escape", b"x")],
    "traversal-inside": [chunk("a/../../escape", b"x")],
    "absolute": [chunk("/etc/passwd", b"x")],
    "empty-component": [chunk("a//b", b"x")],
    "dot-component": [chunk("./a", b"x")],
    "trailing-slash": [chunk("a/", b"x")],
    "nul": [chunk("a\x00b", b"x")],
    "control-character": [chunk("a\nb", b"x")],
    "backslash": [chunk("a\\..\\b", b"x")],
    "skipped-traversal": [skipped("../x")],
    "first-offset-not-zero": [chunk("a", b"x", offset=5)],
    "offset-gap": [chunk("a", b"x" * CHUNK, last=False), chunk("a", b"y", offset=2 * CHUNK)],
    "offset-overlap": [chunk("a", b"x" * CHUNK, last=False), chunk("a", b"y", offset=1)],
    "short-chunk-not-last": [chunk("a", b"x" * 10, last=False)],
    "restarted": [chunk("a", b"x"), chunk("a", b"x")],
    "interleaved": [chunk("a", b"x" * CHUNK, last=False), chunk("b", b"y")],
    "skip-interleaved": [chunk("a", b"x" * CHUNK, last=False), skipped("b")],
    "skipped-after-sent": [chunk("a", b"x"), skipped("a")],
    "over-file-cap": [chunk("a", b"x" * CHUNK, last=False), chunk("a", b"y" * 11, offset=CHUNK)],
    "over-total-cap": [chunk(f"f{i}", b"x" * CHUNK) for i in range(3)],
    "not-base64": [raw("!!!!")],
    "bad-padding": [raw("QQ=Q")],
    "not-a-multiple-of-four": [raw("QQ")],
    "file-and-folder": [chunk("a", b"x"), chunk("a/b", b"y")],
    "folder-and-file": [chunk("a/b", b"x"), chunk("a", b"y")],
    "too-many": [chunk(f"f{i}", b"x") for i in range(11)],
}


@pytest.mark.parametrize("frames", list(BAD_SEQUENCES.values()), ids=list(BAD_SEQUENCES))
def test_collector_refuses_what_an_honest_bootstrap_never_sends(frames: list[Any]) -> None:
    c = collector(file_bytes=CHUNK + 10, total_bytes=2 * CHUNK + 10)
    with pytest.raises(ProtocolViolation):
        for frame in frames:
            c.receive(frame)


def test_caps_are_checked_from_the_text_length_before_decoding() -> None:
    c = collector(file_bytes=1000, total_bytes=1500)
    # Not base64 at all, but longer than the cap allows: the cap speaks first.
    with pytest.raises(ProtocolViolation, match="1000-byte cap per file"):
        c.receive(raw("!" * 2000))
    c = collector(file_bytes=1000, total_bytes=1500)
    c.receive(chunk("a", b"x" * 1000))
    with pytest.raises(ProtocolViolation, match="1500-byte cap on all"):
        c.receive(chunk("b", b"y" * 600))


def test_a_half_sent_file_at_the_result_is_a_violation_and_abandoning_it_is_not() -> None:
    c = collector()
    c.receive(chunk("a", b"x" * CHUNK, last=False))
    with pytest.raises(ProtocolViolation, match="half sent"):
        c.at_result()
    c = collector()
    c.receive(chunk("a", b"x" * CHUNK, last=False))
    c.receive(skipped("a", "changed"))
    c.at_result()
    assert c.collection().files == []
    assert c.collection().skipped == [SkippedEntry(path="a", reason="changed")]


def test_an_output_folder_confines_every_path() -> None:
    c = collector(folder="out/sub")
    c.receive(chunk("out/sub/a", b"x"))
    c.receive(skipped("out", "symlink"))  # a folder on the way down
    c.receive(skipped("out/sub", "unreadable"))
    with pytest.raises(ProtocolViolation, match="outside the requested folder"):
        c.receive(chunk("out/other", b"x"))
    with pytest.raises(ProtocolViolation, match="outside the requested folder"):
        collector(folder="out").receive(chunk("out", b"x"))


def test_the_number_of_named_entries_is_bounded() -> None:
    c = collector()
    with pytest.raises(ProtocolViolation, match="artifact paths"):
        for index in range(protocol_limits.MAX_ARTIFACT_ENTRIES + 3):
            c.receive(skipped(f"s{index}", "fifo"))


def test_no_workspace_and_no_channel_says_so() -> None:
    context = OutputContext(policy=OutputPolicy(), ledger=None, tenant="t", run_id="r")
    collection = collect_artifacts(context, None)
    assert collection is not None and collection.files == []
    assert collection.skipped == [SkippedEntry(path=".", reason="unreachable")]
    problem = collection_problem(collection.skipped)
    assert problem is not None and "cannot hand its workspace" in problem


@pytest.mark.parametrize("folder", [None, "out", "a/b", "../up", "/abs"])
def test_an_empty_workspace_is_collected_as_a_walk_would_find_it(
    tmp_path: Path, folder: str | None
) -> None:
    context = OutputContext(
        policy=OutputPolicy(artifacts_folder=folder), ledger=None, tenant="t", run_id="r"
    )

    def collected(empty: bool) -> object:
        try:
            return collect_artifacts(context, str(tmp_path), empty=empty)
        except ValueError as exc:
            return str(exc)

    assert collected(empty=True) == collected(empty=False)


# ---------------------------------------------------------------- end to end


class HiddenWorkspaceBackend(SubprocessBackend):
    """The subprocess mechanism with its workspace withheld from the host, as a mount
    namespace or a container would: artifacts can only come back over the channel."""

    id: ClassVar[str] = "hiddenworkspace"

    @asynccontextmanager
    async def launch(self, request: LaunchRequest) -> AsyncIterator[Launched]:
        async with super().launch(request) as launched:
            launched.workspace_path = None
            yield launched


class _Plugin:
    @staticmethod
    @hookimpl
    def psych_sandbox_register_backends(registry: Any) -> None:
        registry.add(HiddenWorkspaceBackend)


def hidden_sandbox(**policy: Any) -> Sandbox:
    registry = BackendRegistry()
    registry.register_plugin(_Plugin(), "hidden-workspace-test")
    profile = ProfileConfig(
        backend="hiddenworkspace",
        limits=ExecutionLimits(**FAST_LIMITS),
        output=OutputPolicy(**policy),
        # Cold executions only: tests compare the host's descriptors between runs, which
        # prepared children would hold.
        warm=0,
    )
    return Sandbox(DeploymentConfig(profiles={PROFILE: profile}), registry=registry)


PLANTED = """
import os
os.makedirs("out/deep")
open("out/report.txt", "w").write("hello\\n")
open("out/data.json", "w").write('{"a": [1, 2]}')
open("out/deep/image.png", "wb").write(b"\\x89PNG\\r\\n\\x1a\\n" + bytes(range(256)) * 8)
open("out/two-chunks.bin", "wb").write(bytes(range(256)) * 8192 + b"end")
open("out/exact-chunk.bin", "wb").write(b"\\x01" * (1 << 20))
open("out/empty", "wb").close()
open("out/original", "w").write("linked")
os.link("out/original", "out/hardlink")
os.symlink("/etc/passwd", "out/leak")
os.mkfifo("out/pipe")
os.chdir("out/deep")  # the workspace is found even after the program moves
"done"
"""

EXPECTED = {
    "out/report.txt": (b"hello\n", "text/plain; charset=utf-8"),
    "out/data.json": (b'{"a": [1, 2]}', "application/json"),
    "out/deep/image.png": (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8, "image/png"),
    "out/two-chunks.bin": (bytes(range(256)) * 8192 + b"end", "application/octet-stream"),
    "out/exact-chunk.bin": (b"\x01" * (1 << 20), "application/octet-stream"),
    "out/empty": (b"", "application/octet-stream"),
}


@pytest.mark.anyio
async def test_files_come_back_over_the_channel_with_digest_and_type() -> None:
    async with hidden_sandbox(inline_bytes=4 << 20) as box:
        result = await box.run(PLANTED, profile=PROFILE)
        assert result.return_value == "done"
        await check_planted_artifacts(box, result, EXPECTED)


@pytest.mark.anyio
async def test_caps_and_the_output_folder_hold_over_the_channel() -> None:
    source = """
import os
os.makedirs("out")
open("elsewhere", "w").write("not in the folder")
for name, size in (("a", 10), ("b", 500), ("c", 10), ("d", 10), ("e", 1), ("f", 1)):
    open(f"out/{name}", "w").write("x" * size)
"""
    async with hidden_sandbox(
        artifacts_folder="out", artifact_bytes=100, artifacts_total_bytes=25, max_artifacts=3
    ) as box:
        result = await box.run(source, profile=PROFILE)
    assert result.error is None, result.error
    assert sorted(a.path for a in result.artifacts) == ["out/a", "out/c", "out/e"]
    assert {s.path: s.reason for s in result.skipped_artifacts} == {
        "out/b": "too_large",
        "out/d": "total_cap",
        "out/f": "too_many",
    }


@pytest.mark.anyio
async def test_a_run_killed_before_it_could_send_says_nothing_was_collected() -> None:
    source = "open('kept', 'w').write('x')\nimport time\ntime.sleep(60)\n"
    async with hidden_sandbox() as box:
        result = await box.run(source, profile=PROFILE, timeout=1.0)
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    assert result.artifacts == []
    assert result.skipped_artifacts == [SkippedEntry(path=".", reason="interrupted")]
    note = export_note(0, "d", result)
    assert note.startswith("no artifacts could be collected: the execution ended before")
    # The same result with the collection's verdict taken away would read as an empty run.
    empty = result.model_copy(update={"skipped_artifacts": [], "error": None})
    assert export_note(0, "d", empty).endswith(": the program left no files to collect")


@pytest.mark.anyio
async def test_a_failing_program_still_hands_back_its_files() -> None:
    source = "open('partial.txt', 'w').write('so far')\nraise ValueError('boom')\n"
    async with hidden_sandbox() as box:
        result = await box.run(source, profile=PROFILE)
    assert result.error is not None and result.error.kind is ErrorKind.EXCEPTION
    assert [a.path for a in result.artifacts] == ["partial.txt"]


@pytest.mark.anyio
async def test_artifacts_turned_off_are_neither_sent_nor_missed() -> None:
    async with hidden_sandbox(collect_artifacts=False) as box:
        result = await box.run("open('f', 'w').write('x')\n1", profile=PROFILE)
    assert result.error is None and result.artifacts == [] and result.skipped_artifacts == []


# ---------------------------------------------------------------- hostile programs

PRELUDE = """
import base64, json, os, socket, sys
FD = int(next(a for a in sys.argv if a.startswith("channel=fd:"))[len("channel=fd:"):])
channel = socket.socket(fileno=os.dup(FD))
def send(**frame):
    channel.sendall(json.dumps(frame).encode() + b"\\n")
def artifact(path, data, offset=0, last=True):
    send(type="artifact", path=path, offset=offset,
         data=base64.b64encode(data).decode(), last=last)
RESULT = dict(type="result", outcome="returned", value_json="1", error=None, detail=None)
"""

SLEEP = "import time\ntime.sleep(60)\n"
MIB = "(1 << 20)"

#: What the program forges, and what the host's refusal must name.
HOSTILE = {
    "traversal": ("artifact('../../escape', b'owned')\n" + SLEEP, "'..'"),
    "absolute": ("artifact('/tmp/escape', b'owned')\n" + SLEEP, "absolute"),
    "offset-gap": (
        f"artifact('a', b'x' * {MIB}, last=False)\nartifact('a', b'y', offset=3 * {MIB})\n" + SLEEP,
        "expected 1048576",
    ),
    "over-cap-chunk": (
        f"artifact('big', b'z' * {MIB}, last=False)\n"
        f"artifact('big', b'z' * {MIB}, offset={MIB}, last=False)\n"
        f"artifact('big', b'z', offset=2 * {MIB})\n" + SLEEP,
        "2097152-byte cap per file",
    ),
    "half-sent-then-result": (
        f"artifact('a', b'x' * {MIB}, last=False)\nsend(**RESULT)\nos._exit(0)\n",
        "half sent",
    ),
    "after-the-result": (
        "send(**RESULT)\nartifact('late', b'late')\nos._exit(0)\n",
        "after the result",
    ),
    "call-after-artifacts": (
        "artifact('a', b'x')\nsend(type='call', id=0, name='t', arguments={})\n" + SLEEP,
        "call after",
    ),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(HOSTILE.values()), ids=list(HOSTILE))
async def test_forged_artifact_frames_are_protocol_errors(
    case: tuple[str, str], private_tmp: Path
) -> None:
    body, named = case
    async with hidden_sandbox(artifact_bytes=2 << 20) as box:
        await box.run("1", profile=PROFILE)  # warm-up, so descriptors are comparable
    # Taken once that Sandbox has closed: a result may come back before its teardown.
    fds = open_fds()
    async with hidden_sandbox(artifact_bytes=2 << 20) as box:
        result = await box.run(PRELUDE + body, profile=PROFILE)
        error = result.error
        assert error is not None, f"forged artifacts accepted: {result.artifacts}"
        assert error.kind is ErrorKind.PROTOCOL_ERROR, error
        assert named in error.message
        assert result.artifacts == []
        assert result.skipped_artifacts == [SkippedEntry(path=".", reason="interrupted")]
        healthy = await box.run("open('f', 'w').write('ok')\n21 * 2", profile=PROFILE)
        assert healthy.error is None and healthy.return_value == 42
        assert [a.path for a in healthy.artifacts] == ["f"]
    assert open_fds() == fds
    # Nothing was written anywhere: the workspaces are gone and no escape file appeared.
    assert list(private_tmp.iterdir()) == []
    assert not (private_tmp.parent / "escape").exists()
    assert not Path("/tmp/escape").exists()


@pytest.mark.anyio
async def test_an_artifact_frame_without_a_request_is_a_protocol_error(private_tmp: Path) -> None:
    # The plain subprocess backend hands its workspace to the host: no collection is asked of
    # the child, so any artifact frame is forged.
    from ..conftest import PROFILE as SUBPROCESS_PROFILE
    from ..conftest import config

    source = PRELUDE + "artifact('a', b'x')\nimport time\ntime.sleep(60)\n"
    async with Sandbox(config()) as box:
        result = await box.run(source, profile=SUBPROCESS_PROFILE)
        assert result.error is not None and result.error.kind is ErrorKind.PROTOCOL_ERROR
        assert "asked for no files" in result.error.message
        healthy = await box.run("21 * 2", profile=SUBPROCESS_PROFILE)
        assert healthy.error is None and healthy.return_value == 42
    assert list(private_tmp.iterdir()) == []


#: A process the program leaves behind, holding the channel, that forges a frame as soon as
#: the bootstrap's process is gone (a pipe's write end, held by it alone, closes then).
LEFT_BEHIND = """
import os, sys, json, socket
FD = int(next(a for a in sys.argv if a.startswith("channel=fd:"))[len("channel=fd:"):])
gone, alive = os.pipe()
if os.fork() == 0:
    os.close(alive)
    os.read(gone, 1)  # the bootstrap exited
    late = dict(type="artifact", path="late", offset=0, data="bGF0ZQ==", last=True)
    try:
        os.write(FD, json.dumps(late).encode() + b"\\n")
    finally:
        os._exit(0)
os.close(gone)
open("kept", "w").write("kept")
1
"""


@pytest.mark.anyio
async def test_a_process_left_behind_can_send_nothing_after_the_result(private_tmp: Path) -> None:
    # The child shuts the channel for writing after its result: for every holder, so a frame
    # forged afterwards by a process the program forked never arrives, and the result stands
    # (without it, the forgery lands after the result and withdraws it as a protocol error).
    async with hidden_sandbox() as box:
        result = await box.run(LEFT_BEHIND, profile=PROFILE)
    assert result.error is None, result.error
    assert result.return_value == 1
    assert [artifact.path for artifact in result.artifacts] == ["kept"]
    assert list(private_tmp.iterdir()) == []
