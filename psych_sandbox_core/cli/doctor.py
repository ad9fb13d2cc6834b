"""What this host can promise: every installed backend tried for real, and every profile.

Behind ``psych-sandbox doctor`` and ``psych-sandbox profiles``. Whether a backend works is
found by running a trivial program on it (a trial), never by looking for a binary; its level
and grades are the ones that trial earned. Configuration is checked by the same functions
``run`` uses (config.py, and ``default``'s selection in trials.py), so both commands report,
with the same message, everything ``run`` would refuse.
"""

from __future__ import annotations

from typing import Any

from .._policy.config import config_problems, create_backend
from .._policy.narrowing import strictest_level
from .._policy.profiles import DEFAULT_PROFILE, DeploymentConfig, ProfileConfig
from .._policy.registry import BackendRegistry
from .._policy.selection import Selection
from .._policy.trials import availability, select_default
from ..errors import ConfigurationError
from ..grading import Grade, Guarantee, Level, level_at_least
from .libraries import format_libraries, list_libraries

EXIT_OK = 0
#: Some profile (or every backend) cannot run here.
EXIT_NOT_WORKING = 1
#: The configuration has errors ``run`` would refuse.
EXIT_CONFIGURATION = 2


def _profiles(config: DeploymentConfig, registry: BackendRegistry) -> dict[str, ProfileConfig]:
    """Every profile a run may name: the file's, one per installed backend, and default."""
    profiles: dict[str, ProfileConfig] = {DEFAULT_PROFILE: ProfileConfig()}
    for backend_id in registry.ids():
        profiles[backend_id] = ProfileConfig(backend=backend_id)
    profiles.update(config.profiles)
    return dict(sorted(profiles.items()))


def profile_table(config: DeploymentConfig, registry: BackendRegistry) -> list[dict[str, Any]]:
    """Every profile, each with the configuration errors ``run`` would refuse it with."""
    problems = config_problems(config, registry)
    rows: list[dict[str, Any]] = []
    for name, profile in _profiles(config, registry).items():
        if name in config.profiles:
            source = "configuration"
        elif name == DEFAULT_PROFILE:
            source = "built in"
        else:
            source = "installed backend"
        errors = [problem.message for problem in problems if problem.profile == name]
        if not errors and profile.backend is not None:
            try:
                # As run sets it up: a backend may refuse its settings only here.
                create_backend(registry, name, profile.backend, dict(profile.options))
            except ConfigurationError as exc:
                errors.append(str(exc))
        rows.append(
            {
                "name": name,
                "backend": profile.backend,
                "source": source,
                "required_level": strictest_level(
                    [profile.required_level, config.required_level]
                ).value,
                "allow_network": profile.allow_network,
                "options": dict(profile.options),
                "limits": profile.limits.model_dump(mode="json"),
                "budgets": profile.budgets.model_dump(mode="json"),
                "output": profile.output.model_dump(mode="json"),
                "warm": profile.warm,
                "warm_memory_bytes": profile.warm_memory_bytes,
                "warm_idle_seconds": profile.warm_idle_seconds,
                "errors": errors,
            }
        )
    return rows


def deployment_errors(config: DeploymentConfig, registry: BackendRegistry) -> list[str]:
    """Configuration errors that belong to no profile (e.g. backend_preference)."""
    return [p.message for p in config_problems(config, registry) if p.profile is None]


async def diagnose(config: DeploymentConfig, registry: BackendRegistry) -> dict[str, Any]:
    """Try every installed backend here, say which profile would use which, and answer
    first whether untrusted code can be run safely here."""
    backends: list[dict[str, Any]] = []
    trials: dict[str, Any] = {}
    for backend_id in registry.ids():
        registered = registry.get(backend_id)
        found = await availability(registry, backend_id)
        trials[backend_id] = found
        backends.append(
            {
                "id": backend_id,
                "distribution": registered.distribution,
                "version": registered.version,
                "claims": registered.cls.claims.value,
                "works": found.available,
                "reason": found.reason,
                # Computed from the trial's grades by level_of, never the claim.
                "level": None if found.level is None else found.level.value,
                "grades": dict(found.grades),
            }
        )
    selection: Selection | None = None
    selection_error: str | None = None
    try:
        selection = await select_default(registry, config.backend_preference)
    except ConfigurationError as exc:
        selection_error = str(exc)
    profiles = profile_table(config, registry)
    for row in profiles:
        backend_id = row["backend"]
        if backend_id is None:
            # default without a backend: chosen here, as run chooses it.
            if selection is None:
                row["errors"].append(selection_error)
                row.update({"works": False, "reason": selection_error, "level": None})
                continue
            row["backend"] = backend_id = selection.chosen.backend_id
            row["selected"] = selection.why
            profile = config.profiles.get(row["name"], ProfileConfig())
            unreachable = selection.below_required(row["name"], profile.required_level)
            if unreachable is not None:
                row["errors"].append(unreachable)
        if row["errors"] or backend_id not in trials:
            row.update({"works": False, "reason": None, "level": None})
            continue
        found = trials[backend_id]
        if row["options"]:
            # Its own settings, tried as its runs will be (an image that is not there).
            found = await availability(registry, backend_id, row["options"])
        # The trial's level (from its grades), as on the backend's own row.
        row.update(
            {
                "works": found.available,
                "reason": found.reason,
                "level": None if found.level is None else found.level.value,
            }
        )
        if found.level is not None and not level_at_least(
            found.level, Level(row["required_level"])
        ):
            row["refused"] = (
                f"runs are refused: it reaches {found.level.value} here, "
                f"required_level is {row['required_level']}"
            )
    errors = deployment_errors(config, registry) + [
        f"{message}" for row in profiles for message in row["errors"]
    ]
    working = [row for row in profiles if row.get("works")]
    libraries = await list_libraries(config, registry, working, {row["backend"] for row in working})
    return {
        "verdict": _verdict(selection, selection_error, profiles, trials),
        "backends": backends,
        "profiles": profiles,
        "errors": list(dict.fromkeys(errors)),
        "libraries": libraries,
    }


