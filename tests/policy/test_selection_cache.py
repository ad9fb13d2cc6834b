"""default's choice remembered across processes (selection_cache.py): used only while it is
current, private and well formed; never trusted for a level; forgotten when an execution
shows it wrong, and chosen again before the program runs when its backend no longer starts.

Whether a choice was made afresh is judged by counting trial executions (the only way
``default`` chooses), and by the file the CLI leaves in its state directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest

from psych_sandbox_core._api.sandbox import Sandbox
from psych_sandbox_core._policy import trials as trials_module
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_core._policy.selection import Candidate, Selection
from psych_sandbox_core._policy.selection_cache import FILE_NAME, SelectionCache
from psych_sandbox_core.backends.subprocess import SubprocessBackend
from psych_sandbox_core.cli.visible import SUMMARY_MARK
from psych_sandbox_core.errors import ErrorKind
from psych_sandbox_core.grading import Level
from psych_sandbox_core.kit.backend import Backend, BackendUnavailable, Launched, LaunchRequest
from psych_sandbox_core.kit.hookspecs import hookimpl

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def trials(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every trial execution this process runs from now on, by backend id; nothing
    remembered in-process, so each choice not read from a file is made by trials."""
    seen: list[str] = []
    real = trials_module.trial

    async def counted(registry: BackendRegistry, backend_id: str) -> str | None:
        seen.append(backend_id)
        return await real(registry, backend_id)

    monkeypatch.setattr(trials_module, "trial", counted)
    monkeypatch.setattr(trials_module, "_SELECTED", {})
    monkeypatch.setattr(trials_module, "_TRIALS", {})
    yield seen


