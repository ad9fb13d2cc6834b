"""Build a minimal Python runtime image without any registry.

The image is made from the host's own Debian interpreter (``/usr/bin/python3.11``),
its standard library, and exactly the shared libraries those need (found with
``ldd``), streamed as a tar archive into ``docker import``. Nothing is pulled and
no network is used. Only the files the interpreter needs are included; account
files (``/etc/passwd``, ``/etc/group``, ``/etc/nsswitch.conf``) are generated, so
nothing from the host's ``/etc``, ``/root``, ``/home`` or ``/tmp`` ends up in it.

Packages a deployment wants its programs to import (numpy, pandas, matplotlib, ...) are
installed here, at build time, never at run time: pip, run for the image's interpreter
(``pip --python``), installs them with ``--target`` into a staging directory from the package
index pip is configured with (``PIP_INDEX_URL``, ``pip.conf``), and that directory becomes the
image's ``/usr/local/lib/python3.11/dist-packages``, a directory the interpreter puts on its
path even in isolated mode. Shared libraries their extension modules link to (``ldd``) come
from the host like the interpreter's own. Give such an image a tag of its own and name it in
the profile (``image = "psych-sandbox-python:science"``).

Usage::

    python -m psych_sandbox_docker.image [--tag TAG] [--engine docker]
        [--packages SPEC [SPEC ...]] [--requirements FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath
from typing import IO

__all__ = [
    "DEFAULT_TAG",
    "IMAGE_LABEL",
    "ImageBuildError",
    "build_local_image",
    "install_packages",
    "write_rootfs_tar",
]

DEFAULT_TAG = "psych-sandbox-python:local"
PYTHON_VERSION = "3.11"
HOST_PYTHON = f"/usr/bin/python{PYTHON_VERSION}"
HOST_STDLIB = f"/usr/lib/python{PYTHON_VERSION}"
#: Where installed packages go in the image: on Debian's interpreter's path under -I (it is
#: the site directory for locally installed packages; the image has no other).
IMAGE_SITE_PACKAGES = f"usr/local/lib/python{PYTHON_VERSION}/dist-packages"
#: How long pip may take to resolve, download and install everything asked for.
PIP_SECONDS = 3600
_ELF_MAGIC = b"\x7fELF"

#: Label every image built here carries; ``docker images --filter label=...`` finds them.
IMAGE_LABEL = "io.psych-sandbox.image"
IMAGE_LABEL_VALUE = "python-runtime"
IMAGE_FORMAT_VERSION = "1"

SANDBOX_UID = 65534
SANDBOX_GID = 65534

# Standard-library entries (first path component below HOST_STDLIB) left out,
# besides config-*/ (static libpython and build files): the test suite, ensurepip
# (its wheels are not shipped by Debian's python3.11), and the apport hook.
_STDLIB_EXCLUDE_TOP = frozenset(
    {
        "test",
        "ensurepip",
        "idlelib",
        "tkinter",
        "turtledemo",
        "sitecustomize.py",
        "EXTERNALLY-MANAGED",
    }
)
# Extension modules left out: test helpers and ones that pull in large or
# pointless libraries for a sandbox (terminal UI, NIS/Kerberos, Berkeley DB, audio).
_DYNLOAD_EXCLUDE = re.compile(
    r"^(_test\w*|_ctypes_test|xxlimited\w*|_xxtestfuzz|readline|_curses\w*|nis|_dbm|ossaudiodev)\."
)
_OPT_PYC = re.compile(r"\.opt-[12]\.pyc$")
# Loaded with dlopen at run time rather than linked, so ldd does not list it:
# glibc needs libgcc_s for thread cancellation / pthread_exit unwinding.
_DLOPENED_LIBS = ("libgcc_s.so.1",)

_PASSWD = (
    "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
    f"nobody:x:{SANDBOX_UID}:{SANDBOX_GID}:nobody:/workspace:/usr/sbin/nologin\n"
)
_GROUP = f"root:x:0:\nnogroup:x:{SANDBOX_GID}:\n"
_NSSWITCH = "passwd: files\ngroup: files\nshadow: files\nhosts: files\n"
_HOSTS = "127.0.0.1 localhost\n::1 localhost\n"


class ImageBuildError(RuntimeError):
    """Building or importing the sandbox image failed."""


class _RootfsWriter:
    """Collects host paths (with every symlink on the way) into a tar archive."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self._tar = tar
        self._done: set[str] = set()

    def _add_entry(self, host_path: str) -> None:
        if host_path in self._done:
            return
        self._done.add(host_path)
        info = self._tar.gettarinfo(host_path, arcname=host_path.lstrip("/"))
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        # Never carry set-id bits or group/other write bits into the image.
        info.mode &= 0o755
        if info.isreg():
            with open(host_path, "rb") as f:
                self._tar.addfile(info, f)
        elif info.isdir() or info.issym():
            self._tar.addfile(info)
        else:
            raise ImageBuildError(f"refusing to copy special file {host_path}")

    def _add_parents(self, path: str) -> str:
        """Add the directories leading to ``path`` and return its resolved parent.

        A component that is a symlink on the host (``/lib -> usr/lib``) is added
        as that symlink, and the walk continues at its target.
        """
        resolved = "/"
        for part in PurePosixPath(path).parent.parts[1:]:
            cur = os.path.join(resolved, part)
            while os.path.islink(cur):
                self._add_entry(cur)
                target = os.readlink(cur)
                cur = os.path.normpath(os.path.join(os.path.dirname(cur), target))
                # the target's own parents may also be symlinks
                self._add_parents(os.path.join(cur, "x"))
            if not os.path.isdir(cur):
                raise ImageBuildError(f"{cur} (on the way to {path}) is not a directory")
            self._add_entry(cur)
            resolved = cur
        return resolved

    def add_path(self, path: str) -> None:
        """Add ``path``, its parents, and every symlink in its chain."""
        seen: set[str] = set()
        while True:
            parent = self._add_parents(path)
            path = os.path.join(parent, os.path.basename(path))
            if path in seen:
                raise ImageBuildError(f"symlink loop at {path}")
            seen.add(path)
            if not os.path.lexists(path):
                raise ImageBuildError(f"required host file {path} does not exist")
            self._add_entry(path)
            if not os.path.islink(path):
                return
            path = os.path.normpath(os.path.join(parent, os.readlink(path)))

    def add_tree(self, root: str, exclude: Iterable[str]) -> list[str]:
        """Add a directory tree; return the ELF shared objects found in it."""
        self.add_path(root)
        excluded = set(exclude)
        shared_objects: list[str] = []
        for dirpath, dirnames, filenames in os.walk(root):
            rel = os.path.relpath(dirpath, root)
            if rel == ".":
                # config-3.11-<triplet>: the static libpython and build files (25 MB)
                dirnames[:] = sorted(
                    d for d in dirnames if d not in excluded and not d.startswith("config-")
                )
                filenames = [f for f in filenames if f not in excluded]
            else:
                dirnames.sort()
            if os.path.basename(dirpath) == "lib-dynload":
                filenames = [f for f in filenames if not _DYNLOAD_EXCLUDE.match(f)]
            for d in dirnames:
                self._add_entry(os.path.join(dirpath, d))
            for name in sorted(filenames):
                if _OPT_PYC.search(name):
                    continue  # only used under -O/-OO
                full = os.path.join(dirpath, name)
                if os.path.islink(full):
                    target = os.path.realpath(full)
                    if not target.startswith(root + "/"):
                        continue  # points out of the tree (e.g. into /etc): skip
                self._add_entry(full)
                if name.endswith(".so") and not os.path.islink(full):
                    shared_objects.append(full)
        return shared_objects

    def add_tree_at(self, root: str, arcroot: str) -> list[str]:
        """Add the contents of the host directory ``root`` under ``arcroot`` in the image;
        return the ELF files found in it. Links out of the tree are left out."""
        parts = PurePosixPath(arcroot).parts
        for depth in range(1, len(parts) + 1):
            # Marked as done under the host path they stand for: an archive must not name
            # a path twice (the engine refuses it), and the host's /usr is already in.
            arcname = "/".join(parts[:depth])
            if "/" + arcname not in self._done:
                self._done.add("/" + arcname)
                self.add_dir(arcname, 0o755)
        elf_files: list[str] = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in [*dirnames, *sorted(filenames)]:
                full = os.path.join(dirpath, name)
                if os.path.islink(full):
                    target = os.path.realpath(full)
                    if not target.startswith(root + "/"):
                        continue
                arcname = os.path.join(arcroot, os.path.relpath(full, root))
                info = self._tar.gettarinfo(full, arcname=arcname)
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mode &= 0o755
                if info.isreg():
                    with open(full, "rb") as f:
                        if f.read(4) == _ELF_MAGIC:
                            elf_files.append(full)
                        f.seek(0)
                        self._tar.addfile(info, f)
                elif info.isdir() or info.issym():
                    self._tar.addfile(info)
                else:
                    raise ImageBuildError(f"refusing to copy special file {full}")
        return elf_files

    def add_generated(self, arcname: str, data: bytes, mode: int = 0o644) -> None:
        info = tarfile.TarInfo(arcname)
        info.size = len(data)
        info.mode = mode
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        self._tar.addfile(info, io.BytesIO(data))

    def add_dir(self, arcname: str, mode: int, uid: int = 0, gid: int = 0) -> None:
        info = tarfile.TarInfo(arcname)
        info.type = tarfile.DIRTYPE
        info.mode = mode
        info.uid, info.gid = uid, gid
        self._tar.addfile(info)


