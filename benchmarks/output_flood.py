"""A 1 GB stdout flood through the public API, and the host's peak memory while it drains.

Each measurement runs in a fresh interpreter that imports the library, records its peak RSS,
runs exactly one flooding program on the subprocess backend and records its peak RSS again;
the growth is what the flood cost the host. The floor is the same fresh interpreter running
a program that prints one line. Prints both, the capture cap, and the growth minus the cap.

    python benchmarks/output_flood.py [--gigabytes N] [--cap-kib N] [--callback KIND]

``--callback async`` or ``thread`` also streams the flood to an ``on_output`` callback that
only counts (an ``async def``, or a plain function called in a worker thread): the drain's
cost of streaming, and how much a callback slower than the flood is dropped and counted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_MEASURE = r"""
import json, resource, sys
import anyio
from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox

total, cap, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
streamed = [0, 0]

def count(chunk):
    streamed[0] += len(chunk.data)
    streamed[1] += chunk.skipped_bytes

async def count_async(chunk):
    count(chunk)

callback = {"none": None, "async": count_async, "thread": count}[kind]
flood = (
    "import os\n"
    "block = b'x' * 1048575 + b'\\n'\n"
    f"for _ in range({total} // len(block)): os.write(1, block)\n"
)
source = flood if total else "print('one line')"

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

async def main():
    config = DeploymentConfig(profiles={"flood": ProfileConfig(
        backend="subprocess",
        limits=ExecutionLimits(stdout_bytes=cap, wall_seconds=600.0, cpu_seconds=600),
    )})
    async with Sandbox(config) as sandbox:
        await sandbox.run("None", profile="flood")  # warm: imports, caches
        before = peak()
        result = await sandbox.run(source, profile="flood", on_output=callback)
        after = peak()
    print(json.dumps({
        "before": before, "after": after, "error": None if result.ok else result.error.kind,
        "total": result.stdout_info.total_bytes, "captured": result.stdout_info.captured_bytes,
        "wall": result.usage.wall_seconds, "streamed": streamed[0], "skipped": streamed[1],
    }))

anyio.run(main)
"""


def measure(total: int, cap: int, callback: str = "none") -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(total), str(cap), callback],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--cap-kib", type=int, default=64)
    parser.add_argument("--callback", choices=["none", "async", "thread"], default="none")
    args = parser.parse_args()
    total = int(args.gigabytes * 1024**3)
    cap = args.cap_kib * 1024
    floor = measure(0, cap)
    flood = measure(total, cap, args.callback)
    mib = 1024 * 1024

    def growth(sample: dict[str, object]) -> int:
        return int(sample["after"]) - int(sample["before"])  # type: ignore[call-overload]

    print(
        f"flood: {int(flood['total']) / mib:.0f} MiB written, "  # type: ignore[call-overload]
        f"{flood['captured']} bytes captured, {flood['wall']} s, error={flood['error']}"
    )
    print(f"capture cap:                  {cap / 1024:.0f} KiB")
    print(f"peak RSS before the flood:    {int(flood['before']) / mib:.1f} MiB")  # type: ignore[call-overload]
    print(f"peak RSS after the flood:     {int(flood['after']) / mib:.1f} MiB")  # type: ignore[call-overload]
    print(f"growth, flood:                {growth(flood) / mib:.2f} MiB")
    print(f"growth, one-line floor:       {growth(floor) / mib:.2f} MiB")
    print(f"flood growth minus the cap:   {(growth(flood) - cap) / mib:.2f} MiB")
    if args.callback != "none":
        print(
            f"streamed to the {args.callback} callback: "
            f"{int(flood['streamed']) / mib:.0f} MiB delivered, "  # type: ignore[call-overload]
            f"{int(flood['skipped']) / mib:.0f} MiB dropped and counted"  # type: ignore[call-overload]
        )


if __name__ == "__main__":
    main()
