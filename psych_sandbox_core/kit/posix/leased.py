"""The one way a backend holds an identity: :func:`leased_identity`, the lease around one
execution (held before anything runs as the uid, retired once the whole tree is gone), and
:class:`LeasedIdentityBackend`, the base of a backend that holds it around its launch. The
leases themselves are identity.py's; their retirement, retirement.py's.
"""

from __future__ import annotations

import sys
from abc import abstractmethod
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from typing_extensions import TypeVar

from ..backend import Backend, Launched, LaunchRequest
from ..phases import mark
from .identity import EmptyCgroup, IdentityRange, LeasedIdentityOptions, host_is_root
from .retirement import returns


@dataclass
class ExecutionIdentity:
    """The host uid and gid one execution runs as, and whether they are its alone."""

    #: (uid, gid), or None where the backend runs the execution under no identity of its own.
    ids: tuple[int, int] | None
    #: True for a lease (no other execution holds the uid while this one runs); False for a
    #: fixed identity every execution shares, or none.
    exclusive: bool
    _proof: EmptyCgroup | None = field(default=None, repr=False)
    #: The range a lease came from, once its execution is over and it is on its way back.
    _range: IdentityRange | None = field(default=None, repr=False)
    _returning: bool = field(default=False, repr=False)

    def returning(self) -> None:
        """The execution is over (its result handed back): the lease only awaits its
        teardown and retirement, and a lease from its range may wait for it."""
        if self._range is not None and not self._returning:
            self._returning = True
            returns.begin(self._range)

    def proven_empty(self, proof: EmptyCgroup | None) -> None:
        """Record the kernel's proof that no process of the execution remains (the removed
        cgroup that held its whole tree): retiring the lease then skips the scan of the
        host's processes. None records nothing."""
        if proof is not None:
            self._proof = proof


@asynccontextmanager
async def leased_identity(
    identities: IdentityRange, *, lease: bool, fixed: tuple[int, int] | None = None
) -> AsyncIterator[ExecutionIdentity]:
    """The identity one execution runs as: ``fixed`` where the deployment configured one,
    else a uid leased from ``identities`` where ``lease`` (a root host), else none.

    Enter it before anything runs as the identity and leave it once the execution's whole
    tree is gone: leaving retires the lease (sweeps the uid, then gives it back; shielded),
    whatever happened inside. Leasing fails with BackendUnavailable when every uid of the
    range is in use."""
    if fixed is not None or not lease:
        yield ExecutionIdentity(fixed, exclusive=False)
        return
    held = await identities.lease_for_execution()
    identity = ExecutionIdentity((held.uid, held.gid), exclusive=True, _range=identities)
    mark("identity leased")
    try:
        yield identity
    finally:
        identity.returning()
        try:
            await held.retire(identity._proof)
        finally:
            returns.end(identities)
        mark("identity retired")


LeasedOptionsT = TypeVar(
    "LeasedOptionsT", bound=LeasedIdentityOptions, default=LeasedIdentityOptions, covariant=True
)


class LeasedIdentityBackend(Backend[LeasedOptionsT], options=LeasedIdentityOptions):
    """A backend whose executions each run as a host uid of their own on a root host.

    It leases the identity around the launch, so the uid is held before anything runs as it
    and retired (swept, then given back) once the whole tree is gone; a subclass implements
    :meth:`launch_as` and starts the child as the identity it is given. A subclass that
    offers a pair of settings for one identity every execution shares instead (the weaker
    choice) names them with the ``shared_identity=("my_uid", "my_gid")`` class keyword.
    """

    #: The (uid, gid) settings naming the identity every execution shares, if offered.
    shared_identity: ClassVar[tuple[str, str] | None] = None

    def __init_subclass__(
        cls, *, shared_identity: tuple[str, str] | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if shared_identity is not None:
            cls.shared_identity = shared_identity

    def __init__(self, options: LeasedOptionsT) -> None:
        super().__init__(options)
        self.is_root = host_is_root()
        #: Executions run as an identity other than the host's: only a root host can start a
        #: child as another uid, and the lease's sweep reads Linux's process and IPC tables.
        self.drops_identity = self.is_root and sys.platform.startswith("linux")
        #: The identity the deployment configured for every execution, or None (a subclass
        #: whose children cannot take it here sets it to None).
        self.fixed_identity = (
            options.fixed_identity(*self.shared_identity) if self.shared_identity else None
        )
        self.identities = options.leasable_range(
            leases=self.drops_identity and self.fixed_identity is None
        )

    @asynccontextmanager
    async def launch(self, request: LaunchRequest) -> AsyncIterator[Launched]:
        # Whatever still runs as the uid, and whatever it left on the host without a
        # process, goes before the uid is reused: leaving the lease sweeps it.
        async with (
            leased_identity(
                self.identities, lease=self.drops_identity, fixed=self.fixed_identity
            ) as identity,
            self.launch_as(_told(request, identity), identity) as launched,
        ):
            if isinstance(launched, Launched):
                launched.when_handed_back(identity.returning)
            yield launched

    @abstractmethod
    def launch_as(
        self, request: LaunchRequest, identity: ExecutionIdentity
    ) -> AbstractAsyncContextManager[Launched]:
        """Start the child as ``identity`` (its ``ids`` are None where the execution runs as
        no identity of its own). As ``launch``: leaving tears everything down, and the
        whole tree must be gone by then, since the lease is retired next."""


def _told(request: LaunchRequest, identity: ExecutionIdentity) -> LaunchRequest:
    """``request``, its host told the uid the child runs as where it has one."""
    if identity.ids is not None:
        request.runs_as(identity.ids[0])
    return request