_LDD_LINE = re.compile(r"^\s*(?:(\S+)\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)\s*$")


def _shared_libraries(binaries: Iterable[str]) -> set[str]:
    """The absolute paths of the libraries (and loader) ``binaries`` link to."""
    libs: set[str] = set()
    for binary in binaries:
        proc = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ImageBuildError(
                f"ldd {binary} failed: {proc.stderr.strip() or proc.stdout.strip()}"
            )
        for line in proc.stdout.splitlines():
            if "not found" in line:
                raise ImageBuildError(f"{binary}: missing library: {line.strip()}")
            m = _LDD_LINE.match(line)
            if m:
                libs.add(m.group(2))
    return libs


def _find_library(name: str, near: Iterable[str]) -> str | None:
    for lib in near:
        candidate = os.path.join(os.path.dirname(lib), name)
        if os.path.exists(candidate):
            return candidate
    return None


def install_packages(
    target: str, packages: Sequence[str] = (), requirement_files: Sequence[str] = ()
) -> None:
    """Install ``packages`` (pip requirement specifiers, or paths to wheels) and the
    requirements files' contents into ``target`` for the image's interpreter, with pip and
    its configured index. Raises :class:`ImageBuildError`, quoting pip, on failure."""
    if not os.access(HOST_PYTHON, os.X_OK):
        raise ImageBuildError(f"{HOST_PYTHON} not found: the image is built from it")
    args = [*packages]
    for path in requirement_files:
        if not os.path.isfile(path):
            raise ImageBuildError(f"requirements file {path} does not exist")
        args += ["--requirement", path]
    cmd = [
        # pip of the environment running this, acting for the image's interpreter: the
        # interpreter needs no pip of its own, and wheels are chosen for its version and ABI.
        sys.executable,
        "-m",
        "pip",
        "--python",
        HOST_PYTHON,
        "install",
        "--target",
        target,
        "--no-input",
        "--disable-pip-version-check",
        "--root-user-action=ignore",
        "--no-warn-script-location",
        *args,
    ]
    try:
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=PIP_SECONDS,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ImageBuildError(f"could not run pip: {exc}") from exc
    if done.returncode != 0:
        output = (done.stderr.strip() or done.stdout.strip())[-4000:]
        if "No module named pip" in output:
            output = f"pip is not installed for {sys.executable}; install it there"
        raise ImageBuildError(f"installing {' '.join(args)} failed: {output}")