@pytest.fixture
def state(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    return directory


def _with(*backends: type[Backend]) -> BackendRegistry:
    """The installed backends plus ``backends``, registered in-process."""
    registry = BackendRegistry()
    for cls in backends:

        class Plugin:
            @staticmethod
            @hookimpl
            def psych_sandbox_register_backends(registry: Any, cls: Any = cls) -> None:
                registry.add(cls)

        registry.register_plugin(Plugin(), f"test-{cls.id}", "someone-elses-backend", "1.0")
    return registry


class NoLongerStarts(Backend):
    """Worked when it was chosen; now its launch fails before any child exists."""

    id: ClassVar[str] = "nolongerstarts"
    claims: ClassVar[Level] = Level.ISOLATED
    launches: ClassVar[int] = 0

    def unavailable_reason(self) -> str | None:
        return None

    @asynccontextmanager
    async def launch(self, request: LaunchRequest) -> AsyncIterator[Launched]:
        type(self).launches += 1
        raise BackendUnavailable("its engine went away")
        yield  # pragma: no cover - an async generator that never yields


class Overclaims(SubprocessBackend):
    """Starts, but its report reaches less than the level it claims."""

    id: ClassVar[str] = "overclaims"
    claims: ClassVar[Level] = Level.ISOLATED


def _remember(cache: SelectionCache, registry: BackendRegistry, backend_id: str) -> None:
    claims = Level(registry.get(backend_id).cls.claims)
    chosen = Candidate(backend_id, claims, "third-party")
    cache.store(registry, (), Selection(chosen, (chosen,)))


async def _run(registry: BackendRegistry, cache: SelectionCache, source: str = "print(1)") -> Any:
    async with Sandbox(registry=registry, selection_cache=cache) as box:
        return await box.run(source)


async def test_a_fresh_choice_is_remembered_and_then_used_without_trials(
    state: Path, trials: list[str]
) -> None:
    cache = SelectionCache(str(state))
    first = await _run(BackendRegistry(), cache)
    assert first.error is None, first.error
    assert trials and trials[-1] == first.backend.id
    path = state / FILE_NAME
    assert (path.stat().st_mode & 0o777) == 0o600
    trials.clear()
    second = await _run(BackendRegistry(), cache)
    assert second.error is None, second.error
    assert trials == [] and second.backend.id == first.backend.id
    # The execution's own report decides its level, as on every run.
    assert second.level == first.level and second.grades == first.grades


def _tamper(path: Path, change: Any) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


STALE_OR_FORGED = {
    "expired": lambda p: _tamper(p, lambda r: r.update(created=time.time() - 301)),
    "from-the-future": lambda p: _tamper(p, lambda r: r.update(created=time.time() + 60)),
    "other-plugins": lambda p: _tamper(p, lambda r: r["key"][-1].append(["x", "y", "z", "1"])),
    "other-format": lambda p: _tamper(p, lambda r: r.update(format=0)),
    "forged-claims": lambda p: _tamper(p, lambda r: r["order"][0].__setitem__(1, "none")),
    "chosen-out-of-range": lambda p: _tamper(p, lambda r: r.update(chosen=5)),
    "skipped-after-chosen": lambda p: _tamper(p, lambda r: r.update(skipped=[[0, "x"]])),
    "not-json": lambda p: p.write_text("{"),
    "group-writable": lambda p: p.chmod(0o620),
    "someone-elses": lambda p: os.chown(p, 65534, 65534),
    "a-link": lambda p: (p.rename(p.with_suffix(".real")), p.symlink_to(p.with_suffix(".real"))),
    "too-large": lambda p: p.write_text(" " * (64 * 1024 + 1)),
    "open-directory": lambda p: p.parent.chmod(0o777),
}


@pytest.mark.parametrize("damage", list(STALE_OR_FORGED), ids=list(STALE_OR_FORGED))
async def test_a_stale_or_untrusted_file_is_ignored_and_replaced(
    state: Path, trials: list[str], damage: str
) -> None:
    if damage == "someone-elses" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    cache = SelectionCache(str(state))
    registry = BackendRegistry()
    # A choice no trial would make here: remembered, it would be used without one.
    _remember(cache, registry, "subprocess")
    control = cache.load(BackendRegistry(), ())
    assert control is not None and control.chosen.backend_id == "subprocess"
    STALE_OR_FORGED[damage](state / FILE_NAME)
    if damage != "forged-claims":  # well formed: the Sandbox checks it against the backend
        assert cache.load(BackendRegistry(), ()) is None
    result = await _run(BackendRegistry(), cache)
    assert result.error is None, result.error
    assert trials, "the choice was not made afresh"
    assert trials[-1] == result.backend.id


async def test_a_choice_is_not_used_under_another_path(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = SelectionCache(str(state))
    _remember(cache, BackendRegistry(), "subprocess")
    assert cache.load(BackendRegistry(), ()) is not None
    monkeypatch.setenv("PATH", "/nonexistent")
    assert cache.load(BackendRegistry(), ()) is None
    monkeypatch.undo()
    assert cache.load(BackendRegistry(), ("subprocess",)) is None  # another preference


async def test_a_remembered_backend_that_no_longer_starts_is_chosen_again_before_the_program(
    state: Path, trials: list[str]
) -> None:
    cache = SelectionCache(str(state))
    registry = _with(NoLongerStarts)
    _remember(cache, registry, NoLongerStarts.id)
    NoLongerStarts.launches = 0
    result = await _run(registry, cache, "print('ran')")
    # Its launch failed before any child existed; the program ran once, on a fresh choice
    # made by trials (where the first-party backends come first).
    assert NoLongerStarts.launches == 1
    assert result.error is None, result.error
    assert result.stdout == "ran\n"
    assert result.backend.id != NoLongerStarts.id
    assert trials and trials[-1] == result.backend.id
    remembered = cache.load(registry, ())
    assert remembered is not None and remembered.chosen.backend_id == result.backend.id


async def test_a_remembered_backend_that_reports_less_than_it_claims_is_forgotten(
    state: Path, trials: list[str]
) -> None:
    cache = SelectionCache(str(state))
    registry = _with(Overclaims)
    _remember(cache, registry, Overclaims.id)
    result = await _run(registry, cache, "print('ran')")
    # Refused before the program ran, as the host refuses any report below the claim; the
    # result says so, and the next run chooses again.
    assert result.error is not None
    assert result.error.kind is ErrorKind.ISOLATION_UNAVAILABLE
    assert result.stdout == "" and result.backend.id == Overclaims.id
    assert trials == []
    assert not (state / FILE_NAME).exists()


def test_the_command_remembers_its_choice_in_a_private_state_directory(tmp_path: Path) -> None:
    program = tmp_path / "p.py"
    program.write_text("print(1)\n")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("PSYCH_SANDBOX_CONFIG", None)

    def run() -> str:
        completed = subprocess.run(
            [sys.executable, "-m", "psych_sandbox_core", "run", str(program)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        assert completed.returncode == 0, completed
        (report,) = [line for line in completed.stdout.splitlines() if "· backend " in line]
        assert report.startswith(SUMMARY_MARK)
        return report.split("· backend ")[1].split(" ")[0]

    first = run()
    path = tmp_path / "state" / "psych-sandbox" / FILE_NAME
    record = json.loads(path.read_text())
    assert (path.parent.stat().st_mode & 0o777) == 0o700
    assert (path.stat().st_mode & 0o777) == 0o600
    assert record["order"][record["chosen"]][0] == first
    second = run()
    # Chosen once: the second run used the record the first left, unchanged.
    assert second == first
    assert json.loads(path.read_text()) == record
