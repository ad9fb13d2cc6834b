"""The shared conformance suite asks each backend exactly what its test class declares: the
tests of a mechanism are inherited where it is claimed and absent where it is not, and a
subclass of a subclass is judged by its own declarations."""

from __future__ import annotations

from psych_sandbox_testing.conformance import BackendConformance, gated_tests

FILESYSTEM = {
    "test_host_files_and_service_sockets_out_of_reach",
    "test_writes_outside_the_workspace_impossible",
    "test_host_processes_invisible",
}
CHANNEL_ARTIFACTS = {
    "test_files_come_back_over_the_channel_with_digest_and_type",
    "test_artifact_caps_and_folder_hold_over_the_channel",
    "test_a_run_killed_before_sending_says_nothing_was_collected",
}
IDENTITY = {
    "test_identity_seen_from_the_host",
    "test_two_running_executions_run_as_distinct_uids",
    "test_a_program_in_another_execution_cannot_read_a_running_workspace",
    "test_state_planted_under_the_uid_is_gone_from_the_host",
    "test_fork_bomb_bounded_with_the_host_responsive",
}
SHARED_IDENTITY = {"test_with_one_shared_identity_a_host_program_does_read_it"}
CAPPED = {"test_memory_backed_filesystems_stop_at_their_caps"}
COMMANDS = {
    "test_a_command_runs_where_a_program_runs",
    "test_a_command_past_its_wall_clock_is_killed_with_its_whole_tree",
    "test_a_string_is_run_by_a_shell_only_when_asked",
}
GATED = FILESYSTEM | CHANNEL_ARTIFACTS | IDENTITY | SHARED_IDENTITY | CAPPED | COMMANDS


def inherited(cls: type[BackendConformance]) -> set[str]:
    return {name for name in dir(cls) if name.startswith("test_") and getattr(cls, name)}


def test_every_gated_test_is_known_here() -> None:
    # Across the suite's modules: each theme's gated tests are found.
    assert set(gated_tests()) == GATED


class _Plain(BackendConformance):
    backend = "plain"
    level = "process"


class _Isolating(BackendConformance):
    backend = "isolating"
    level = "isolated"
    enforced = frozenset({"filesystem", "network", "process_tree", "identity"})
    workspace_on_host = False
    workspace_path = "/workspace"
    capped_filesystems = True
    shared_identity = ({"host_uid": 65534, "host_gid": 65534}, (65534, 65534))
    runs_commands = True


class _UserSpaceKernel(_Isolating):
    processes_visible = False


class _BackOnHost(_UserSpaceKernel):
    processes_visible = True
    workspace_on_host = True


def test_a_backend_claiming_nothing_is_asked_about_nothing_it_lacks() -> None:
    ungated = inherited(_Plain)
    assert not ungated & GATED
    assert "test_prints_and_returns_at_the_declared_level" in ungated
    assert "test_memory_bomb_is_a_memory_limit" in ungated


def test_a_backend_claiming_every_mechanism_is_asked_about_each() -> None:
    assert inherited(_Isolating) == inherited(_Plain) | GATED


def test_processes_out_of_the_hosts_sight_drop_the_host_side_inspections() -> None:
    dropped = {
        "test_host_processes_invisible",
        "test_identity_seen_from_the_host",
        "test_two_running_executions_run_as_distinct_uids",
        "test_a_program_in_another_execution_cannot_read_a_running_workspace",
        "test_with_one_shared_identity_a_host_program_does_read_it",
    }
    assert inherited(_UserSpaceKernel) == inherited(_Isolating) - dropped
    # A further subclass is judged by its own declarations, not its parent's choice.
    assert inherited(_BackOnHost) == inherited(_Isolating) - CHANNEL_ARTIFACTS