def write_rootfs_tar(out: IO[bytes], *, site_packages: str | None = None) -> None:
    """Write the image's root file system as an uncompressed tar stream to ``out``, with
    the packages installed in the host directory ``site_packages`` (see
    :func:`install_packages`), if given."""
    if not os.access(HOST_PYTHON, os.X_OK):
        raise ImageBuildError(
            f"{HOST_PYTHON} not found: install Debian's python{PYTHON_VERSION} "
            f"(apt-get install python{PYTHON_VERSION})"
        )
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        w = _RootfsWriter(tar)
        w.add_path(HOST_PYTHON)
        extensions = w.add_tree(HOST_STDLIB, _STDLIB_EXCLUDE_TOP)
        libs = _shared_libraries([HOST_PYTHON, *extensions])
        if site_packages is not None:
            root = os.path.realpath(site_packages)
            package_objects = w.add_tree_at(root, IMAGE_SITE_PACKAGES)
            # Libraries a wheel bundles are already in; the system ones come from the host.
            libs |= {
                lib
                for lib in _shared_libraries(package_objects)
                if not os.path.realpath(lib).startswith(root + "/")
            }
        for name in _DLOPENED_LIBS:
            found = _find_library(name, libs)
            if found:
                libs.add(found)
        for lib in sorted(libs):
            w.add_path(lib)
        # The loader's cache only lists library paths; it lets ld.so find libs fast.
        if os.path.exists("/etc/ld.so.cache"):
            w.add_path("/etc/ld.so.cache")
        link = tarfile.TarInfo("usr/bin/python3")
        link.type = tarfile.SYMTYPE
        link.linkname = f"python{PYTHON_VERSION}"
        link.mode = 0o777
        tar.addfile(link)
        w.add_generated("etc/passwd", _PASSWD.encode())
        w.add_generated("etc/group", _GROUP.encode())
        w.add_generated("etc/nsswitch.conf", _NSSWITCH.encode())
        w.add_generated("etc/hosts", _HOSTS.encode())
        w.add_generated("etc/hostname", b"sandbox\n")
        w.add_generated("etc/resolv.conf", b"")
        for d in ("dev", "proc", "sys", "run"):
            w.add_dir(d, 0o755)
        w.add_dir("tmp", 0o1777)
        w.add_dir("workspace", 0o755, SANDBOX_UID, SANDBOX_GID)


