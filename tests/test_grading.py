"""Grades from mechanisms and evidence, and the one function that turns grades into a level."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from typing import Any

import pytest

import psych_sandbox_core
from psych_sandbox_core.grading import (
    ISOLATED_ENFORCED,
    PROCESS_REQUIRED,
    Grade,
    Guarantee,
    Level,
    Mechanisms,
    grade,
    level_of,
)
from psych_sandbox_core.protocol.frames import ContainmentReport

LIMITS = [{"name": n, "soft": -1, "hard": -1} for n in ("CPU", "AS", "FSIZE", "NPROC")]


def report(**overrides: Any) -> ContainmentReport:
    data: dict[str, Any] = {
        "uid": 65534,
        "euid": 65534,
        "gid": 65534,
        "pid": 2,
        "canary_readable": False,
        "network": {"ipv4": "unreachable", "ipv6": "unreachable", "interfaces_up": []},
        "limits": LIMITS,
        "capabilities": "0000000000000000",
        "sees_foreign_processes": False,
        "python": "3.11.7",
        "platform": "linux",
    }
    data.update(overrides)
    return ContainmentReport.model_validate(data)


BOUNDARY = Mechanisms(
    filesystem_boundary=True,
    network_namespace=True,
    ipc_namespace=True,
    process_tree_boundary=True,
    unprivileged_identity=True,
)


def test_a_full_boundary_with_agreeing_evidence_is_isolated() -> None:
    grades = grade(BOUNDARY, report(), host_uid=0)
    assert all(grades[g] is Grade.ENFORCED for g in ISOLATED_ENFORCED)
    assert level_of(grades) is Level.ISOLATED


def test_a_readable_canary_is_exposure_whatever_is_claimed() -> None:
    grades = grade(BOUNDARY, report(canary_readable=True), host_uid=0)
    assert grades[Guarantee.FILESYSTEM] is Grade.UNAVAILABLE
    assert level_of(grades) is Level.PROCESS


def test_an_unreadable_canary_without_a_boundary_earns_only_unverified() -> None:
    confined = Mechanisms(filesystem_confinement=True)
    assert grade(confined, report(), host_uid=0)[Guarantee.FILESYSTEM] is Grade.UNVERIFIED
    # No mechanism at all: an unreadable canary proves nothing.
    assert grade(Mechanisms(), report(), host_uid=0)[Guarantee.FILESYSTEM] is Grade.UNAVAILABLE
    # A boundary without a canary to check is requested, not proved.
    assert (
        grade(BOUNDARY, report(canary_readable=None), host_uid=0)[Guarantee.FILESYSTEM]
        is Grade.UNVERIFIED
    )


@pytest.mark.parametrize(
    "network",
    [
        {"ipv4": "connected", "ipv6": "unreachable", "interfaces_up": []},
        {"ipv4": "unreachable", "ipv6": "connected", "interfaces_up": []},
        {"ipv4": "unreachable", "ipv6": "unreachable", "interfaces_up": ["eth0"]},
    ],
)
def test_network_exposure_on_either_family_or_an_interface_wins(network: Any) -> None:
    grades = grade(BOUNDARY, report(network=network), host_uid=0)
    assert grades[Guarantee.NETWORK] is Grade.UNAVAILABLE
    assert level_of(grades) is not Level.ISOLATED


def test_an_unprobed_family_earns_only_unverified() -> None:
    network = {"ipv4": "unreachable", "ipv6": "skipped", "interfaces_up": []}
    assert (
        grade(BOUNDARY, report(network=network), host_uid=0)[Guarantee.NETWORK] is Grade.UNVERIFIED
    )


def test_identity_evidence() -> None:
    root_with_caps = report(euid=0, uid=0, capabilities="000001ffffffffff")
    assert grade(BOUNDARY, root_with_caps, host_uid=0)[Guarantee.IDENTITY] is Grade.UNAVAILABLE
    # A capability mask that is not hex is no evidence of having none (hostile input).
    garbage = report(capabilities="zz")
    assert grade(BOUNDARY, garbage, host_uid=0)[Guarantee.IDENTITY] is Grade.UNVERIFIED
    assert grade(Mechanisms(), report(), host_uid=0)[Guarantee.IDENTITY] is Grade.UNAVAILABLE


def test_missing_rlimits_are_unavailable_not_implied() -> None:
    grades = grade(Mechanisms(), report(limits=[]), host_uid=0)
    for g in (Guarantee.CPU, Guarantee.MEMORY, Guarantee.FILE_SIZE, Guarantee.PROCESS_COUNT):
        assert grades[g] is Grade.UNAVAILABLE
    assert level_of(grades) is Level.NONE


def test_level_table_exhaustively_over_the_guarantees_that_decide_it() -> None:
    deciding = sorted(ISOLATED_ENFORCED | PROCESS_REQUIRED, key=lambda g: g.value)
    for combo in itertools.product(list(Grade), repeat=len(deciding)):
        grades = {g: Grade.ENFORCED for g in Guarantee} | dict(zip(deciding, combo, strict=True))
        level = level_of(grades)
        isolated = all(grades[g] is Grade.ENFORCED for g in ISOLATED_ENFORCED) and all(
            value is not Grade.UNAVAILABLE for value in grades.values()
        )
        process = all(grades[g] is not Grade.UNAVAILABLE for g in PROCESS_REQUIRED)
        expected = Level.ISOLATED if isolated else Level.PROCESS if process else Level.NONE
        assert level is expected, grades


def test_any_unavailable_guarantee_rules_out_isolated() -> None:
    for g in Guarantee:
        grades = {x: Grade.ENFORCED for x in Guarantee}
        grades[g] = Grade.UNAVAILABLE
        assert level_of(grades) is not Level.ISOLATED
    assert level_of({}) is Level.NONE


def test_level_of_is_the_only_place_a_level_is_computed() -> None:
    """Outside grading.py, a level reported on a result comes from level_of: no code builds
    ``level=`` from anything else (a backend's ``claims`` is a claim, checked, not reported)."""
    root = Path(psych_sandbox_core.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "grading.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "level":
                text = ast.unparse(node.value)
                if "level_of(" not in text and "result.level" not in text:
                    offenders.append(f"{path.name}: level={text}")
            if isinstance(node, ast.FunctionDef) and node.name == "level_of":
                offenders.append(f"{path.name}: defines level_of")
    assert not offenders, offenders


@pytest.mark.anyio
async def test_a_real_run_reports_the_level_its_grades_earn() -> None:
    from psych_sandbox_core import Sandbox

    async with Sandbox() as box:
        result = await box.run("return 1", profile="subprocess")
    grades = {Guarantee(k): Grade(v) for k, v in result.grades.items()}
    assert set(grades) == set(Guarantee)
    assert result.level == level_of(grades).value
    # No filesystem boundary here: the canary was readable, and the grade says so.
    assert grades[Guarantee.FILESYSTEM] is Grade.UNAVAILABLE


def test_identity_without_an_ipc_namespace_is_not_enforced() -> None:
    # SysV objects outlive the execution and are shared by all: a uid of its own is not
    # isolation then.
    shared_ipc = BOUNDARY.model_copy(update={"ipc_namespace": False})
    grades = grade(shared_ipc, report(), host_uid=0)
    assert grades[Guarantee.IDENTITY] is Grade.UNVERIFIED
    assert level_of(grades) is Level.PROCESS


def test_a_reachable_supervisor_leaves_tree_and_clock_unenforced() -> None:
    reachable = BOUNDARY.model_copy(update={"supervisor_reachable": True})
    grades = grade(reachable, report(), host_uid=0)
    assert grades[Guarantee.PROCESS_TREE] is Grade.UNVERIFIED
    assert grades[Guarantee.WALL_CLOCK] is Grade.UNVERIFIED
    assert level_of(grades) is Level.PROCESS


def test_a_uid_shared_between_executions_separates_them_only_inside_namespaces() -> None:
    """A fixed uid every execution runs as (subprocess's drop_to_uid) is no boundary between
    them where nothing else keeps one out of another's files and processes."""
    shared = Mechanisms(
        network_namespace=True,
        ipc_namespace=True,
        process_tree_boundary=True,
        unprivileged_identity=True,
    )
    assert grade(shared, report(), host_uid=0)[Guarantee.IDENTITY] is Grade.UNVERIFIED
    leased = shared.model_copy(update={"exclusive_identity": True})
    assert grade(leased, report(), host_uid=0)[Guarantee.IDENTITY] is Grade.ENFORCED
    # Mount and pid namespaces around it: the shared uid reaches nothing of another's.
    assert grade(BOUNDARY, report(), host_uid=0)[Guarantee.IDENTITY] is Grade.ENFORCED


def test_caps_held_from_outside_are_enforced_unless_their_holder_is_reachable() -> None:
    """A job object's (or cgroup's) caps are the kernel's, but a program that can open the
    worker holding them can take the handle and lift them."""
    outside = Mechanisms(
        process_tree_boundary=True,
        process_group=False,
        rlimits=False,
        memory_cgroup=True,
        pids_cgroup=True,
        cpu_limit_outside=True,
    )
    no_rlimits = report(limits=[])
    grades = grade(outside, no_rlimits, host_uid=0)
    for guarantee in (Guarantee.CPU, Guarantee.MEMORY, Guarantee.PROCESS_COUNT):
        assert grades[guarantee] is Grade.ENFORCED
    assert grades[Guarantee.PROCESS_TREE] is Grade.ENFORCED
    reachable = grade(
        outside.model_copy(update={"supervisor_reachable": True}), no_rlimits, host_uid=0
    )
    for guarantee in (Guarantee.CPU, Guarantee.MEMORY, Guarantee.PROCESS_COUNT):
        assert reachable[guarantee] is Grade.UNVERIFIED
    # A tree boundary whose holder is reachable is still more than nothing.
    assert reachable[Guarantee.PROCESS_TREE] is Grade.UNVERIFIED
    # Without the CPU cap from outside and without an rlimit, CPU is not capped at all.
    no_cpu = grade(outside.model_copy(update={"cpu_limit_outside": False}), no_rlimits, host_uid=0)
    assert no_cpu[Guarantee.CPU] is Grade.UNAVAILABLE
    assert level_of(no_cpu) is Level.NONE


def test_an_address_space_limit_the_platform_ignores_caps_no_memory() -> None:
    ignored = Mechanisms(address_space_rlimit=False)
    assert grade(ignored, report(), host_uid=0)[Guarantee.MEMORY] is Grade.UNAVAILABLE
    assert grade(Mechanisms(), report(), host_uid=0)[Guarantee.MEMORY] is Grade.UNVERIFIED
