"""The durable run log: where a run's binding calls are counted.

The per-run call count is read from here, never accumulated in the host process: a host that
crashes and is replaced must not hand the run a fresh allowance. A call is counted at the
moment the host accepts it, before the tool runs, so a call that then failed, was refused,
was cancelled or was left dangling by a crash has spent the allowance all the same.

:class:`RunLog` is the interface; :class:`SQLiteRunLog` is the embedded default (WAL mode,
safe to share between host processes on one machine).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import anyio

if TYPE_CHECKING:
    import sqlite3  # imported by SQLiteRunLog: a run of one execution counts in memory

T = TypeVar("T")

#: How long a host waits for another process holding the log's write lock.
BUSY_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class CallEntry:
    """One accepted call as the log holds it."""

    seq: int
    run_id: str
    execution_id: str
    call_id: int
    name: str
    #: None while the call is in flight (or was left dangling by a crash).
    outcome: str | None


class RunLog(ABC):
    """Where accepted binding calls are recorded and counted, per run."""

    #: Whether the log's coroutines never suspend (it is held in this process): a call's
    #: entry is then closed without a shield, since a cancellation lands only where a
    #: coroutine suspends.
    never_suspends: ClassVar[bool] = False

    @abstractmethod
    async def begin_call(
        self, run_id: str, execution_id: str, call_id: int, name: str, run_limit: int
    ) -> int | None:
        """Atomically count one call against the run: its sequence number, or None when the
        run has already spent ``run_limit`` calls (then nothing is recorded)."""

    @abstractmethod
    async def finish_call(self, seq: int, outcome: str) -> None:
        """Record how an accepted call ended (ok, an error kind, or cancelled)."""

    @abstractmethod
    async def calls_in_run(self, run_id: str) -> int:
        """How many calls the run has spent, crashed and dangling ones included."""

    @abstractmethod
    async def entries(self, run_id: str) -> list[CallEntry]:
        """Every accepted call of the run, in the order it was accepted."""

    async def dangling(self, run_id: str) -> list[CallEntry]:
        """Accepted calls with no recorded end (a crash left them)."""
        return [entry for entry in await self.entries(run_id) if entry.outcome is None]

    async def aclose(self) -> None:  # noqa: B027 - stateless logs have nothing to release
        """Release the log's resources."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    calls INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS calls (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    call_id INTEGER NOT NULL,
    name TEXT NOT NULL,
    accepted_at REAL NOT NULL,
    outcome TEXT,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS calls_by_run ON calls (run_id, seq);
