"""Programs that need libraries, under bwrap: the profile's environment is bound read-only
at its own path with the interpreter it leads to, the program imports from it, cannot change
it (judged from the host), and a matplotlib chart comes back as an artifact. Environments are
built by the tests from this host, without network (see psych_sandbox_testing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from bwrap_support import FAST_LIMITS, PROFILE, requires_bwrap
from psych_sandbox_core import (
    ConfigurationError,
    DeploymentConfig,
    ErrorKind,
    ExecutionLimits,
    OutputPolicy,
    ProfileConfig,
    Sandbox,
)
from psych_sandbox_testing.environments import (
    IMPORT_TINY,
    MATPLOTLIB_CHART,
    TAMPER_WITH,
    TINY_ANSWER,
    TINY_MODULE,
    TINY_VERSION,
    base_interpreter,
    chart_bytes,
    copy_distributions,
    site_packages,
    tree_state,
    virtual_environment,
    write_distribution,
)

from psych_sandbox_bwrap.backend import BwrapBackend, BwrapOptions

BASE = base_interpreter()
pytestmark = [
    requires_bwrap,
    pytest.mark.anyio,
    pytest.mark.skipif(
        BASE is None,
        reason="no system interpreter of this host's Python version that any uid can run, "
        "to build an environment from",
    ),
]


def sandbox(environment: Path | str | None) -> Sandbox:
    options = {} if environment is None else {"environment": str(environment)}
    profile = ProfileConfig(
        backend="bwrap",
        options=options,
        limits=ExecutionLimits(**FAST_LIMITS),
        output=OutputPolicy(inline_bytes=4 << 20),
    )
    return Sandbox(DeploymentConfig(profiles={PROFILE: profile}))


@pytest.fixture(scope="module")
def tiny_environment() -> Iterator[Path]:
    assert BASE is not None
    with virtual_environment(BASE) as environment:
        write_distribution(site_packages(environment))
        yield environment


async def test_a_program_imports_from_the_bound_environment(tiny_environment: Path) -> None:
    async with sandbox(tiny_environment) as box:
        result = await box.run(IMPORT_TINY, profile=PROFILE)
    assert result.error is None, result.error
    assert result.return_value == [TINY_ANSWER, TINY_VERSION]
    assert result.level == "isolated"
    # Control: without the environment the library is not there.
    async with sandbox(None) as box:
        bare = await box.run(IMPORT_TINY, profile=PROFILE)
    assert bare.error is not None and bare.error.kind is ErrorKind.EXCEPTION
    assert bare.error.exception_type == "ModuleNotFoundError"


async def test_the_environment_is_bound_read_only() -> None:
    # Writable by anyone on the host: only the read-only bind can refuse the changes.
    assert BASE is not None
    with virtual_environment(BASE) as environment:
        site = site_packages(environment)
        write_distribution(site)
        for path in (site, site / TINY_MODULE, site / TINY_MODULE / "__init__.py"):
            path.chmod(0o777)
        before = tree_state(environment)
        async with sandbox(environment) as box:
            result = await box.run(TAMPER_WITH, profile=PROFILE)
        assert result.error is None, result.error
        assert result.return_value == ["EROFS"] * 4, result.return_value
        assert tree_state(environment) == before


async def test_nothing_else_of_the_environments_parent_is_bound(tiny_environment: Path) -> None:
    # The environment is bound alone: a file beside it on the host is not in the sandbox.
    beside = tiny_environment.parent / "beside.txt"
    beside.write_text("host file next to the environment\n")
    beside.chmod(0o644)
    try:
        source = f"import os\nos.path.exists({str(beside)!r})"
        async with sandbox(tiny_environment) as box:
            result = await box.run(source, profile=PROFILE)
    finally:
        beside.unlink()
    assert result.error is None, result.error
    assert result.return_value is False


async def test_a_matplotlib_chart_comes_back_as_an_artifact() -> None:
    assert BASE is not None
    with virtual_environment(BASE) as environment:
        copy_distributions(site_packages(environment), ["matplotlib"])
        async with sandbox(environment) as box:
            result = await box.run(MATPLOTLIB_CHART, profile=PROFILE)
            await chart_bytes(box, result)


def test_an_environment_the_sandbox_mounts_over_is_refused() -> None:
    # Under /tmp, which the sandbox mounts a tmpfs of its own over: it would not be there.
    assert BASE is not None
    with (
        virtual_environment(BASE, parent="/tmp") as environment,
        pytest.raises(ConfigurationError, match="under /tmp, which the sandbox mounts"),
    ):
        BwrapBackend(BwrapOptions(environment=str(environment)))
