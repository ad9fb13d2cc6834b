"""What a profile's programs can import beyond the standard library.

Found by running a listing program under the profile, so the answer is the sandbox's own view
(a configured environment, a container image's packages), never a guess from the host. Behind
the libraries section of ``psych-sandbox doctor``.
"""

from __future__ import annotations

from typing import Any

from .._policy.profiles import DeploymentConfig
from .._policy.registry import BackendRegistry
from ..errors import SandboxError

#: How many distributions and modules a listing keeps: a science environment has a few
#: hundred modules, and the report is for a person.
MAX_LISTED = 200
#: How many of each the text report shows per profile.
SHOWN = 20
#: Longest name or version kept (the environment's metadata is not ours).
MAX_NAME_CHARS = 100

LISTING_PROGRAM = f"""
import importlib.metadata, os, pkgutil, sys
versions = {{}}
for distribution in importlib.metadata.distributions():
    name = distribution.metadata["Name"]
    if name:
        versions.setdefault(name, distribution.version)
standard = set(sys.stdlib_module_names)
# The standard library's directory (lib-dynload is below it) also holds modules the names
# above leave out (test, xxlimited, a distribution's sitecustomize): not libraries.
standard_dir = os.path.realpath(os.path.dirname(os.__file__))
libraries = [
    entry for entry in sys.path
    if entry and not (os.path.realpath(entry) + os.sep).startswith(standard_dir + os.sep)
]
modules = sorted({{
    module.name for module in pkgutil.iter_modules(libraries)
    if module.name not in standard and not module.name.startswith("_")
}})
names = sorted(versions, key=str.lower)
{{
    "python": sys.version.split()[0],
    "distributions": [[name, versions[name]] for name in names[:{MAX_LISTED}]],
    "distribution_count": len(names),
    "modules": modules[:{MAX_LISTED}],
    "module_count": len(modules),
}}
"""


def _text(value: object) -> str:
    """A name from the listing, printable and bounded."""
    text = "".join(c for c in str(value) if c.isprintable())
    return text[:MAX_NAME_CHARS]


def _checked(value: object) -> dict[str, Any]:
    """The listing program's return value, reduced to the shape the report shows."""
    if not isinstance(value, dict):
        return {"error": "the listing program returned no listing"}
    distributions = [
        [_text(item[0]), _text(item[1])]
        for item in value.get("distributions", [])[:MAX_LISTED]
        if isinstance(item, list) and len(item) == 2
    ]
    modules = [_text(item) for item in value.get("modules", [])[:MAX_LISTED]]
    counts = {
        key: value.get(key) if isinstance(value.get(key), int) else 0
        for key in ("distribution_count", "module_count")
    }
    return {
        "python": _text(value.get("python", "")),
        "distributions": distributions,
        "modules": modules,
        **counts,
    }


async def list_libraries(
    config: DeploymentConfig,
    registry: BackendRegistry,
    profiles: list[dict[str, Any]],
    working: set[str],
) -> dict[str, dict[str, Any]]:
    """For each profile row (see doctor.profile_table) whose backend works here, what a
    program under it can import; profiles with the same backend and options share one run,
    and the runs go side by side (a cold container start is most of each)."""
    import anyio

    from .._api.sandbox import Sandbox

    runs: dict[str, str] = {}
    for row in profiles:
        if row["backend"] is not None and row["backend"] in working:
            runs.setdefault(repr((row["backend"], sorted(row["options"].items()))), row["name"])
    found: dict[str, dict[str, Any]] = {}

    async def listing(sandbox: Sandbox, key: str, profile: str) -> None:
        try:
            result = await sandbox.run(LISTING_PROGRAM, profile=profile)
        except SandboxError as exc:
            found[key] = {"error": f"not listed: {exc}"}
            return
        if result.error is not None:
            found[key] = {"error": f"not listed: {result.error.kind.value}: {result.error.message}"}
        else:
            found[key] = _checked(result.return_value)

    async with Sandbox(config, registry=registry) as sandbox, anyio.create_task_group() as tg:
        for key, profile in runs.items():
            tg.start_soon(listing, sandbox, key, profile)
    listings: dict[str, dict[str, Any]] = {}
    for row in profiles:
        key = repr((row["backend"], sorted(row["options"].items())))
        listings[row["name"]] = found.get(key, {"error": "not listed: no working backend"})
    return listings


def format_libraries(listings: dict[str, dict[str, Any]]) -> list[str]:
    """The doctor's libraries section, a few lines per profile."""
    lines = ["Libraries (what a program can import beyond the standard library):"]
    for name, listing in listings.items():
        if "error" in listing:
            lines.append(f"  {name:<16} {listing['error']}")
            continue
        distributions = listing["distributions"]
        if not distributions and not listing["modules"]:
            lines.append(f"  {name:<16} Python {listing['python']}: the standard library only")
            continue
        shown = ", ".join(f"{n} {v}" for n, v in distributions[:SHOWN])
        more = listing["distribution_count"] - min(len(distributions), SHOWN)
        lines.append(
            f"  {name:<16} Python {listing['python']}: {listing['distribution_count']} "
            f"distribution(s): {shown or '-'}" + (f" and {more} more" if more > 0 else "")
        )
        modules = listing["modules"]
        more = listing["module_count"] - min(len(modules), SHOWN)
        lines.append(
            f"  {'':<16} modules: {', '.join(modules[:SHOWN]) or '-'}"
            + (f" and {more} more" if more > 0 else "")
        )
    return lines
