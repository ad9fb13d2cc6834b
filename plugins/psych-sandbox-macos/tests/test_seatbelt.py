"""The generated seatbelt profile: golden files for its exact text, and properties that hold
for every policy the generator accepts, judged by reading the profile as seatbelt does
(sbpl.py): no path outside the workspace and temporary directory is writable, the named
subtrees are unreadable, and no network operation is ever allowed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from psych_sandbox_core import ConfigurationError
from sbpl import allowed, rules

from psych_sandbox_macos.seatbelt import (
    DENIED_READS,
    PROTECTED,
    WRITABLE_DEVICES,
    SeatbeltPolicy,
    generate,
)

GOLDEN = Path(__file__).resolve().parent / "golden"
#: Set to rewrite the golden files from the generator (then review the diff).
UPDATE = os.environ.get("PSYCH_SANDBOX_UPDATE_GOLDEN") == "1"

#: Operations the profile must never allow, whatever the policy.
NETWORK_OPERATIONS = ("network-outbound", "network-inbound", "network-bind", "network*")
WRITE_OPERATIONS = (
    "file-write-data",
    "file-write-create",
    "file-write-unlink",
    "file-write-mode",
    "file-write-xattr",
    "file-write-flags",
)

GOLDEN_POLICIES = {
    # The backend's shape on a CI runner: workspace doubling as TMPDIR under the user's
    # temporary root, the interpreter under the runner's home.
    "runner": SeatbeltPolicy(
        workspace="/private/var/folders/x1/abc/T/psych-ws-k2j3",
        temp="/private/var/folders/x1/abc/T/psych-ws-k2j3",
        read_roots=(
            "/Users/runner/hostedtoolcache/Python/3.12.7/x64",
            "/Users/runner/hostedtoolcache/Python/3.12.7/x64/bin",
        ),
    ),
    # A system interpreter, a separate temporary directory, no read roots.
    "system": SeatbeltPolicy(workspace="/srv/psych/ws-1", temp="/srv/psych/tmp-1"),
}


def _check_golden(name: str, text: str, parameters: dict[str, str]) -> None:
    profile_file = GOLDEN / f"{name}.sb"
    parameters_file = GOLDEN / f"{name}.parameters.json"
    encoded = json.dumps(parameters, indent=2, sort_keys=True) + "\n"
    if UPDATE:
        profile_file.write_text(text)
        parameters_file.write_text(encoded)
    assert text == profile_file.read_text(), (
        f"{profile_file.name} differs; if intended, rerun with PSYCH_SANDBOX_UPDATE_GOLDEN=1"
    )
    assert encoded == parameters_file.read_text()


@pytest.mark.parametrize("name", sorted(GOLDEN_POLICIES))
def test_profile_matches_its_golden_file(name: str) -> None:
    profile = generate(GOLDEN_POLICIES[name])
    _check_golden(name, profile.text, profile.parameters)


def test_paths_travel_as_parameters_never_in_the_text() -> None:
    policy = GOLDEN_POLICIES["runner"]
    profile = generate(policy)
    for path in (policy.workspace, *policy.read_roots, *policy.denied_reads):
        assert path not in profile.text
    arguments = profile.sandbox_exec_arguments()
    assert arguments[:2] == ["-p", profile.text]
    assert f"OWN_0={policy.workspace}" in arguments


def test_the_golden_profile_read_as_seatbelt_does() -> None:
    """What the properties below check for every policy, spelt out once on a known one."""
    policy = GOLDEN_POLICIES["runner"]
    profile = generate(policy)
    text, params = profile.text, profile.parameters
    ws = policy.workspace
    assert allowed(text, params, "file-write-create", ws + "/out.csv")
    assert allowed(text, params, "file-read-data", ws + "/out.csv")
    assert not allowed(text, params, "file-write-create", ws + "x/out.csv")
    assert not allowed(text, params, "file-write-data", "/Users/runner/.zshrc")
    assert not allowed(text, params, "file-read-data", "/Users/runner/.ssh/id_ed25519")
    # The host's own temporary files (the canary lives there) are out of reach.
    assert not allowed(text, params, "file-read-data", "/private/var/folders/x1/abc/T/canary")
    # The directories on the way to the workspace can be looked up, not listed.
    assert allowed(text, params, "file-read-metadata", "/private/var/folders/x1/abc/T")
    assert not allowed(text, params, "file-read-data", "/private/var/folders/x1/abc/T")
    assert allowed(
        text,
        params,
        "file-read-data",
        "/Users/runner/hostedtoolcache/Python/3.12.7/x64/lib/python3.12/os.py",
    )
    assert not allowed(
        text,
        params,
        "file-write-data",
        "/Users/runner/hostedtoolcache/Python/3.12.7/x64/lib/python3.12/os.py",
    )
    assert allowed(text, params, "file-read-data", "/usr/lib/libSystem.B.dylib")
    assert allowed(text, params, "file-write-data", "/dev/null")
    assert not allowed(text, params, "file-write-data", "/dev/disk0")
    assert allowed(text, params, "process-fork")
    for operation in NETWORK_OPERATIONS:
        assert not allowed(text, params, operation)


# ---------------------------------------------------------------- properties

#: Path segments, including the characters that would break a profile if paths were spliced
#: into its text (quotes, parentheses, semicolons, backslashes) and non-ASCII ones.
SEGMENT = st.text(
    alphabet=st.sampled_from([*"abcxyz019._- \"'()\\;#é∂", "\u202e"]),
    min_size=1,
    max_size=8,
).filter(lambda s: s not in (".", ".."))
TOPS = st.sampled_from(
    ["/private/var/folders", "/Users", "/opt", "/srv", "/srv/a", "/Volumes", "/tmp2"]
)


@st.composite
def absolute_paths(draw: st.DrawFn) -> str:
    top = draw(TOPS)
    return top + "".join("/" + s for s in draw(st.lists(SEGMENT, min_size=1, max_size=4)))


@st.composite
def policies(draw: st.DrawFn) -> SeatbeltPolicy:
    workspace = draw(absolute_paths())
    temp = draw(st.one_of(st.just(workspace), absolute_paths()))
    read_roots = tuple(draw(st.lists(absolute_paths(), max_size=3)))
    denied = draw(
        st.one_of(
            st.just(DENIED_READS),
            st.lists(
                st.sampled_from([*DENIED_READS, "/srv/secret", "/srv/a/keys"]), max_size=5
            ).map(tuple),
        )
    )
    return SeatbeltPolicy(
        workspace=workspace, temp=temp, read_roots=read_roots, denied_reads=denied
    )


@st.composite
def probe_paths(draw: st.DrawFn, policy: SeatbeltPolicy) -> str:
    """Paths near the policy's own: inside, beside (a shared prefix), above, or anywhere."""
    base = draw(st.sampled_from([policy.workspace, policy.temp, *policy.read_roots]))
    return draw(
        st.one_of(
            st.just(base),
            st.builds(lambda s: base + "/" + s, SEGMENT),
            st.builds(lambda s: base + s, SEGMENT),
            st.just(os.path.dirname(base)),
            absolute_paths(),
            st.sampled_from([*PROTECTED, *DENIED_READS, "/", "/etc/passwd", "/dev/null"]),
        )
    )


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")


