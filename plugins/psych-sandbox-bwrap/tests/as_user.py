"""Run by the selection tests as another identity (not collected by pytest): selects the
default profile's backend, runs one program under bwrap, and prints one JSON object."""

import json
import site
import sys

site.addsitedir(sys.argv[1])  # the test environment's packages, reachable by any uid

import anyio
from psych_sandbox_core import Sandbox
from psych_sandbox_testing.selection import availability

PROGRAM = sys.argv[2]


async def main() -> None:
    async with Sandbox() as sandbox:
        bwrap = await availability(sandbox.registry, "bwrap")
        selected = await sandbox.strongest_working_backend()
        result = await sandbox.run(PROGRAM, profile="bwrap")
    print(
        json.dumps(
            {
                "bwrap_available": bwrap.available,
                "bwrap_reason": bwrap.reason,
                "selected": selected,
                "level": result.level,
                "grades": result.grades,
                "error": None
                if result.error is None
                else [result.error.kind.value, result.error.message],
                "stdout": result.stdout,
                "return_value": result.return_value,
                "measured_by": result.usage.measured_by,
                "cpu_seconds": result.usage.cpu_seconds,
            }
        )
    )


anyio.run(main)
