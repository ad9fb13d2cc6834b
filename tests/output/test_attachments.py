"""Attachments: inline, in the blob store or preview-only; handles scoped to run and tenant."""

from __future__ import annotations

from pathlib import Path

import pytest

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core._output.attachments import AttachmentDenied, AttachmentLedger
from psych_sandbox_core._output.blobstore import BlobAddress, BlobNotFound, FilesystemBlobStore
from psych_sandbox_core._output.capture import OutputPolicy
from psych_sandbox_core._output.pattern_search import PatternSearchError
from psych_sandbox_core.errors import ErrorKind

from ..conftest import FAST_LIMITS, PROFILE

pytestmark = pytest.mark.anyio

BIG = "print('line %d ' % 0 + 'z' * 50)\nfor i in range(1, 2000): print('line %d ' % i + 'z' * 50)"


def deployment(**output: object) -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="subprocess",
                limits=ExecutionLimits(**FAST_LIMITS),
                output=OutputPolicy(**output),  # type: ignore[arg-type]
            )
        }
    )


async def test_small_outputs_are_inline_and_readable_by_window() -> None:
    async with Sandbox(deployment()) as sandbox:
        result = await sandbox.run("print('hello world')\n[1, 2]", profile=PROFILE, run_id="r1")
        assert result.error is None
        by_name = {a.name: a for a in result.attachments}
        assert set(by_name) == {"stdout", "stderr", "return_value"}
        assert all(a.stored == "inline" and a.complete for a in result.attachments)
        assert result.stdout_info.attachment == by_name["stdout"].handle
        window = await sandbox.read_attachment(
            by_name["stdout"].handle, run_id="r1", offset=6, length=5
        )
        assert window.data == b"world" and not window.eof
        value = await sandbox.read_attachment(by_name["return_value"].handle, run_id="r1")
        assert value.data == b"[1,2]" or value.text.replace(" ", "") == "[1,2]"


async def test_large_stream_goes_to_the_blob_store_and_is_searchable(tmp_path: Path) -> None:
    store = FilesystemBlobStore(tmp_path / "blobs")
    async with Sandbox(deployment(inline_bytes=1024), blob_store=store) as sandbox:
        result = await sandbox.run(BIG, profile=PROFILE, run_id="r1")
        stdout = next(a for a in result.attachments if a.name == "stdout")
        assert stdout.stored == "blob"
        assert stdout.size_bytes == result.stdout_info.captured_bytes
        found = await sandbox.search_attachment(stdout.handle, r"line 1999 z+", run_id="r1")
        assert found.total_matches == 1 and found.matches[0].match.startswith("line 1999")
        whole = await sandbox.attachments.read_all(stdout.handle, tenant="default", run_id="r1")
        assert len(whole) == stdout.size_bytes


async def test_without_a_blob_store_only_a_preview_is_kept() -> None:
    async with Sandbox(deployment(inline_bytes=1024, preview_bytes=512)) as sandbox:
        result = await sandbox.run(BIG, profile=PROFILE, run_id="r1")
        assert result.error is None
        stdout = next(a for a in result.attachments if a.name == "stdout")
        assert stdout.stored == "preview_only" and not stdout.complete
        window = await sandbox.read_attachment(stdout.handle, run_id="r1", length=10**6)
        assert window.kept_bytes == 512 and window.eof and not window.complete


async def test_required_preservation_without_a_blob_store_fails_the_execution() -> None:
    async with Sandbox(deployment(inline_bytes=1024)) as sandbox:
        result = await sandbox.run(BIG + "\n42", profile=PROFILE, require_preservation=True)
        assert result.error is not None
        assert result.error.kind is ErrorKind.ARTIFACTS_UNAVAILABLE
        assert "stdout" in result.error.message
        assert result.return_value is None


async def test_required_preservation_with_a_blob_store_succeeds(tmp_path: Path) -> None:
    store = FilesystemBlobStore(tmp_path / "blobs")
    async with Sandbox(deployment(inline_bytes=1024), blob_store=store) as sandbox:
        result = await sandbox.run(BIG + "\n42", profile=PROFILE, require_preservation=True)
        assert result.error is None and result.return_value == 42