def _import_changes() -> list[str]:
    changes = [
        f"LABEL {IMAGE_LABEL}={IMAGE_LABEL_VALUE}",
        f"LABEL {IMAGE_LABEL}.format={IMAGE_FORMAT_VERSION}",
        f"LABEL {IMAGE_LABEL}.python={PYTHON_VERSION}",
        "ENV PATH=/usr/bin",
        "ENV LANG=C.UTF-8",
        "ENV PYTHONDONTWRITEBYTECODE=1",
        f"USER {SANDBOX_UID}:{SANDBOX_GID}",
        "WORKDIR /workspace",
        f'CMD ["{HOST_PYTHON}", "-I"]',
    ]
    out: list[str] = []
    for change in changes:
        out += ["--change", change]
    return out


def build_local_image(
    tag: str = DEFAULT_TAG,
    *,
    engine: str = "docker",
    packages: Sequence[str] = (),
    requirement_files: Sequence[str] = (),
) -> str:
    """Build the sandbox Python image from host files and return its image id.

    No registry is contacted: the root file system is streamed into ``<engine> import``.
    ``packages`` and ``requirement_files`` are installed into it first (see
    :func:`install_packages`). Raises :class:`ImageBuildError` on any failure.
    """
    if packages or requirement_files:
        with tempfile.TemporaryDirectory(prefix="psych-sandbox-image-") as staging:
            install_packages(staging, packages, requirement_files)
            return _import_image(tag, engine, staging)
    return _import_image(tag, engine, None)


