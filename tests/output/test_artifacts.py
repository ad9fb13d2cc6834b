"""Artifact collection: every way of pointing outside the workspace is skipped, from the host.

Each test plants a trick in a real directory, collects, and then checks from the host that
the bytes outside were never handed back and nothing outside was deleted by cleanup.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from psych_sandbox_core._output.artifact_walk import collect
from psych_sandbox_core._output.artifacts import CollectionLimits
from psych_sandbox_core._output.content_type import sniff_content_type
from psych_sandbox_core.kit.posix.removal import remove_tree

from ..conftest import PROFILE, config

SECRET = b"host secret: must never be collected\n"
LIMITS = CollectionLimits(per_file_bytes=1024 * 1024, total_bytes=4 * 1024 * 1024, max_files=50)


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A workspace and, beside it, a host directory holding a secret file."""
    workspace = tmp_path / "ws"
    outside = tmp_path / "host"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    (outside / "sub").mkdir()
    (outside / "sub" / "deep").write_bytes(SECRET)
    yield workspace, outside


def assert_outside_intact(outside: Path) -> None:
    assert (outside / "secret").read_bytes() == SECRET
    assert (outside / "sub" / "deep").read_bytes() == SECRET


def collected_bytes(collection: object) -> list[bytes]:
    return [f.data for f in collection.files]  # type: ignore[attr-defined]


def reasons(collection: object) -> dict[str, str]:
    return {s.path: s.reason for s in collection.skipped}  # type: ignore[attr-defined]


def test_regular_files_are_collected_with_type_and_digest(layout: tuple[Path, Path]) -> None:
    workspace, _ = layout
    (workspace / "out").mkdir()
    (workspace / "out" / "a.txt").write_text("hello\n")
    (workspace / "img").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 20)
    result = collect(str(workspace), LIMITS)
    by_path = {f.path: f for f in result.files}
    assert set(by_path) == {"out/a.txt", "img"}
    assert by_path["img"].content_type == "image/png"  # from the bytes, not the name
    assert by_path["out/a.txt"].content_type.startswith("text/plain")
    import hashlib

    assert by_path["out/a.txt"].sha256 == hashlib.sha256(b"hello\n").hexdigest()


def test_symlink_to_a_host_file_is_skipped_and_survives_cleanup(
    layout: tuple[Path, Path],
) -> None:
    workspace, outside = layout
    (workspace / "leak").symlink_to(outside / "secret")
    result = collect(str(workspace), LIMITS)
    assert SECRET not in collected_bytes(result)
    assert reasons(result) == {"leak": "symlink"}
    remove_tree(str(workspace))
    assert not workspace.exists()
    assert_outside_intact(outside)


def test_symlink_to_a_directory_outside_is_not_entered_nor_emptied(
    layout: tuple[Path, Path],
) -> None:
    workspace, outside = layout
    (workspace / "dir").symlink_to(outside / "sub", target_is_directory=True)
    result = collect(str(workspace), LIMITS)
    assert result.files == []
    assert reasons(result) == {"dir": "symlink"}
    remove_tree(str(workspace))
    assert_outside_intact(outside)


def test_output_folder_that_is_a_symlink_collects_nothing(layout: tuple[Path, Path]) -> None:
    workspace, outside = layout
    (workspace / "out").symlink_to(outside, target_is_directory=True)
    result = collect(str(workspace), LIMITS, folder="out")
    assert result.files == []
    assert reasons(result) == {"out": "symlink"}


def test_output_folder_limits_collection(layout: tuple[Path, Path]) -> None:
    workspace, _ = layout
    (workspace / "out").mkdir()
    (workspace / "out" / "keep").write_text("k")
    (workspace / "scratch").write_text("s")
    result = collect(str(workspace), LIMITS, folder="out")
    assert [f.path for f in result.files] == ["out/keep"]
    with pytest.raises(ValueError):
        collect(str(workspace), LIMITS, folder="../host")


