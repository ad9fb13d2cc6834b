"""On a root host every container runs as a uid of its own, asserted from the host: two
running containers never share one, a program in another execution cannot reach a running
container's workspace, and the control socket belongs to that uid alone.

runc maps no user namespace: the container's uid is a host uid. Shared, it lets any program
running as it outside a pid namespace (an execution of the subprocess backend configured with
that identity, a service running as "nobody") read a running container's workspace through
/proc/<pid>/root, and every container under it shares its RLIMIT_NPROC count. The last test
shows the first with the shared identity the container_uid option configures, which is why
that option is the weaker choice."""

from __future__ import annotations

import os
from typing import Any

import anyio
import pytest
from docker_support import FAST_LIMITS, PROFILE, leased
from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_testing.host import marker, pids_with, uids_of, wait_until
from psych_sandbox_testing.requirements import skip_unless_required

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("engine")]

NOBODY = 65534
#: The weaker configurations: every execution under the one identity.
SHARED_DOCKER = {"container_uid": NOBODY, "container_gid": NOBODY}
SHARED_SUBPROCESS = {"drop_to_uid": NOBODY, "drop_to_gid": NOBODY}


@pytest.fixture(autouse=True)
def _root_host() -> None:
    if os.geteuid() != 0:
        skip_unless_required("docker", "identities are leased only on a root host")


def deployment(docker: dict[str, Any], subprocess: dict[str, Any]) -> DeploymentConfig:
    limits = ExecutionLimits(**FAST_LIMITS)
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="docker", options={"runtime": "runc", **docker}, limits=limits
            ),
            # Without a pid namespace this program sees every process of the host.
            "plain": ProfileConfig(
                backend="subprocess",
                options={"use_namespaces": False, **subprocess},
                limits=limits,
            ),
        }
    )


async def test_the_control_socket_belongs_to_the_container_uid() -> None:
    mark = marker()
    seen: dict[str, Any] = {}

    async def inspect() -> None:
        (pid,) = await wait_until(lambda: pids_with(mark))
        uid = uids_of(pid)[0]
        # The socket the container connected to, found through the container's own mount of
        # the socket directory.
        info = os.stat(f"/proc/{pid}/root/run/psych/control.sock")
        directory = os.stat(f"/proc/{pid}/root/run/psych")
        seen.update(
            uid=uid,
            owner=(info.st_uid, info.st_gid),
            mode=info.st_mode & 0o777,
            dir_owner=directory.st_uid,
            dir_mode=directory.st_mode & 0o777,
        )

    async with Sandbox(deployment({}, {})) as sandbox, anyio.create_task_group() as tg:
        tg.start_soon(inspect)
        result = await sandbox.run(
            "import subprocess, sys\n"
            f"subprocess.run([sys.executable, '-c', 'import time; time.sleep(0.5)', {mark!r}])\n"
            "import os\nos.getuid()",
            profile=PROFILE,
        )
    assert result.error is None, result.error
    assert leased(seen["uid"]) and result.return_value == seen["uid"]
    assert seen["owner"] == (seen["uid"], seen["uid"])
    assert seen["mode"] == 0o600
    # The directory stays root's, traversable only.
    assert (seen["dir_owner"], seen["dir_mode"]) == (0, 0o711)
