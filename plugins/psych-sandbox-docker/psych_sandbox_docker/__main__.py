"""``python -m psych_sandbox_docker reap [--engine E] [--all]``: remove containers left by
host processes that are gone (``--all``: every container of this machine's hosts)."""

from __future__ import annotations

import argparse

from .engine import detect_engine, reap_orphans


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m psych_sandbox_docker")
    commands = parser.add_subparsers(dest="command", required=True)
    reap = commands.add_parser("reap", help="remove orphaned sandbox containers")
    reap.add_argument("--engine", choices=("docker", "podman"), default=None)
    reap.add_argument(
        "--all",
        action="store_true",
        help="also remove containers whose host process is still running",
    )
    args = parser.parse_args(argv)
    detected = detect_engine(args.engine)
    if detected is None:
        parser.exit(1, "error: no container engine CLI (docker or podman) on PATH\n")
    removed = reap_orphans(detected[0], everything=args.all)
    for container in removed:
        print(container)
    print(f"removed {len(removed)} container(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
