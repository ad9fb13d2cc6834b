"""What this host can promise: every installed backend tried for real, and every profile.

Behind ``psych-sandbox doctor`` and ``psych-sandbox profiles``. Whether a backend works is
found by running a trivial program on it (a trial), never by looking for a binary; its level
and grades are the ones that trial earned.
"""

from __future__ import annotations

from typing import Any

from .grading import Guarantee
from .libraries import format_libraries, list_libraries
from .profiles import DEFAULT_PROFILE, DeploymentConfig, ProfileConfig
from .registry import BackendRegistry
from .sandbox import availability


def profile_table(config: DeploymentConfig, registry: BackendRegistry) -> list[dict[str, Any]]:
    """Every profile a run may name: the file's, one per installed backend, and default."""
    rows: list[dict[str, Any]] = []
    installed = registry.ids()
    names = sorted(set(config.profiles) | set(installed) | {DEFAULT_PROFILE})
    for name in names:
        profile = config.profiles.get(name)
        if profile is not None:
            source = "configuration"
        elif name == DEFAULT_PROFILE:
            profile, source = ProfileConfig(), "built in"
        else:
            profile, source = ProfileConfig(backend=name), "installed backend"
        rows.append(
            {
                "name": name,
                "backend": profile.backend,
                "source": source,
                "required_level": profile.required_level.value,
                "allow_network": profile.allow_network,
                "options": dict(profile.options),
                "limits": profile.limits.model_dump(mode="json"),
            }
        )
    return rows


async def diagnose(config: DeploymentConfig, registry: BackendRegistry) -> dict[str, Any]:
    """Try every installed backend here and say which profile would use which."""
    backends: list[dict[str, Any]] = []
    working: list[tuple[int, str]] = []
    rank = {"isolated": 0, "process": 1, "none": 2}
    for backend_id in registry.ids():
        registered = registry.get(backend_id)
        found = await availability(registry, backend_id)
        claims = registered.cls.claims.value
        backends.append(
            {
                "id": backend_id,
                "distribution": registered.distribution,
                "version": registered.version,
                "claims": claims,
                "works": found.available,
                "reason": found.reason,
                # Computed from the trial's grades by level_of, never the claim.
                "level": None if found.level is None else found.level.value,
                "grades": dict(found.grades),
            }
        )
        if found.available:
            working.append((rank[claims], backend_id))
    # The same order the default profile's selection uses: strongest claim first, and only
    # backends whose trial reached their claim.
    strongest = min(working)[1] if working else None
    profiles = profile_table(config, registry)
    for row in profiles:
        if row["backend"] is None:
            row["backend"] = strongest
            row["selected"] = "strongest working backend"
    libraries = await list_libraries(config, registry, profiles, {b for _, b in working})
    return {"backends": backends, "profiles": profiles, "libraries": libraries}


def format_doctor(report: dict[str, Any]) -> str:
    lines = ["Backends:"]
    for backend in report["backends"]:
        origin = backend["distribution"] or "in-process plugin"
        if backend["version"]:
            origin += f" {backend['version']}"
        if backend["works"]:
            state = f"works here, level {backend['level']}"
        else:
            state = f"does not work here: {backend['reason']}"
            if backend["level"]:
                state += f" (level {backend['level']})"
        lines.append(f"  {backend['id']} ({origin}; claims {backend['claims']}): {state}")
        if backend["grades"]:
            for guarantee in Guarantee:
                value = backend["grades"].get(guarantee.value)
                if value is not None:
                    lines.append(f"      {guarantee.value:<14} {value}")
    lines.append("Profiles:")
    lines.extend(_profile_line(row) for row in report["profiles"])
    lines.extend(format_libraries(report.get("libraries", {})))
    return "\n".join(lines)


def format_profiles(rows: list[dict[str, Any]]) -> str:
    return "\n".join(_profile_line(row) for row in rows)


def _profile_line(row: dict[str, Any]) -> str:
    backend = row["backend"] or "no working backend"
    if row.get("selected"):
        backend += f" ({row['selected']})"
    elif row["backend"] is None:
        backend = "the strongest backend that works here, chosen at first use"
    network = "network allowed" if row["allow_network"] else "no network"
    return (
        f"  {row['name']:<16} -> {backend}; requires {row['required_level']}; {network}; "
        f"from {row['source']}"
    )


def command_doctor(config_path: str | None, as_json: bool) -> int:
    """``psych-sandbox doctor``: exit 0 when some backend works here, 1 when none does."""
    import json

    import anyio

    from .config import resolve_config

    config = resolve_config(config_path)
    registry = BackendRegistry()
    report = anyio.run(diagnose, config, registry)
    print(json.dumps(report) if as_json else format_doctor(report))
    return 0 if any(backend["works"] for backend in report["backends"]) else 1


def command_profiles(config_path: str | None, as_json: bool) -> int:
    """``psych-sandbox profiles``: the profiles a run may name (no trials are run)."""
    import json

    from .config import resolve_config

    rows = profile_table(resolve_config(config_path), BackendRegistry())
    print(json.dumps({"profiles": rows}) if as_json else format_profiles(rows))
    return 0
