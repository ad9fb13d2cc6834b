"""The attachment ledger survives the host: with a blob store, a handle minted by one host
process resolves from another, with the same checks; memory holds only the recent runs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core._output.attachments import AttachmentDenied, AttachmentLedger
from psych_sandbox_core._output.blobstore import BlobAddress, BlobStore, FilesystemBlobStore
from psych_sandbox_core._output.capture import OutputPolicy

from ..conftest import FAST_LIMITS, PROFILE

pytestmark = pytest.mark.anyio

BIG = (
    "import sys\nfor i in range(2000): print(f'line {i} ' + 'z' * 50)\n"
    "print('warn', file=sys.stderr)\n42"
)

# The host that mints: a separate Python process, gone before the test reads anything.
MINT = """
import json, sys
import anyio
from psych_sandbox_core import DeploymentConfig, Sandbox
from psych_sandbox_core._output.blobstore import FilesystemBlobStore

config, root, source = sys.argv[1], sys.argv[2], sys.argv[3]

async def main() -> None:
    store = FilesystemBlobStore(root)
    async with Sandbox(DeploymentConfig.model_validate_json(config), blob_store=store) as sandbox:
        result = await sandbox.run(source, profile="test", run_id="run-a", tenant="acme")
        assert result.error is None, result.error
        print(json.dumps({a.name: [a.handle, a.stored] for a in result.attachments}))

