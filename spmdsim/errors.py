"""Exceptions that only a simulator can raise.

Everything that JAX itself would reject raises JAX's exception class (NameError for an unbound axis name,
ValueError for sizes and groups, TypeError for argument types). Where JAX 0.10 raises different classes for
one mistake, or a class other than spmdsim did before, spmdsim's class is a subclass of each
(:class:`UnboundAxisError`, :class:`NotAnArrayError`, :class:`AxisNameError`, and NumPy's ``AxisError``, a
ValueError and an IndexError, for ``in_axes`` out of bounds), so an ``except`` clause written for JAX, or for
spmdsim's earlier class, catches it. :class:`SpmdSimError` and its subclasses cover what real hardware does
not report as an error at all: it hangs, or silently computes garbage.
"""
from __future__ import annotations

__all__ = ["SpmdSimError", "CollectiveError", "CollectiveMismatchError", "CollectiveDeadlockError",
           "ReplicationError", "UnboundAxisError", "NotAnArrayError", "AxisNameError", "MappedSizeError",
           "HostLostError", "RemoteError"]


class SpmdSimError(Exception):
    """Base class of spmdsim's own exceptions."""


class CollectiveError(SpmdSimError, RuntimeError):
    """A collective that cannot complete. ``devices`` is the state table: one line per device."""

    def __init__(self, message: str, devices: list[str] | None = None):
        super().__init__(message)
        self.devices = list(devices or [])


class CollectiveMismatchError(CollectiveError):
    """Devices of one group called different collectives (op, axes, parameters, shapes or dtypes) at the
    same step. On hardware this hangs or corrupts data; XLA never sees it because it compiles one program."""


class CollectiveDeadlockError(CollectiveError):
    """A collective that some device of its group will never reach: it returned, raised, or is waiting in
    another collective. On hardware this hangs (XLA:GPU aborts after a timeout, with no Python line)."""


class ReplicationError(SpmdSimError, ValueError):
    """An ``out_axes=None`` output differs between devices, found by ``pmap(..., check_replicated=True)``.
    JAX 0.10 does not check this and silently returns device 0's value."""


class UnboundAxisError(NameError, AssertionError):
    """An axis name that no enclosing map binds. A NameError, as JAX raises for pmap and for most collectives
    under shard_map; also an AssertionError, the class JAX 0.10's shard_map raises (``check_vma=True``) for
    psum, pmean, pmax, pmin, ppermute and pcast over such a name, so one ``except`` clause written for JAX
    catches it either way."""


class NotAnArrayError(TypeError, ValueError):
    """An argument of a mapped function that is not an array or a number (a ``str``, ``bytes``, a ``set``,
    ``object()``), named by its key path. A TypeError, what JAX raises ("not a valid JAX type") when another
    argument is an array; also a ValueError, what ``jax.pmap`` 0.10 raises ("pmap requires at least one
    argument with a mapped axis") when no mapped argument is an array."""


class AxisNameError(TypeError, ValueError):
    """An ``axis_name`` that cannot name an axis: an int, a tuple or a list, or not hashable (raised when the
    map is made). A TypeError, what JAX raises for an int or a list; also a ValueError, what ``jax.pmap``
    raises (when called) for a tuple, which it takes for several mesh axis names."""


class MappedSizeError(ValueError):
    """Mapped sizes that cannot be run: arguments whose mapped axes differ in size, or a mapped axis longer than
    the virtual devices available; the message names the key paths and sizes, and the reshape to do. A
    ValueError. ``spmdsim.jax.pmap`` raises a subclass that is also JAX's ``IndivisibleError`` (a ValueError
    in ``jax._src.sharding``), which ``jax.pmap`` 0.10 raises here when the sizes do not divide (a squeeze
    ValueError when they do); a traceback names it by this public name. Where an argument has the mapped size
    on another axis, the message says so (``args[1] has size 4 on axis 1: in_axes=(0, 1)?``)."""


class HostLostError(SpmdSimError, RuntimeError):
    """A host of a multi-host run is gone: its process died (or, on another machine, fell silent). Every other
    host ends its run with this error, naming the host. Real JAX waits for its heartbeat timeout instead."""


class RemoteError(SpmdSimError, RuntimeError):
    """An exception raised on another host that could not be sent as itself (it does not pickle): its class
    name and message, and its notes."""