def _verdict(
    selection: Selection | None,
    selection_error: str | None,
    profiles: list[dict[str, Any]],
    trials: dict[str, Any],
) -> dict[str, Any]:
    """The answer to "can I safely run untrusted code here?", for the default profile."""
    default = next(row for row in profiles if row["name"] == DEFAULT_PROFILE)
    backend_id = default["backend"]
    level = default.get("level")
    if default["errors"] or not default.get("works"):
        reason = "; ".join(default["errors"]) or default.get("reason") or selection_error
        return {
            "safe": False,
            "backend": backend_id,
            "level": level,
            "message": f"No: the default profile cannot run here: {reason}",
        }
    if level == Level.ISOLATED.value:
        return {
            "safe": True,
            "backend": backend_id,
            "level": level,
            "message": f"Yes: the default profile runs {backend_id} at level isolated",
        }
    found = trials[backend_id]
    if default.get("refused"):
        message = (
            f"No isolated backend works here, so the default profile refuses every run "
            f"({default['refused']})"
        )
        if selection is not None:
            message += f"; {selection.fix()}"
        return {"safe": False, "backend": backend_id, "level": level, "message": message}
    note = None
    if selection is not None and default.get("selected"):
        grades = {Guarantee(g): Grade(value) for g, value in found.grades.items()}
        note = selection.note(Level(level), grades)
    if note is not None:
        detail = note.message
    else:
        detail = f"the configuration names {backend_id}, which reaches level {level}"
    return {
        "safe": False,
        "backend": backend_id,
        "level": level,
        "message": f"No: the default profile runs {backend_id}, {detail}",
    }


def format_doctor(report: dict[str, Any]) -> str:
    lines = [report["verdict"]["message"], ""]
    if report["errors"]:
        lines.append("Configuration errors (run refuses these):")
        lines.extend(f"  error: {message}" for message in report["errors"])
    lines.append("Backends:")
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


def format_profiles(rows: list[dict[str, Any]], errors: list[str]) -> str:
    lines = [f"error: {message}" for message in errors]
    lines.extend(_profile_line(row) for row in rows)
    return "\n".join(lines)


def _profile_line(row: dict[str, Any]) -> str:
    backend = row["backend"] or "the strongest backend that works here, chosen at first use"
    network = "network allowed" if row["allow_network"] else "no network"
    line = (
        f"  {row['name']:<16} -> {backend}; requires {row['required_level']}; {network}; "
        f"from {row['source']}"
    )
    if row["errors"]:
        line += "".join(f"\n      error: {message}" for message in row["errors"])
    elif row.get("works") is False and row.get("reason"):
        line += f"\n      does not work here: {row['reason']}"
    if row.get("refused"):
        line += f"\n      {row['refused']}"
    if row.get("selected"):
        line += f"\n      chosen because: {row['selected']}"
    return line


def command_doctor(config_path: str | None, as_json: bool) -> int:
    """``psych-sandbox doctor``: exit 0 when default and every configured profile can run
    programs here, 1 when one cannot (its backend does not work, or required_level refuses
    every run), 2 when the configuration has errors ``run`` would refuse."""
    import json

    import anyio

    from .._policy.config import resolve_config

    config = resolve_config(config_path)
    registry = BackendRegistry()
    report = anyio.run(diagnose, config, registry)
    print(json.dumps(report) if as_json else format_doctor(report))
    if report["errors"]:
        return EXIT_CONFIGURATION
    # An installed backend that does not work here is information; a profile someone
    # configured, or default, that cannot run is a problem.
    working = all(
        row.get("works") and not row.get("refused")
        for row in report["profiles"]
        if row["source"] != "installed backend"
    )
    return EXIT_OK if working else EXIT_NOT_WORKING


def command_profiles(config_path: str | None, as_json: bool) -> int:
    """``psych-sandbox profiles``: the profiles a run may name (no trials are run); exit 2
    when the configuration has errors ``run`` would refuse."""
    import json

    from .._policy.config import resolve_config

    config = resolve_config(config_path)
    registry = BackendRegistry()
    rows = profile_table(config, registry)
    errors = deployment_errors(config, registry) + [m for row in rows for m in row["errors"]]
    if as_json:
        print(json.dumps({"profiles": rows, "errors": errors}))
    else:
        print(format_profiles(rows, deployment_errors(config, registry)))
    return EXIT_CONFIGURATION if errors else EXIT_OK