anyio.run(main)
"""


def deployment(**output: object) -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="subprocess",
                limits=ExecutionLimits(**FAST_LIMITS, stdout_bytes=1 << 20),
                output=OutputPolicy(**output),  # type: ignore[arg-type]
            )
        }
    )


async def mint_elsewhere(tmp_path: Path, config: DeploymentConfig) -> dict[str, list[str]]:
    env = {**os.environ, "PSYCH_SANDBOX_RUN_LOG": str(tmp_path / "run-log.sqlite")}
    done = await anyio.run_process(
        [sys.executable, "-c", MINT, config.model_dump_json(), str(tmp_path / "blobs"), BIG],
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    handles: dict[str, list[str]] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return handles


async def test_a_handle_resolves_after_a_host_restart(tmp_path: Path) -> None:
    config = deployment(inline_bytes=1024)
    minted = await mint_elsewhere(tmp_path, config)
    assert minted["stdout"][1] == "blob"
    assert minted["stderr"][1] == "inline" and minted["return_value"][1] == "inline"
    store = FilesystemBlobStore(tmp_path / "blobs")
    async with Sandbox(config, blob_store=store) as sandbox:
        # Nothing in this host's memory: whatever resolves comes from the store.
        assert sandbox.attachments.handles("acme", "run-a") == []
        stdout, stderr, value = (minted[n][0] for n in ("stdout", "stderr", "return_value"))
        window = await sandbox.read_attachment(
            stdout, run_id="run-a", tenant="acme", offset=len("line 0 "), length=5
        )
        assert window.data == b"zzzzz" and window.complete and not window.eof
        assert window.kept_bytes == sum(len(f"line {i} ") + 51 for i in range(2000))
        found = await sandbox.search_attachment(
            stdout, r"line 1999 z+", run_id="run-a", tenant="acme"
        )
        assert found.total_matches == 1 and found.matches[0].match == "line 1999 " + "z" * 50
        # Inline attachments are durable too.
        assert (await sandbox.read_attachment(stderr, run_id="run-a", tenant="acme")).data == (
            b"warn\n"
        )
        assert (await sandbox.read_attachment(value, run_id="run-a", tenant="acme")).data == b"42"
        described = await sandbox.attachments.describe(value, tenant="acme", run_id="run-a")
        assert described.name == "return_value" and described.stored == "inline"


async def test_foreign_and_forged_handles_are_denied_after_a_restart(tmp_path: Path) -> None:
    config = deployment(inline_bytes=1024)
    minted = await mint_elsewhere(tmp_path, config)
    stdout, value = minted["stdout"][0], minted["return_value"][0]
    _, slot, token = stdout.split(":")
    store = FilesystemBlobStore(tmp_path / "blobs")
    async with Sandbox(config, blob_store=store) as sandbox:
        # This host mints in the same run too: a fresh slot, never the earlier host's.
        again = await sandbox.run("print(1)", profile=PROFILE, run_id="run-a", tenant="acme")
        assert again.stdout_info.attachment is not None
        assert again.stdout_info.attachment.split(":")[1] != slot
        denied: list[tuple[object, str, str]] = [
            (stdout, "run-b", "acme"),
            (stdout, "run-a", "globex"),
            (value, "run-a", "globex"),
            (f"att:{slot}:" + "A" * len(token), "run-a", "acme"),
            (f"att:x9:{token}", "run-a", "acme"),
            (f"att:{slot}-x:{token}", "run-a", "acme"),
            ("att:" + slot + ":" + token + "/../x", "run-a", "acme"),
            (stdout.encode(), "run-a", "acme"),
        ]
        for fake, run_id, tenant in denied:
            with pytest.raises(AttachmentDenied):
                await sandbox.read_attachment(fake, run_id=run_id, tenant=tenant)  # type: ignore[arg-type]
            with pytest.raises(AttachmentDenied):
                await sandbox.search_attachment(fake, "z", run_id=run_id, tenant=tenant)  # type: ignore[arg-type]
        # Narrowed to this host's slot, the earlier host's handle is not there.
        with pytest.raises(AttachmentDenied):
            await sandbox.attachments.read(
                stdout,
                tenant="acme",
                run_id="run-a",
                slot=again.stdout_info.attachment.split(":")[1],
            )
        # Its own run and tenant still work, so each denial above was the scope, not the store.
        await sandbox.read_attachment(stdout, run_id="run-a", tenant="acme")


async def test_durable_records_name_no_storage(tmp_path: Path) -> None:
    config = deployment(inline_bytes=1024)
    minted = await mint_elsewhere(tmp_path, config)
    root = tmp_path / "blobs"
    files = [p for p in root.rglob("*") if p.is_file()]
    records = []
    for path in files:
        try:
            records.append(json.loads(path.read_bytes()))
        except ValueError:
            continue  # a stream's bytes, not a record
    assert sorted(r["attachment"]["name"] for r in records) == sorted(minted)
    # The names the storage uses: its root, every file's name and folder, and the address keys.
    hidden = {str(root), str(tmp_path), "attachments/", "blobs"}
    # (File names are digests; the folder above a file's two-character fan-out is the tenant's.)
    hidden |= {p.name for p in files} | {p.parent.parent.name for p in files}
    hidden |= {BlobAddress("acme", "run-a", h).digest() for h, _ in minted.values()}
    for record in records:
        assert set(record) == {"version", "tenant", "run_id", "slot", "attachment", "inline"}
        text = json.dumps(record)
        for secret in hidden:
            assert secret not in text
    # Handles are opaque: a slot and a random token, nothing of the store.
    for handle, _ in minted.values():
        assert not any(secret in handle for secret in hidden)


class FailingStore(BlobStore):
    """A store whose every write fails, as a full or unreachable one would."""

    async def put(self, address: BlobAddress, data: bytes) -> None:
        raise OSError("store unavailable")

    async def read(self, address: BlobAddress, offset: int = 0, length: int | None = None) -> bytes:
        raise OSError("store unavailable")

    async def size(self, address: BlobAddress) -> int:
        raise OSError("store unavailable")


async def keep(ledger: AttachmentLedger, run_id: str, data: bytes = b"abc") -> str:
    slot = ledger.new_slot("t", run_id)
    attachment, _ = await ledger.keep(
        tenant="t",
        run_id=run_id,
        slot=slot,
        name="stdout",
        kind="stream",
        data=data,
        policy=OutputPolicy(inline_bytes=1024),
    )
    return attachment.handle


async def test_memory_keeps_only_recent_runs_when_records_are_durable(tmp_path: Path) -> None:
    ledger = AttachmentLedger(FilesystemBlobStore(tmp_path / "blobs"), runs_in_memory=2)
    handles = [await keep(ledger, f"r{i}", b"x" * (10 if i % 2 else 5000)) for i in range(5)]
    assert [bool(ledger.handles("t", f"r{i}")) for i in range(5)] == [False] * 3 + [True] * 2
    for i, handle in enumerate(handles):
        data = await ledger.read_all(handle, tenant="t", run_id=f"r{i}")
        assert data == b"x" * (10 if i % 2 else 5000)
    # forget frees memory; the durable record stays, under the store's own retention.
    ledger.forget("t", "r4")
    assert await ledger.read_all(handles[4], tenant="t", run_id="r4") == b"x" * 5000


async def test_records_memory_alone_holds_are_never_dropped(tmp_path: Path) -> None:
    for store in (None, FailingStore()):
        ledger = AttachmentLedger(store, runs_in_memory=1)
        handles = [await keep(ledger, f"r{i}") for i in range(4)]
        for i, handle in enumerate(handles):
            assert ledger.handles("t", f"r{i}") == [handle]
            assert await ledger.read_all(handle, tenant="t", run_id=f"r{i}") == b"abc"
        ledger.forget("t", "r0")
        with pytest.raises(AttachmentDenied):
            await ledger.read(handles[0], tenant="t", run_id="r0")


class SometimesFailingStore(FilesystemBlobStore):
    """A real store whose writes fail for the runs named in ``failing``."""

    def __init__(self, root: Path, failing: set[str]) -> None:
        super().__init__(root)
        self.failing = failing

    async def put(self, address: BlobAddress, data: bytes) -> None:
        if address.run_id in self.failing:
            raise OSError("store unavailable")
        await super().put(address, data)


async def test_eviction_passes_over_runs_memory_alone_holds(tmp_path: Path) -> None:
    # Many runs only memory holds, older than every durable one: eviction lets the durable
    # ones go oldest first, keeps every memory-only run, and never the run being written.
    volatile = {f"v{i}" for i in range(300)}
    ledger = AttachmentLedger(SometimesFailingStore(tmp_path / "blobs", volatile), runs_in_memory=3)
    kept = {run: await keep(ledger, run) for run in sorted(volatile)}
    durable = [f"d{i}" for i in range(5)]
    for run in durable:
        await keep(ledger, run)
        assert ledger.handles("t", run), "the run just written stays in memory"
    assert all(ledger.handles("t", run) == [handle] for run, handle in kept.items())
    assert [bool(ledger.handles("t", run)) for run in durable] == [False] * 4 + [True]
    # A memory-only run forgotten frees its place: the next durable runs fill it.
    for run in sorted(volatile)[:299]:
        ledger.forget("t", run)
    await keep(ledger, "d5")
    assert [bool(ledger.handles("t", run)) for run in [*durable, "d5"]] == [False] * 4 + [True] * 2
    await keep(ledger, "d6")
    assert [bool(ledger.handles("t", run)) for run in ["d4", "d5", "d6"]] == [False, True, True]


async def test_a_damaged_or_moved_record_is_denied(tmp_path: Path) -> None:
    store = FilesystemBlobStore(tmp_path / "blobs")
    handle = await keep(AttachmentLedger(store), "r1")
    fresh = AttachmentLedger(store)
    assert await fresh.read_all(handle, tenant="t", run_id="r1") == b"abc"
    key = f"attachments/record/{handle}"
    record = await store.read(BlobAddress("t", "r1", key))
    # The same record planted under another run: refused, it names the run it belongs to.
    await store.put(BlobAddress("t", "r2", key), record)
    with pytest.raises(AttachmentDenied):
        await fresh.read(handle, tenant="t", run_id="r2")
    await store.put(BlobAddress("t", "r1", key), b"{not json")
    with pytest.raises(AttachmentDenied):
        await fresh.read(handle, tenant="t", run_id="r1")


def test_runs_in_memory_is_checked() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="runs_in_memory"):
            AttachmentLedger(runs_in_memory=bad)  # type: ignore[arg-type]
