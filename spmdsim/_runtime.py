"""The runtime: one thread per device (a *lane*), named-axis frames, and barrier rendezvous.

Vocabulary:

- A **frame** binds one axis name: its size, this lane's index, and the *instance* of the mapped call that
  bound it. Aligned nested calls (the k-th nested call of every outer device) share an instance, so a
  collective over an outer name from inside them pairs up the lanes with equal inner coordinates, exactly
  like ``pmap(vmap(f, axis_name='j'), axis_name='i')`` in JAX.
- A **world** holds every lane started under one top-level call, nested calls included, behind one lock.
  It knows every lane's state, so a collective that can never complete is reported the moment that becomes
  certain, never after a timeout.
- A **rendezvous** is one collective step of one communicator (the lanes that differ only in the named
  axes). Every lane of the axis takes part, also with ``axis_index_groups``: as on hardware, one op spans the
  whole axis and the rule runs per group. The last lane to arrive applies the rule outside the lock and
  hands each lane its result; the others sleep on their own wake lock (one wake-up per device).

A lane that raises fails the world: lanes waiting in a rendezvous wake and unwind with :class:`_Aborted`,
lanes still computing unwind at their next collective or finish, and the top-level call raises.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import sys
import threading
import time
from typing import Any, Callable, Hashable, Sequence

from spmdsim import _output, _threads
from spmdsim.errors import CollectiveDeadlockError, CollectiveMismatchError

__all__ = ["Frame", "Lane", "Channel", "current_lane", "run_mapped", "resolve_axes", "channel", "bind_collective",
           "user_site"]

_local = threading.local()
_call_ids = itertools.count()
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP_FILES = (_PACKAGE_DIR + os.sep, threading.__file__)

# Objects with ``record(rendezvous, released_at)``, called once per completed collective, and
# ``lane(label, start, end, outcome)``, once per device call (see spmdsim._trace).
observers: list = []
# Callables ``hook(rendezvous)`` run by the last arriver after the rule, before anyone is released (the
# stepping debugger pauses every device of the group there; see spmdsim.debug).
pause_hooks: list = []
# Callables ``hook(world, error)`` run once when a world first fails (a deadlock or mismatch found, or a device
# raised), under the world's lock and before any waiting lane is released, so that the held devices can be
# inspected (the stepping debugger stops there). A hook must neither raise nor take the world's lock.
failure_hooks: list = []

RUNNING, WAITING, JOINING, DONE, RAISED, ABORTED = "running", "waiting", "joining", "done", "raised", "aborted"


class _Aborted(BaseException):
    """Unwinds a lane after another lane failed the world. BaseException, so user ``except Exception``
    blocks inside mapped functions do not swallow it."""


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    name: Hashable
    size: int
    index: int
    instance: tuple   # identifies the mapped call, equal across aligned nested calls
    is_device: bool   # bound by pmap (True) or vmap (False)


def user_site(depth: int = 1) -> str:
    """``file:line`` of the innermost caller outside spmdsim (the user's line that called a collective)."""
    f = sys._getframe(depth)
    while f is not None and f.f_code.co_filename.startswith(_SKIP_FILES):
        f = f.f_back
    if f is None:
        return "<unknown>"
    return f"{_short_path(f.f_code.co_filename)}:{f.f_lineno}"


@functools.lru_cache(maxsize=1024)
def _short_path(filename: str) -> str:
    """Relative to the working directory (at first use) when the file lies under it, else as given."""
    if filename.startswith("<"):
        return filename
    rel = os.path.relpath(filename)
    return filename if rel.startswith("..") else rel


class Unnamed:
    """The axis name of a map called without ``axis_name``: no user name can match it."""

    def __init__(self, api: str):
        self.api = api

    def __repr__(self) -> str:
        return f"<unnamed {self.api} axis>"


def frames_label(frames: Sequence[Frame]) -> str:
    """``device 5 [i=1, j=1]``: the virtual device (row-major over the pmap frames) and the coordinate along
    every named axis; ``lane [j=2]`` under vmap only."""
    coords = ", ".join(f"{f.name}={f.index}" for f in frames if not isinstance(f.name, Unnamed))
    coords = f" [{coords}]" if coords else ""
    device_frames = [f for f in frames if f.is_device]
    if not device_frames:
        return f"lane {frames[-1].index}{coords}" if not coords else f"lane{coords}"
    device = 0
    for f in device_frames:
        device = device * f.size + f.index
    return f"device {device}{coords}"


class Lane:
    """One device (pmap) or one batch element (vmap) running the mapped function in its own thread.

    ``wake`` is held while the lane runs; a lane waiting in a rendezvous blocks on it until the last arriver
    (or a failure of the world) releases it: one wake-up per device, no shared lock to re-acquire.
    """

    __slots__ = ("world", "frames", "call", "state", "where", "waiting", "steps", "channels", "nested_calls",
                 "wake")

    def __init__(self, world: "World", frames: tuple[Frame, ...], call: "_Call"):
        self.world, self.frames, self.call = world, frames, call
        self.state, self.where, self.waiting = RUNNING, "", None
        self.steps: dict = {}     # communicator id -> [next step number], shared by its channels
        self.channels: dict = {}  # axis names -> Channel
        self.nested_calls = 0
        self.wake = threading.Lock()
        self.wake.acquire()

    @property
    def label(self) -> str:
        return frames_label(self.frames)

    def status_line(self) -> str:
        if self.state == WAITING:
            rv, rank = self.waiting
            return f"{self.label}: waiting in {describe(rv.signature)} (step {rv.seq}) at {rv.sites[rank]}"
        text = {RUNNING: "running", JOINING: "in a nested mapped call", DONE: "returned", ABORTED: "stopped",
                RAISED: f"raised {self.where}"}[self.state]
        return f"{self.label}: {text}"

    def status_row(self) -> tuple[str, ...]:
        """(device, state, collective, axis, step, source line) for the would-hang table."""
        if self.state == WAITING:
            rv, rank = self.waiting
            op, names, _, _, avals = rv.signature
            return (self.label, "waiting", f"{op}({_shown(avals)})", ", ".join(map(repr, names)), str(rv.seq),
                    rv.sites[rank])
        state = {RUNNING: "running", JOINING: "in nested call", DONE: "returned", ABORTED: "stopped",
                 RAISED: f"raised {self.where}"}[self.state]
        return (self.label, state, "", "", "", "")


def format_table(rows: Sequence[Sequence[str]]) -> str:
    """Rows of strings as an aligned text table; the first row is the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


class _Call:
    """One mapped call's lanes; ``remaining`` counts those not finished."""

    __slots__ = ("parent", "remaining")

    def __init__(self, parent: Lane | None, size: int):
        self.parent, self.remaining = parent, size


def _shown(avals) -> str:
    """``float32[4], int32[]``: the operands' shapes and dtypes of a call's signature."""
    return ", ".join(f"{dtype}{list(shape)}" for shape, dtype in avals)


def describe(signature: tuple) -> str:
    """``psum(float32[4], axis_name='i', axis_index_groups=((0, 1), (2, 3)))`` from a call's signature."""
    op, names, _, params, avals = signature
    extra = "".join(f", {k}={v!r}" for k, v in params if v is not None)
    return f"{op}({_shown(avals)}, axis_name={names[0] if len(names) == 1 else names!r}{extra})".replace(
        f"axis_name={names[0]}", f"axis_name={names[0]!r}", 1)


class Channel:
    """One lane's handle on the communicator of some named axes (the lanes that differ from it only along
    them), worked out once per lane and axis names: the frames in the order named, the names and sizes, this
    lane's ``rank`` (row-major over the frames) and the communicator's ``size``. ``key`` identifies the
    communicator (equal for every member, whatever the order of the names), ``kid`` is the world's short id
    for it and ``step`` the lane's counter of collectives on it."""

    __slots__ = ("frames", "names", "sizes", "rank", "size", "key", "kid", "step")

    def __init__(self, lane: "Lane | None", frames: list[Frame]):
        self.frames = frames
        self.names = tuple(f.name for f in frames)
        self.sizes = tuple(f.size for f in frames)
        self.rank = 0
        for f in frames:
            self.rank = self.rank * f.size + f.index
        self.size = math.prod(self.sizes)
        self.key = self.kid = self.step = None
        if frames:
            self.key = _membership(lane.frames, frozenset(f.instance for f in frames))
            self.kid = lane.world.communicator_id(self.key)
            self.step = lane.steps.setdefault(self.kid, [0])


def channel(lane: "Lane | None", axis_names: tuple, api: str) -> Channel:
    """This lane's :class:`Channel` for ``axis_names`` (a tuple of hashable names; empty: no communication).
    Raises what :func:`resolve_axes` raises for unbound or repeated names."""
    chan = lane.channels.get(axis_names) if lane is not None else None
    if chan is None:
        chan = Channel(lane, resolve_axes(lane, axis_names, api))
        if lane is not None:
            lane.channels[axis_names] = chan
    return chan


class _Rendezvous:
    """One collective step of one communicator: the blocks, lanes and sites by rank, then the results."""

    __slots__ = ("key", "seq", "signature", "size", "blocks", "lanes", "sites", "arrived", "results", "error",
                 "arrivals", "successor")

    def __init__(self, key, seq, signature, size):
        self.key, self.seq, self.signature, self.size = key, seq, signature, size
        self.blocks: list = [None] * size
        self.lanes: list = [None] * size
        self.sites: list = [None] * size
        self.arrived = 0
        self.results = None
        self.error: BaseException | None = None
        self.arrivals: list = [0.0] * size  # time.perf_counter() of each arrival, filled while observed
        self.successor: dict = {}  # the wake-up baton: lane -> the next waiting lane to wake


def _membership(frames: Sequence[Frame], axes: frozenset) -> tuple | None:
    """The communicator key of a lane with ``frames`` for a collective over the frame instances ``axes``."""
    present = {f.instance for f in frames}
    if not axes <= present:
        return None
    return axes, tuple((f.instance, f.index) for f in frames if f.instance not in axes)


class World:
    """Every lane of one top-level mapped call, and the open rendezvous, behind one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.lanes: list[Lane] = []
        self.finished: list[Lane] = []
        self.running = 0
        self.open: dict[tuple, _Rendezvous] = {}  # (communicator id, step) -> its open rendezvous
        self.failure: BaseException | None = None
        self._communicators: dict[tuple, int] = {}

    def communicator_id(self, key: tuple) -> int:
        """A small int standing for the communicator ``key`` (cheap to hash on every collective)."""
        with self.lock:
            return self._communicators.setdefault(key, len(self._communicators))

    # -- state changes; every method below that is not `_locked` takes the lock --------------------------

    def start(self, lanes: list[Lane], parent: Lane | None) -> None:
        with self.lock:
            self.lanes.extend(lanes)
            self.running += len(lanes)
            if parent is not None:
                parent.state = JOINING
                self.running -= 1

    def finish(self, lane: Lane, state: str, where: str = "") -> None:
        with self.lock:
            lane.state, lane.where = state, where
            self.running -= 1
            if state in (DONE, RAISED):
                self.finished.append(lane)
            call = lane.call
            call.remaining -= 1
            if call.remaining == 0 and call.parent is not None:
                call.parent.state = RUNNING
                self.running += 1
            if self.failure is None and state == DONE:
                for rv in list(self.open.values()):
                    if _membership(lane.frames, rv.key[0]) == rv.key:
                        self._fail_locked(self._deadlock(rv, f"{lane.label} returned without reaching it"))
                        return
                self._check_stuck_locked()

    def fail(self, error: BaseException) -> None:
        with self.lock:
            self._fail_locked(error)

    def _fail_locked(self, error: BaseException) -> None:
        """Record the first failure and wake every waiting lane (each unwinds with _Aborted)."""
        if self.failure is not None:
            return
        self.failure = error
        for hook in failure_hooks:
            hook(self, error)
        for rv in self.open.values():
            for lane in rv.lanes:
                if lane is not None and lane.state == WAITING:
                    lane.state = RUNNING
                    self.running += 1
                    lane.wake.release()

    # -- error reports ---------------------------------------------------------------------------------

    def state_table(self) -> list[str]:
        return [lane.status_line() for lane in self.lanes]

    def would_hang_report(self) -> str:
        """Every device's state as a table: where it is, the collective, axis, step and source line."""
        header = ("device", "state", "collective", "axis", "step", "source line")
        return format_table([header, *(lane.status_row() for lane in self.lanes)])

    def _deadlock(self, rv: _Rendezvous, reason: str) -> CollectiveDeadlockError:
        return CollectiveDeadlockError(
            f"{describe(rv.signature)} (step {rv.seq}) can never complete: {reason}. On real hardware this "
            f"program hangs.\n\n{self.would_hang_report()}\n\nFix: make every device of the group call the same "
            f"collectives in the same order (no collective inside a branch or loop that only some devices "
            f"take).", self.state_table())

    def _check_stuck_locked(self) -> None:
        """No lane can make progress: every unfinished lane waits in a rendezvous that lacks someone."""
        if self.running == 0 and self.open and self.failure is None:
            rv = min(self.open.values(), key=lambda r: r.seq)
            missing = [lane.label for lane in self.lanes if lane.state == WAITING and lane not in rv.lanes
                       and _membership(lane.frames, rv.key[0]) == rv.key]
            reason = (f"{', '.join(missing)} {'waits' if len(missing) == 1 else 'wait'} in another collective"
                      if missing else "the devices still missing are blocked elsewhere or finished")
            self._fail_locked(self._deadlock(rv, reason))

    def _mismatch(self, rv: _Rendezvous, lane: Lane, signature: tuple, site: str) -> CollectiveMismatchError:
        lines = [f"  {other.label}: {describe(rv.signature)} at {s}" for other, s in zip(rv.lanes, rv.sites)
                 if other is not None]
        lines.append(f"  {lane.label}: {describe(signature)} at {site}")
        return CollectiveMismatchError(
            f"devices called different collectives at step {rv.seq} of the same communicator:\n"
            + "\n".join(lines) + f"\nOn real hardware this hangs or exchanges garbage.\n\n{self.would_hang_report()}"
            "\n\nFix: every device of the group must make the same collective call (op, axis names, parameters, "
            "shapes, dtypes) in the same order.", self.state_table())

    # -- the rendezvous ----------------------------------------------------------------------------------

    def rendezvous(self, lane: Lane, chan: Channel, signature: tuple, site: str, leaves: list,
                   combine: Callable[[list], list]) -> list:
        rank, size = chan.rank, chan.size
        with self.lock:
            if self.failure is not None:
                raise _Aborted
            step = chan.step
            seq = step[0]
            step[0] = seq + 1
            at = (chan.kid, seq)
            rv = self.open.get(at)
            created = rv is None
            if created:
                rv = self.open[at] = _Rendezvous(chan.key, seq, signature, size)
            elif rv.signature != signature or rv.lanes[rank] is not None:
                self._fail_locked(self._mismatch(rv, lane, signature, site))
                raise _Aborted
            rv.blocks[rank], rv.lanes[rank], rv.sites[rank] = leaves, lane, site
            rv.arrived += 1
            if observers:
                rv.arrivals[rank] = time.perf_counter()
            last = rv.arrived == size
            if not last:
                lane.state, lane.waiting = WAITING, (rv, rank)
                self.running -= 1
                if created and self.finished:  # a member that already finished will never come
                    key = chan.key
                    done = next((d for d in self.finished if _membership(d.frames, key[0]) == key), None)
                    if done is not None:
                        self._fail_locked(self._deadlock(rv, f"{done.label} {done.state} without reaching it"))
                if self.running == 0:
                    self._check_stuck_locked()
            else:  # the others become runnable now; they get their results after the rule has run
                del self.open[at]
                for other in rv.lanes:
                    other.state = RUNNING
                self.running += size - 1
        if not last:
            lane.wake.acquire()
            successor = rv.successor.pop(lane, None)
            if successor is not None:  # pass the baton before doing anything else
                successor.wake.release()
            if rv.results is None:  # released by a failure (or the rule raised in the last arriver)
                raise _Aborted
            return rv.results[rank]
        try:
            rv.results = combine(rv.blocks)
            _output.release_all()
            for hook in pause_hooks:  # the stepping debugger: every device is held here
                hook(rv)
        except BaseException as e:
            rv.error = e
            raise
        finally:
            # Wake the waiting lanes one after another (each wakes the next): one wake-up per device, and no
            # herd of thousands of runnable threads fighting for the GIL at once.
            released = time.perf_counter() if observers else 0.0
            waiting = [other for other in rv.lanes if other is not lane]
            rv.successor = dict(zip(waiting, waiting[1:]))
            if waiting:
                waiting[0].wake.release()
        for observer in observers:
            observer.record(rv, released)
        return rv.results[rank]


def current_lane() -> Lane | None:
    """The lane running in this thread, or None outside any mapped function."""
    return getattr(_local, "lane", None)


def resolve_axes(lane: Lane | None, axis_names: tuple, api: str) -> list[Frame]:
    """The frames bound to ``axis_names`` in this lane (innermost wins), in the order given.

    Raises NameError for a name not bound by an enclosing pmap/vmap (JAX's class and its phrase
    "unbound axis name: <name>"), ValueError for a repeated name.
    """
    if len(set(axis_names)) != len(axis_names):
        raise ValueError(f"{api}: repeated axis in `source` argument: {axis_names!r}. Name each axis once.")
    frames = lane.frames if lane is not None else ()
    out = []
    for name in axis_names:
        for frame in reversed(frames):
            if frame.name == name:
                out.append(frame)
                break
        else:
            bound = ", ".join(repr(f.name) for f in frames) or "none (not inside spmdsim.pmap/vmap)"
            raise NameError(
                f"Found an unbound axis name: {name}. {api} was called with axis_name={name!r}, but the axis names "
                f"bound here are: {bound}. To fix this, call {api} inside a function mapped with "
                f"spmdsim.pmap(..., axis_name={name!r}) or spmdsim.vmap(..., axis_name={name!r}).")
    return out


def bind_collective(op: str, leaves: list, chan: Channel, *, params: tuple, combine: Callable[[list], list],
                    site: str | None = None) -> list:
    """Take part in one collective over the communicator of ``chan`` (see :func:`channel`) and return this
    lane's result leaves.

    ``params`` are the call's (name, value) pairs; with ``op``, the axes and the leaves' shapes and dtypes they
    form the signature that every device of the communicator must agree on. ``combine(blocks)`` receives
    every lane's leaves indexed by the row-major index over the channel's frames (in the order named) and
    returns the results in the same indexing; it runs once, in the last lane to arrive.
    """
    signature = (op, chan.names, chan.sizes, params, tuple([(x.shape, x.dtype) for x in leaves]))
    lane = _local.lane
    return lane.world.rendezvous(lane, chan, signature, site or user_site(2), leaves, combine)


def run_mapped(body: Callable[[int], Any], *, axis_name: Hashable, size: int, is_device: bool) -> list:
    """Run ``body(i)`` for ``i in range(size)``, each in its own thread with ``axis_name`` bound; return
    the results in index order.

    Called from inside a lane, the new lanes join that lane's world (a nested map). Raises the first error
    in index order with the lane named in a note and the other lanes' errors attached (``device_errors``),
    or the world's CollectiveMismatchError/CollectiveDeadlockError.
    """
    parent = current_lane()
    if parent is None:
        world, frames, instance = World(), (), (next(_call_ids),)
    else:
        world, frames = parent.world, parent.frames
        instance = frames[-1].instance + (parent.nested_calls,)
        parent.nested_calls += 1
    call = _Call(parent, size)
    lanes = [Lane(world, frames + (Frame(axis_name, size, i, instance, is_device),), call) for i in range(size)]
    results: list = [None] * size
    errors: list[BaseException | None] = [None] * size

    def target(i: int) -> None:
        lane = lanes[i]
        _local.lane = lane
        start, outcome = time.perf_counter(), "returned"
        try:
            results[i] = body(i)
        except _Aborted:
            outcome = "stopped"
            world.finish(lane, ABORTED)
        except BaseException as e:
            outcome = "raised"
            errors[i] = e
            world.fail(e)
            world.finish(lane, RAISED, f"{type(e).__name__}: {e}")
        else:
            world.finish(lane, DONE)
        for observer in observers:
            observer.lane(lane.label, start, time.perf_counter(), outcome)
        _local.lane = None  # a reused thread must not keep this call's lane (and its world) alive

    stream = _output.begin(current_lane) if parent is None else None
    world.start(lanes, parent)
    try:
        wait = _threads.run_threads([functools.partial(target, i) for i in range(size)],
                                    [f"spmdsim {lane.label}" for lane in lanes])
        try:
            wait()
        except BaseException as e:  # KeyboardInterrupt in the caller: stop every lane, then wait for them
            world.fail(e)
            wait()
            raise
    finally:
        _output.end(stream)

    raised = [(lane, e) for lane, e in zip(lanes, errors) if e is not None]
    if raised:
        lane, first = raised[0]
        if not hasattr(first, "device_errors"):
            first.add_note(f"spmdsim: raised on {lane.label}.")
            first.device_errors = {other.label: e for other, e in raised}
            for other, e in raised[1:]:
                first.add_note(f"spmdsim: {other.label} also raised {type(e).__name__}: {e}")
        raise first.with_traceback(first.__traceback__)
    if world.failure is not None:
        if parent is not None:
            raise _Aborted
        raise world.failure
    return results
