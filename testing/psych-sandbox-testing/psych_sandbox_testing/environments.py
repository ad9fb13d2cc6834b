"""Python environments for tests of what a program can import, built from this host with no
network: a virtual environment of a system interpreter, with a tiny distribution written into
it or distributions copied from the environment running the tests (whose interpreter has the
same version, so compiled extensions fit). Standard library and ``packaging`` only.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from psych_sandbox_core import ExecutionResult, Sandbox
from psych_sandbox_core.kit.interpreter import SYSTEM_CANDIDATES, reachable_by_others

#: The tiny distribution the tests install: its module returns a value no standard module has.
TINY_DISTRIBUTION = "psych-tiny-library"
TINY_MODULE = "psych_tiny_library"
TINY_VERSION = "1.2.3"
TINY_ANSWER = "the tiny library was imported"
TINY_SOURCE = f"ANSWER = {TINY_ANSWER!r}\n"

#: A program that imports the tiny library and returns what it says and where it was found.
IMPORT_TINY = f"""
import {TINY_MODULE}
import importlib.metadata
[{TINY_MODULE}.ANSWER, importlib.metadata.version({TINY_DISTRIBUTION!r})]
"""

#: A program that draws a chart with matplotlib and leaves it in its workspace as chart.png.
MATPLOTLIB_CHART = """
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
figure, axes = plt.subplots()
axes.plot([1, 2, 3, 4], [1, 4, 9, 16])
figure.savefig("chart.png")
matplotlib.__version__
"""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def base_interpreter() -> str | None:
    """A system interpreter any uid can run, of this host's Python version, or None."""
    wanted = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in SYSTEM_CANDIDATES:
        if not os.access(candidate, os.X_OK):
            continue
        real = os.path.realpath(candidate)
        if not reachable_by_others(real):
            continue
        version = subprocess.run(
            [real, "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            env={},
            timeout=30,
            check=False,
        )
        if version.returncode == 0 and version.stdout.strip() == wanted:
            return real
    return None


@contextmanager
def virtual_environment(base: str, parent: str = "/var/tmp") -> Iterator[Path]:
    """A fresh virtual environment of ``base`` (without pip), readable by any uid, removed
    afterwards. Under ``parent``: not /tmp, which a sandbox mounts afresh."""
    holder = tempfile.mkdtemp(prefix="psych-environment-", dir=parent)
    try:
        os.chmod(holder, 0o755)
        root = Path(holder) / "env"
        subprocess.run(
            [base, "-m", "venv", "--without-pip", str(root)],
            check=True,
            env={},
            capture_output=True,
            timeout=120,
        )
        readable_by_all(root)
        yield root
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def site_packages(environment: Path) -> Path:
    """The environment's site-packages directory."""
    (found,) = (environment / "lib").glob("python3*/site-packages")
    return found


def readable_by_all(root: Path) -> None:
    """o+r on every file and o+rx on every directory under ``root``."""
    for directory, _, files in os.walk(root):
        os.chmod(directory, os.stat(directory).st_mode | 0o755)
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | stat.S_IROTH)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _distribution_files(name: str, version: str, modules: Mapping[str, str]) -> dict[str, bytes]:
    """A pure-Python distribution's files, as a wheel or an installation holds them."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    files = {f"{module}/__init__.py": source.encode() for module, source in modules.items()}
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: psych-sandbox-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n"
    )
    files[f"{info}/top_level.txt"] = "".join(f"{m}\n" for m in modules).encode()
    record = [_record_line(path, data) for path, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    return files


def write_distribution(
    site: Path,
    name: str = TINY_DISTRIBUTION,
    version: str = TINY_VERSION,
    modules: Mapping[str, str] | None = None,
) -> None:
    """Install a pure-Python distribution into ``site`` by writing its files."""
    files = _distribution_files(name, version, modules or {TINY_MODULE: TINY_SOURCE})
    for path, data in files.items():
        target = site / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    readable_by_all(site)


def build_wheel(
    directory: Path,
    name: str = TINY_DISTRIBUTION,
    version: str = TINY_VERSION,
    modules: Mapping[str, str] | None = None,
) -> Path:
    """A wheel file of a pure-Python distribution, built in ``directory``."""
    wheel = directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in _distribution_files(
            name, version, modules or {TINY_MODULE: TINY_SOURCE}
        ).items():
            archive.writestr(path, data)
    return wheel


def copy_distributions(site: Path, names: Iterable[str]) -> list[str]:
    """Copy the distributions ``names``, and everything they require, from the environment
    running this into ``site``. Returns the names copied. Raises PackageNotFoundError when
    one is not installed here."""
    from packaging.requirements import Requirement

    pending = list(names)
    done: dict[str, metadata.Distribution] = {}
    while pending:
        distribution = metadata.distribution(pending.pop())
        key = distribution.metadata["Name"].lower().replace("_", "-")
        if key in done:
            continue
        done[key] = distribution
        for line in distribution.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    for distribution in done.values():
        for file in distribution.files or []:
            if file.parts[0] == "..":
                continue  # scripts and data outside site-packages
            source = Path(str(distribution.locate_file(file)))
            if not source.is_file():
                continue
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    readable_by_all(site)
    return sorted(done)


async def chart_bytes(sandbox: Sandbox, result: ExecutionResult) -> bytes:
    """The chart.png MATPLOTLIB_CHART left, as it came back: checked to be the artifact the
    result lists (digest, type, size) and a PNG image with a size."""
    assert result.error is None, result.error
    (chart,) = [artifact for artifact in result.artifacts if artifact.path == "chart.png"]
    data = await sandbox.attachments.read_all(
        chart.attachment, tenant=result.tenant or "default", run_id=result.run_id or ""
    )
    assert chart.content_type == "image/png"
    assert chart.size_bytes == len(data) and chart.sha256 == hashlib.sha256(data).hexdigest()
    # The signature, then the IHDR chunk: width and height, big-endian.
    assert data.startswith(PNG_SIGNATURE) and data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 0 and height > 0
    return data


def tree_state(root: Path) -> dict[str, tuple[int, str]]:
    """Every entry under ``root`` with its mode and content digest (link target for links),
    as the host sees them: compared before and after a run, proves nothing changed."""
    state: dict[str, tuple[int, str]] = {}
    for directory, dirnames, files in os.walk(root):
        for name in [*dirnames, *files]:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                content = os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as fh:
                    content = hashlib.sha256(fh.read()).hexdigest()
            else:
                content = ""
            state[os.path.relpath(path, root)] = (info.st_mode, content)
    return state


#: A program that tries to change the environment it imports from, and says what happened.
TAMPER_WITH = """
import errno, os, {module}
package = os.path.dirname({module}.__file__)
outcomes = []
for attempt in (
    lambda: open(os.path.join(package, "__init__.py"), "a").write("ANSWER = 'changed'"),
    lambda: open(os.path.join(os.path.dirname(package), "planted.py"), "w").write("x = 1"),
    lambda: os.remove(os.path.join(package, "__init__.py")),
    lambda: os.rename(package, package + "-moved"),
):
    try:
        attempt()
        outcomes.append("done")
    except OSError as error:
        outcomes.append(errno.errorcode.get(error.errno, "?"))
outcomes
""".replace("{module}", TINY_MODULE)