"""


class SQLiteRunLog(RunLog):
    """The embedded default: one SQLite database in WAL mode.

    ``path=":memory:"`` keeps the log in this process only (what a Sandbox uses when given
    none); a file path makes it durable across host processes. Statements run on the event
    loop when the database is free (they take microseconds) and move to a worker thread only
    when another process holds the write lock, so a busy log never stalls other executions.
    """

    def __init__(self, path: str = ":memory:") -> None:
        import sqlite3

        self.path = path
        self._lock = threading.Lock()
        # Autocommit mode: every transaction below is explicit (BEGIN IMMEDIATE), so the
        # count and the insert are one atomic step even across processes.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=0)
        with self._lock:
            self._set_timeout(BUSY_TIMEOUT_SECONDS)
            if path != ":memory:":
                self._db.execute("PRAGMA journal_mode=WAL")
                # In WAL mode NORMAL survives a process crash (what the count must survive);
                # only power loss can drop the newest commits.
                self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            self._set_timeout(0)

    def _set_timeout(self, seconds: float) -> None:
        self._db.execute(f"PRAGMA busy_timeout={int(seconds * 1000)}")

    async def _run(self, operation: Callable[[sqlite3.Connection], T]) -> T:
        import sqlite3  # (already imported by __init__)

        # Fast path: the connection is free and the database not locked by another process.
        if self._lock.acquire(blocking=False):
            try:
                return operation(self._db)
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
            finally:
                self._lock.release()

        def blocking() -> T:
            with self._lock:
                self._set_timeout(BUSY_TIMEOUT_SECONDS)
                try:
                    return operation(self._db)
                finally:
                    self._set_timeout(0)

        return await anyio.to_thread.run_sync(blocking, abandon_on_cancel=False)

    async def begin_call(
        self, run_id: str, execution_id: str, call_id: int, name: str, run_limit: int
    ) -> int | None:
        def operation(db: sqlite3.Connection) -> int | None:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("INSERT OR IGNORE INTO runs (run_id, calls) VALUES (?, 0)", (run_id,))
                counted = db.execute(
                    "UPDATE runs SET calls = calls + 1 WHERE run_id = ? AND calls < ?",
                    (run_id, run_limit),
                ).rowcount
                if not counted:
                    db.execute("COMMIT")
                    return None
                cursor = db.execute(
                    "INSERT INTO calls (run_id, execution_id, call_id, name, accepted_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (run_id, execution_id, call_id, name, time.time()),
                )
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            seq = cursor.lastrowid
            assert seq is not None
            return seq

        return await self._run(operation)

    async def finish_call(self, seq: int, outcome: str) -> None:
        def operation(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE calls SET outcome = ?, finished_at = ? WHERE seq = ?",
                (outcome, time.time(), seq),
            )

        await self._run(operation)

    async def calls_in_run(self, run_id: str) -> int:
        def operation(db: sqlite3.Connection) -> int:
            row = db.execute("SELECT calls FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            return 0 if row is None else int(row[0])

        return await self._run(operation)

    async def entries(self, run_id: str) -> list[CallEntry]:
        def operation(db: sqlite3.Connection) -> list[CallEntry]:
            rows = db.execute(
                "SELECT seq, run_id, execution_id, call_id, name, outcome FROM calls "
                "WHERE run_id = ? ORDER BY seq",
                (run_id,),
            ).fetchall()
            return [CallEntry(*row) for row in rows]

        return await self._run(operation)

    async def aclose(self) -> None:
        with self._lock:
            self._db.close()


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class MemoryRunLog(RunLog):
    """A run log held in this process only: for runs that live and die within one execution
    (no run id given), where nothing can resume them and durability would only cost time."""

    never_suspends = True

    def __init__(self) -> None:
        # seq -> [run_id, execution_id, call_id, name, outcome]: mutable, updated in place.
        self._entries: dict[int, list[Any]] = {}
        self._by_run: dict[str, list[int]] = {}
        self._counts: dict[str, int] = {}
        self._next_seq = 1

    async def begin_call(
        self, run_id: str, execution_id: str, call_id: int, name: str, run_limit: int
    ) -> int | None:
        # No await before the count is taken: on one event loop this is atomic.
        count = self._counts.get(run_id, 0)
        if count >= run_limit:
            return None
        self._counts[run_id] = count + 1
        seq = self._next_seq
        self._next_seq += 1
        self._entries[seq] = [run_id, execution_id, call_id, name, None]
        self._by_run.setdefault(run_id, []).append(seq)
        return seq

    async def finish_call(self, seq: int, outcome: str) -> None:
        entry = self._entries.get(seq)
        if entry is not None:
            entry[4] = outcome

    async def calls_in_run(self, run_id: str) -> int:
        return self._counts.get(run_id, 0)

    def forget(self, run_id: str) -> None:
        """Drop a run that is over and that nothing can resume (one execution's own): a
        long-lived host would otherwise keep every call it ever answered."""
        for seq in self._by_run.pop(run_id, []):
            self._entries.pop(seq, None)
        self._counts.pop(run_id, None)

    async def entries(self, run_id: str) -> list[CallEntry]:
        return [CallEntry(seq, *self._entries[seq]) for seq in self._by_run.get(run_id, [])]