def _import_image(tag: str, engine: str, site_packages: str | None) -> str:
    cmd = [engine, "import", *_import_changes(), "-", tag]
    try:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError as exc:
        raise ImageBuildError(f"cannot run {engine!r}: {exc}") from exc
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    # The Popen context closes all three pipes however this ends (an unclosed reader is a
    # leaked fd, and a ResourceWarning under a strict warning filter).
    with proc:
        # Drain the engine's output while streaming, so neither side can block.
        captured: dict[str, bytes] = {}

        def drain(name: str, stream: IO[bytes]) -> None:
            captured[name] = stream.read()

        readers = [
            threading.Thread(target=drain, args=("out", proc.stdout), daemon=True),
            threading.Thread(target=drain, args=("err", proc.stderr), daemon=True),
        ]
        for t in readers:
            t.start()
        write_error: BaseException | None = None
        try:
            write_rootfs_tar(proc.stdin, site_packages=site_packages)
        except BrokenPipeError as exc:
            write_error = exc  # the engine gave up; its stderr says why
        except BaseException:
            proc.kill()
            proc.wait()
            for t in readers:
                t.join()  # they end at the dead engine's EOF, before the pipes close
            raise
        finally:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        rc = proc.wait()
        for t in readers:
            t.join()
    stderr = captured.get("err", b"").decode(errors="replace").strip()
    stdout = captured.get("out", b"").decode(errors="replace").strip()
    if rc != 0 or write_error is not None:
        raise ImageBuildError(
            f"{' '.join(cmd[:2])} ... {tag} failed (exit {rc}): {stderr or write_error or stdout}"
        )
    image_id = stdout.splitlines()[-1].strip() if stdout else ""
    if not image_id.startswith("sha256:"):
        # Fall back to asking the engine what the tag now points at.
        inspect = subprocess.run(
            [engine, "image", "inspect", "--format", "{{.Id}}", tag],
            capture_output=True,
            text=True,
            check=False,
        )
        image_id = inspect.stdout.strip()
        if inspect.returncode != 0 or not image_id:
            raise ImageBuildError(
                f"imported {tag} but could not read its id: {inspect.stderr.strip()}"
            )
    return image_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m psych_sandbox_docker.image",
        description="Build the psych-sandbox Python image from host files (no registry).",
    )
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"image tag (default {DEFAULT_TAG})")
    parser.add_argument(
        "--engine", default="docker", help="container engine command (default docker)"
    )
    parser.add_argument(
        "--tar",
        metavar="FILE",
        help="write the root file system tar to FILE ('-' for stdout) instead of importing",
    )
    parser.add_argument(
        "--packages",
        nargs="+",
        default=[],
        metavar="SPEC",
        help="packages to install into the image (pip requirement specifiers or wheel files), "
        "from pip's configured index, at build time",
    )
    parser.add_argument(
        "--requirements",
        action="append",
        default=[],
        metavar="FILE",
        help="a pip requirements file to install into the image (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        if args.tar:
            with contextlib.ExitStack() as stack:
                site_packages: str | None = None
                if args.packages or args.requirements:
                    site_packages = stack.enter_context(
                        tempfile.TemporaryDirectory(prefix="psych-sandbox-image-")
                    )
                    install_packages(site_packages, args.packages, args.requirements)
                if args.tar == "-":
                    write_rootfs_tar(sys.stdout.buffer, site_packages=site_packages)
                else:
                    with open(args.tar, "wb") as f:
                        write_rootfs_tar(f, site_packages=site_packages)
            return 0
        print(
            build_local_image(
                args.tag,
                engine=args.engine,
                packages=args.packages,
                requirement_files=args.requirements,
            )
        )
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