@settings(max_examples=300, deadline=None)
@given(data=st.data(), policy=policies())
def test_nothing_outside_the_workspace_and_temp_becomes_writable(
    data: st.DataObject, policy: SeatbeltPolicy
) -> None:
    try:
        profile = generate(policy)
    except ConfigurationError:
        return  # refused outright: nothing becomes writable
    path = data.draw(probe_paths(policy))
    for operation in WRITE_OPERATIONS:
        if allowed(profile.text, profile.parameters, operation, path):
            assert (
                _inside(path, policy.workspace)
                or _inside(path, policy.temp)
                or (operation == "file-write-data" and path in WRITABLE_DEVICES)
            ), (operation, path)
    # And what must be writable is (a profile that allowed nothing would pass the above).
    assert allowed(profile.text, profile.parameters, "file-write-create", policy.workspace + "/f")
    assert allowed(profile.text, profile.parameters, "file-write-create", policy.temp + "/f")


@settings(max_examples=300, deadline=None)
@given(data=st.data(), policy=policies())
def test_denied_subtrees_are_unreadable_except_the_policy_s_own(
    data: st.DataObject, policy: SeatbeltPolicy
) -> None:
    try:
        profile = generate(policy)
    except ConfigurationError:
        return
    path = data.draw(probe_paths(policy))
    readable = allowed(profile.text, profile.parameters, "file-read-data", path)
    under_denied = any(_inside(path, d) for d in policy.denied_reads)
    own = any(_inside(path, r) for r in (policy.workspace, policy.temp, *policy.read_roots))
    if under_denied and not own:
        assert not readable, path
    if not under_denied or own:
        assert readable, path


@settings(max_examples=200, deadline=None)
@given(policy=policies())
def test_network_is_always_denied(policy: SeatbeltPolicy) -> None:
    try:
        profile = generate(policy)
    except ConfigurationError:
        return
    parsed = rules(profile.text, profile.parameters)
    assert not any(r.allow and r.operation.startswith("network") for r in parsed)
    assert parsed[-1].operation == "network*" and not parsed[-1].allow
    for operation in NETWORK_OPERATIONS:
        assert not allowed(profile.text, profile.parameters, operation)


@settings(max_examples=300, deadline=None)
@given(
    path=st.lists(st.sampled_from([*"/ab.\n\x00\x7f\t", "//", "/..", "./"]), max_size=12).map(
        "".join
    )
)
@example(path="/")
@example(path="relative/dir")
@example(path="/a/../Users")
@example(path="/a/b/")
@example(path="/a\n(allow file-write*)")
@example(path="//a")
def test_a_path_that_is_not_absolute_normalised_and_printable_is_refused(path: str) -> None:
    normal = (
        path.startswith("/")
        and not path.startswith("//")
        and os.path.normpath(path) == path
        and not any(ord(c) < 0x20 or c == "\x7f" for c in path)
        and path != "/"
    )
    policy = SeatbeltPolicy(workspace=path, temp="/srv/psych/tmp")
    if normal:
        assert generate(policy).parameters["OWN_0"] == path
    else:
        with pytest.raises(ConfigurationError):
            generate(policy)


@pytest.mark.parametrize(
    "workspace", ["/", "/private", "/Users", "/usr/local/psych", "/System/x", "/private/var"]
)
def test_a_writable_root_over_the_system_or_a_denied_subtree_is_refused(workspace: str) -> None:
    with pytest.raises(ConfigurationError):
        generate(SeatbeltPolicy(workspace=workspace, temp="/srv/psych/tmp"))


def test_a_read_root_over_a_denied_subtree_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="denied subtree"):
        generate(SeatbeltPolicy(workspace="/srv/w", temp="/srv/w", read_roots=("/Users",)))
