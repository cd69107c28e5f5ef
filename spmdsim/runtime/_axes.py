"""Named axes: the frames a lane's mapped calls bind, and the communicator a collective's axis names select.

- A **frame** binds one axis name: its size, this lane's index along it, and the *instance* of the mapped
  call that bound it. Aligned nested calls (the k-th nested call of every outer device) share an instance,
  so a collective over an outer name from inside them pairs up the lanes with equal inner coordinates,
  exactly like ``pmap(vmap(f, axis_name='j'), axis_name='i')`` in JAX. A mesh (shard_map) binds several
  frames at once, one per mesh axis, with one instance.
- A **channel** is one lane's handle on the communicator of some named axes: the lanes that differ from it
  only along those axes. Its ``rank`` is row-major over the named frames in the order given (JAX's
  ``axis_index(('i', 'j'))``), its ``size`` their product.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Hashable, Sequence

from spmdsim.runtime import _process_group
from spmdsim.errors import UnboundAxisError

__all__ = ["Frame", "Unnamed", "Channel", "frames_label", "resolve_axes", "axis_ids", "membership"]


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    """One named axis as a lane sees it."""

    name: Hashable
    size: int
    index: int
    instance: tuple   # identifies the mapped call, equal across aligned nested calls
    is_device: bool   # bound by pmap/shard_map (True: counts virtual devices) or vmap (False)


class Unnamed:
    """The axis name of a map called without ``axis_name``: no user name can match it."""

    def __init__(self, api: str):
        self.api = api

    def __repr__(self) -> str:
        return f"<unnamed {self.api} axis>"


def frames_label(frames: Sequence[Frame]) -> str:
    """``device 5 [i=1, j=1]``: the virtual device (row-major over the device frames) and the coordinate along
    every named axis (``host 1 device 5 [i=5]`` in a multi-host run); ``lane [j=2]`` under vmap only."""
    coords = ", ".join(f"{f.name}={f.index}" for f in frames if not isinstance(f.name, Unnamed))
    coords = f" [{coords}]" if coords else ""
    device_frames = [f for f in frames if f.is_device]
    if not device_frames:
        return f"lane {frames[-1].index}{coords}" if not coords else f"lane{coords}"
    device = 0
    for f in device_frames:
        device = device * f.size + f.index
    return f"{_host_prefix(device_frames)}device {device}{coords}"


def _host_prefix(device_frames: Sequence[Frame]) -> str:
    """``host 1 `` in a multi-host run (see :mod:`spmdsim.runtime._process_group`): the host of the top-level call's
    device (nested calls run on it)."""
    found = _process_group.layout()
    if found is None:
        return ""
    top = [f for f in device_frames if len(f.instance) <= 1]
    if math.prod(f.size for f in top) != found[0] * found[1]:
        return ""
    device = 0
    for f in top:
        device = device * f.size + f.index
    return f"host {device // found[1]} "


def axis_ids(frames: Sequence[Frame]) -> frozenset:
    """The identities of ``frames``' axes: (instance, name) pairs, one per bound axis."""
    return frozenset((f.instance, f.name) for f in frames)


def membership(frames: Sequence[Frame], axes: frozenset) -> tuple | None:
    """The communicator key of a lane with ``frames`` for a collective over ``axes`` (see :func:`axis_ids`),
    or None when the lane does not bind them all. Equal for exactly the lanes that differ only along
    ``axes``."""
    if not axes <= axis_ids(frames):
        return None
    return axes, tuple((f.instance, f.name, f.index) for f in frames if (f.instance, f.name) not in axes)


class Channel:
    """One lane's handle on the communicator of ``frames`` (see the module docstring).

    ``key`` identifies the communicator (equal for every member, whatever the order of the names), ``comm``
    is the world's small int for it (cheap to hash on every collective) and ``step`` the lane's counter of
    collectives on it, shared by every channel of the same communicator (``('i','j')`` and ``('j','i')``).
    """

    __slots__ = ("frames", "names", "sizes", "rank", "size", "key", "comm", "step", "mailbox")

    def __init__(self, frames: list[Frame], key=None, comm=None, step=None):
        self.frames = frames
        self.names = tuple(f.name for f in frames)
        self.sizes = tuple(f.size for f in frames)
        self.rank = 0
        for f in frames:
            self.rank = self.rank * f.size + f.index
        self.size = math.prod(self.sizes)
        self.key, self.comm, self.step = key, comm, step
        self.mailbox: dict = {}  # psend -> precv transfers waiting on this lane, per perm

    def renewed(self, comm, step) -> "Channel":
        """The same lane's channel in a later call of the same mesh: a copy with its own communicator id, step
        counter and mailbox (what the constructor would compute, not computed again)."""
        chan = object.__new__(Channel)
        chan.frames, chan.names, chan.sizes, chan.rank, chan.size = (self.frames, self.names, self.sizes, self.rank,
                                                                     self.size)
        chan.key, chan.comm, chan.step, chan.mailbox = self.key, comm, step, {}
        return chan


def resolve_axes(frames: Sequence[Frame], axis_names: tuple, api: str) -> list[Frame]:
    """The frames bound to ``axis_names`` (innermost wins), in the order given.

    Raises NameError for a name no enclosing map binds (JAX's class and its phrase "unbound axis name:
    <name>", with a "did you mean" when a bound name is close), ValueError for a repeated name.
    """
    if len(set(axis_names)) != len(axis_names):
        raise ValueError(f"{api}: repeated axis in `source` argument: {axis_names!r}. Name each axis once.")
    out = []
    for name in axis_names:
        for frame in reversed(frames):
            if frame.name == name:
                out.append(frame)
                break
        else:
            raise UnboundAxisError(_unbound_message(name, frames, api))
    return out


def _unbound_message(name, frames: Sequence[Frame], api: str) -> str:
    if not frames:
        return (f"Found an unbound axis name: {name}. {api} was called outside any mapped function. To fix this, "
                f"call {api} inside a function mapped with pmap(..., axis_name={name!r}), vmap(..., "
                f"axis_name={name!r}) or shard_map over a mesh with an axis {name!r}.")
    return unbound_message(name, [f.name for f in frames], api)


def unbound_message(name, bound: Sequence[Hashable], api: str, where: str = "") -> str:
    """The message of an :class:`UnboundAxisError` for ``name`` in a map whose bound axis names are ``bound``
    (outermost first; unnamed axes skipped): "did you mean" the closest one. ``where`` (``" at f.py:3"``) says
    where ``api`` was called, for the JAX front end (whose error is raised while JAX traces the body)."""
    bound = [b for b in bound if not isinstance(b, Unnamed)]
    close = difflib.get_close_matches(str(name), [str(b) for b in bound], n=1)
    if close:
        return (f"Found an unbound axis name: {name}. Did you mean {close[0]!r}? {api} was called{where} with "
                f"axis_name={name!r}, but the axis names bound here are: {', '.join(map(repr, bound))}.")
    return (f"Found an unbound axis name: {name}. {api} was called{where} with axis_name={name!r}, but the axis "
            f"names bound here are: {', '.join(map(repr, bound)) or 'none (the enclosing map has no axis_name)'}. "
            f"Name the axis in the enclosing map (pmap(..., axis_name={name!r})) or use one of those names.")