async def test_fabricated_and_foreign_handles_are_denied(tmp_path: Path) -> None:
    store = FilesystemBlobStore(tmp_path / "blobs")
    async with Sandbox(deployment(inline_bytes=1024), blob_store=store) as sandbox:
        mine = await sandbox.run(BIG, profile=PROFILE, run_id="run-a", tenant="acme")
        other = await sandbox.run(BIG, profile=PROFILE, run_id="run-b", tenant="acme")
        handle = mine.stdout_info.attachment
        assert handle is not None
        # Its own run and tenant: served.
        await sandbox.read_attachment(handle, run_id="run-a", tenant="acme")
        slot, token = handle.split(":")[1:]
        denied = [
            ("fabricated", "att:x1:" + "A" * len(token), "run-a", "acme"),
            ("another run", handle, "run-b", "acme"),
            ("another tenant", handle, "run-a", "globex"),
            ("wrong slot prefix", f"att:x9:{token}", "run-a", "acme"),
            ("not a handle", 42, "run-a", "acme"),
            ("other run's handle here", other.stdout_info.attachment, "run-a", "acme"),
        ]
        for label, fake, run_id, tenant in denied:
            with pytest.raises(AttachmentDenied):
                await sandbox.read_attachment(fake, run_id=run_id, tenant=tenant)  # type: ignore[arg-type]
            with pytest.raises(AttachmentDenied):
                await sandbox.search_attachment(fake, "z", run_id=run_id, tenant=tenant)  # type: ignore[arg-type]
            assert label  # each case named for the failure report
        # A ledger scoped to one slot refuses another execution's handle of the same run.
        second = await sandbox.run("print(1)", profile=PROFILE, run_id="run-a", tenant="acme")
        assert second.stdout_info.attachment is not None
        with pytest.raises(AttachmentDenied):
            await sandbox.attachments.read(
                second.stdout_info.attachment, tenant="acme", run_id="run-a", slot=slot
            )


async def test_blob_addresses_fold_in_tenant_and_run(tmp_path: Path) -> None:
    store = FilesystemBlobStore(tmp_path / "blobs")
    await store.put(BlobAddress("acme", "run-a", "k"), b"acme bytes")
    assert await store.read(BlobAddress("acme", "run-a", "k")) == b"acme bytes"
    for foreign in (BlobAddress("globex", "run-a", "k"), BlobAddress("acme", "run-b", "k")):
        with pytest.raises(BlobNotFound):
            await store.read(foreign)


async def test_pattern_search_cannot_hang_the_host() -> None:
    ledger = AttachmentLedger()
    slot = ledger.new_slot("t", "r")
    attachment, _ = await ledger.keep(
        tenant="t",
        run_id="r",
        slot=slot,
        name="stdout",
        kind="stream",
        data=b"a" * 30 + b"!",
        policy=OutputPolicy(),
    )
    from psych_sandbox_core._output import pattern_search

    with pytest.raises(PatternSearchError, match="did not finish"):
        await pattern_search.search_bytes(b"a" * 30 + b"!", r"(a+)+$", deadline_seconds=1.0)
    with pytest.raises(PatternSearchError, match="invalid pattern"):
        await ledger.search(attachment.handle, "(", tenant="t", run_id="r")
    found = await ledger.search(attachment.handle, "a{3}", tenant="t", run_id="r", max_matches=2)
    assert found.total_matches == 10 and len(found.matches) == 2


async def test_window_arguments_are_checked() -> None:
    ledger = AttachmentLedger()
    slot = ledger.new_slot("t", "r")
    attachment, _ = await ledger.keep(
        tenant="t",
        run_id="r",
        slot=slot,
        name="stdout",
        kind="stream",
        data=b"abc",
        policy=OutputPolicy(),
    )
    with pytest.raises(ValueError, match="offset"):
        await ledger.read(attachment.handle, tenant="t", run_id="r", offset=-1)
    window = await ledger.read(attachment.handle, tenant="t", run_id="r", offset=10)
    assert window.data == b"" and window.eof
    ledger.forget("t", "r")
    with pytest.raises(AttachmentDenied):
        await ledger.read(attachment.handle, tenant="t", run_id="r")