def test_hard_link_to_a_host_file_is_skipped(layout: tuple[Path, Path]) -> None:
    workspace, outside = layout
    os.link(outside / "secret", workspace / "linked")
    result = collect(str(workspace), LIMITS)
    assert SECRET not in collected_bytes(result)
    assert reasons(result) == {"linked": "hard_link"}
    remove_tree(str(workspace))
    assert_outside_intact(outside)
    assert os.stat(outside / "secret").st_nlink == 1


def test_fifo_socket_and_device_are_skipped_without_opening(layout: tuple[Path, Path]) -> None:
    workspace, _ = layout
    os.mkfifo(workspace / "fifo")  # opening it for reading would block forever
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(workspace / "sock"))
        planted = {"fifo": "fifo", "sock": "socket"}
        if os.geteuid() == 0:
            os.mknod(workspace / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
            planted["null"] = "device"
        result = collect(str(workspace), LIMITS)
    finally:
        sock.close()
    assert result.files == []
    assert reasons(result) == planted
    remove_tree(str(workspace))
    assert not workspace.exists()


def test_read_only_nested_tree_is_collected_and_removed(layout: tuple[Path, Path]) -> None:
    workspace, outside = layout
    nested = workspace / "a" / "b" / "c"
    nested.mkdir(parents=True)
    (nested / "f").write_text("data")
    (nested / "f").chmod(0o400)
    for directory in (nested, nested.parent, nested.parent.parent):
        directory.chmod(0o500)
    (workspace / "a" / "escape").symlink_to(outside, target_is_directory=True)
    result = collect(str(workspace), LIMITS)
    assert [f.path for f in result.files] == ["a/b/c/f"]
    (workspace / "a").chmod(0)  # even unsearchable
    remove_tree(str(workspace))
    assert not workspace.exists()
    assert_outside_intact(outside)


def test_file_swapped_for_a_symlink_while_collecting_is_skipped(
    layout: tuple[Path, Path],
) -> None:
    workspace, outside = layout
    (workspace / "report").write_text("mine")

    def swap(relative: str) -> None:
        os.unlink(workspace / relative)
        os.symlink(outside / "secret", workspace / relative)

    result = collect(str(workspace), LIMITS, on_candidate=swap)
    assert SECRET not in collected_bytes(result)
    assert reasons(result) == {"report": "changed"}
    assert_outside_intact(outside)


def test_file_renamed_away_while_collecting_is_skipped(layout: tuple[Path, Path]) -> None:
    workspace, outside = layout
    (workspace / "report").write_text("mine")

    def rename(relative: str) -> None:
        os.rename(workspace / relative, outside / "moved")

    result = collect(str(workspace), LIMITS, on_candidate=rename)
    assert result.files == []
    assert reasons(result) == {"report": "vanished"}


def test_file_replaced_by_another_file_while_collecting_is_skipped(
    layout: tuple[Path, Path],
) -> None:
    workspace, outside = layout
    (workspace / "report").write_text("mine")

    def replace(relative: str) -> None:
        os.link(outside / "secret", outside / "copy")
        os.rename(outside / "copy", workspace / relative)  # a different inode now

    result = collect(str(workspace), LIMITS, on_candidate=replace)
    assert SECRET not in collected_bytes(result)
    assert reasons(result) == {"report": "changed"}


def test_size_caps_and_count_cap(layout: tuple[Path, Path]) -> None:
    workspace, _ = layout
    (workspace / "big").write_bytes(b"x" * 2000)
    for index in range(3):
        (workspace / f"f{index}").write_bytes(b"y" * 600)
    limits = CollectionLimits(per_file_bytes=1000, total_bytes=1300, max_files=5)
    result = collect(str(workspace), limits)
    assert [f.path for f in result.files] == ["f0", "f1"]
    assert reasons(result) == {"big": "too_large", "f2": "total_cap"}
    limits = CollectionLimits(per_file_bytes=1000, total_bytes=10_000, max_files=1)
    assert reasons(collect(str(workspace), limits))["f1"] == "too_many"


def test_sniffing_never_says_html() -> None:
    assert sniff_content_type(b"<html><script>alert(1)</script></html>").startswith("text/plain")
    assert sniff_content_type(b'{"a": [1, 2]}') == "application/json"
    assert sniff_content_type(b"%PDF-1.7\n") == "application/pdf"
    assert sniff_content_type(b"\x00\x01\x02binary") == "application/octet-stream"
    assert sniff_content_type(b"\xff\xfe\xfa") == "application/octet-stream"


@pytest.mark.anyio
async def test_program_planted_tricks_end_to_end(tmp_path: Path) -> None:
    """Through the public API: the program plants a symlink to a host file, a FIFO and a
    read-only tree; only its own regular file comes back and the host file is untouched."""
    from psych_sandbox_core import Sandbox

    host_file = tmp_path / "host-secret"
    host_file.write_bytes(SECRET)
    os.chmod(tmp_path, 0o755)
    source = f"""
import os
open("result.csv", "w").write("a,b\\n1,2\\n")
os.symlink({str(host_file)!r}, "leak")
os.mkfifo("pipe")
os.makedirs("ro/inner")
open("ro/inner/x", "w").write("x")
os.chmod("ro/inner", 0o500)
os.chmod("ro", 0o500)
os.getcwd()
"""
    async with Sandbox(config()) as sandbox:
        result = await sandbox.run(source, profile=PROFILE)
        assert result.error is None, result.error
        workspace = result.return_value
        paths = {a.path for a in result.artifacts}
        assert paths == {"result.csv", "ro/inner/x"}
        skipped = {s.path: s.reason for s in result.skipped_artifacts}
        assert skipped == {"leak": "symlink", "pipe": "fifo"}
        for artifact in result.artifacts:
            window = await sandbox.read_attachment(artifact.attachment, run_id=result.run_id or "")
            assert SECRET not in window.data
    assert host_file.read_bytes() == SECRET
    assert not os.path.exists(workspace)  # removed, read-only tree and all


def test_cli_writes_artifacts_without_following_links_or_overwriting(tmp_path: Path) -> None:
    from psych_sandbox_core._output.artifact_export import ArtifactExportError, write_artifacts
    from psych_sandbox_core.cli import main

    program = tmp_path / "prog.py"
    program.write_text("import os\nos.makedirs('out')\nopen('out/r.txt', 'w').write('r')\n")
    target = tmp_path / "dest"
    assert main(["run", "--profile", "subprocess", "--artifacts", str(target), str(program)]) == 0
    assert (target / "out" / "r.txt").read_text() == "r"
    # A second run into the same folder refuses to overwrite.
    assert main(["run", "--profile", "subprocess", "--artifacts", str(target), str(program)]) == 2
    # A link planted in the destination is not followed out of it.
    outside = tmp_path / "outside"
    outside.mkdir()
    other = tmp_path / "dest2"
    other.mkdir()
    (other / "out").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ArtifactExportError, match="not a folder"):
        write_artifacts(str(other), [("out/r.txt", b"r")])
    (other / "f").symlink_to(outside / "victim")
    with pytest.raises(ArtifactExportError, match="overwrite"):
        write_artifacts(str(other), [("f", b"x")])
    with pytest.raises(ArtifactExportError, match="safe"):
        write_artifacts(str(other), [("../escape", b"x")])
    assert list(outside.iterdir()) == []


@pytest.mark.anyio
async def test_a_file_of_hostile_json_is_kept_as_text_without_parsing_it() -> None:
    """A program's file is sniffed on the host: deeply nested or very wide JSON is measured
    before any parser sees it, comes back as text, and never raises out of the run."""
    from psych_sandbox_core import Sandbox

    source = (
        "open('deep.json', 'w').write('[' * 200000 + ']' * 200000)\n"
        "open('wide.json', 'w').write('[' + ','.join(['[]'] * 300000) + ']')\n"
        "open('fine.json', 'w').write('{\"a\": [1, 2]}')\n"
    )
    async with Sandbox(config()) as sandbox:
        result = await sandbox.run(source, profile=PROFILE)
    assert result.error is None, result.error
    types = {a.path: a.content_type for a in result.artifacts}
    assert types == {
        "deep.json": "text/plain; charset=utf-8",
        "wide.json": "text/plain; charset=utf-8",
        "fine.json": "application/json",
    }
