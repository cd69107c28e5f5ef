"""Lanes, their world, and the barrier rendezvous where the lanes of one communicator meet.

- A **lane** is one device (pmap, shard_map) or one batch element (vmap) running the mapped function in its
  own thread. Its state (running, waiting in a rendezvous, in a nested call, returned, raised, stopped) is
  always known to its world.
- A **world** holds every lane started under one top-level mapped call, nested calls included, behind one
  lock. Because it knows every lane's state, a collective that can never complete is reported the moment
  that becomes certain (:class:`~spmdsim.errors.CollectiveDeadlockError`), never after a timeout, and lanes
  that call different collectives at the same step are reported at once
  (:class:`~spmdsim.errors.CollectiveMismatchError`).
- A **rendezvous** is one collective step of one communicator (see :mod:`spmdsim.runtime._axes`). Every lane of the
  communicator takes part, also with ``axis_index_groups``: as on hardware, one op spans the whole axis and
  the rule runs per group. The last lane to arrive applies the rule outside the lock and hands each lane its
  result; the others sleep on their own wake lock and are woken one after another (each wakes the next: one
  wake-up per device, no herd of runnable threads fighting for the GIL).

A lane that raises fails the world: lanes waiting in a rendezvous wake and unwind with :class:`Aborted`,
lanes still computing unwind at their next collective or when they finish.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
from typing import Callable

from spmdsim.runtime import _output
from spmdsim.runtime._process_group import SINGLE_PROCESS, ProcessGroup
from spmdsim.runtime._axes import Channel, Frame, axis_ids, frames_label, membership, resolve_axes
from spmdsim.runtime._reports import (TABLE_HEADER, Signature, deadlock_text, describe, format_table, mismatch_text,
                              shown_avals)
from spmdsim.errors import CollectiveDeadlockError, CollectiveMismatchError

__all__ = ["Lane", "World", "Rendezvous", "Aborted", "CallCount", "observers", "pause_hooks", "failure_hooks",
           "RUNNING", "WAITING", "JOINING", "DONE", "RAISED", "ABORTED"]

# Objects with ``record(rendezvous, released_at)``, called once per completed collective, and
# ``lane(label, start, end, outcome)``, once per device call (see spmdsim.tools._trace), and ``thread``: the ident of
# the thread whose top-level mapped calls they observe (nested calls included), or None for every thread. A
# world takes its observers when it starts, so each sees whole calls only.
observers: list = []
# Callables ``hook(rendezvous)`` run by the last arriver after the rule, before anyone is released (the
# stepping debugger pauses every device of the group there; see spmdsim.debug).
pause_hooks: list = []
# Callables ``hook(world, error)`` run once when a world first fails (a deadlock or mismatch found, or a device
# raised), under the world's lock and before any waiting lane is released, so that the held devices can be
# inspected (the stepping debugger stops there). A hook must neither raise nor take the world's lock.
failure_hooks: list = []

HISTORY = 32  # collectives a lane remembers, to tell a mismatch from a deadlock (see World._missing)
RUNNING, WAITING, JOINING, DONE, RAISED, ABORTED = "running", "waiting", "joining", "done", "raised", "aborted"
_STATE_TEXT = {RUNNING: "running", JOINING: "in nested call", DONE: "returned", ABORTED: "stopped"}


class Aborted(BaseException):
    """Unwinds a lane after another lane failed the world. BaseException, so user ``except Exception``
    blocks inside mapped functions do not swallow it."""


class CallCount:
    """One mapped call's lanes: ``remaining`` counts those not finished; ``parent`` is the lane that made
    the call (None at top level)."""

    __slots__ = ("parent", "remaining")

    def __init__(self, parent: "Lane | None", size: int):
        self.parent, self.remaining = parent, size


class Lane:
    """One device or batch element. ``wake`` is held while the lane runs; a lane waiting in a rendezvous
    blocks on it until the last arriver (or a failure of the world) releases it."""

    __slots__ = ("world", "frames", "call", "state", "where", "waiting", "steps", "channels", "nested_calls",
                 "wake", "label", "thread_name", "thread", "calls", "history", "templates")

    def __init__(self, world: "World", frames: tuple[Frame, ...], call: CallCount, label: str | None = None,
                 templates: dict | None = None):
        self.world, self.frames, self.call = world, frames, call
        self.state, self.where, self.waiting = RUNNING, "", None
        self.steps: dict = {}     # communicator id -> [next step number], shared by its channels
        self.channels: dict = {}  # axis names -> Channel
        self.nested_calls = 0
        self.wake = threading.Lock()
        self.wake.acquire()
        self.label = frames_label(frames) if label is None else label
        self.thread_name = f"spmdsim {self.label}"
        self.thread: threading.Thread | None = None
        self.templates = templates  # axis names -> a Channel to renew, shared across calls; or None
        self.calls = 0        # collectives called so far, over every communicator
        self.history = None   # the last HISTORY of them: (index, communicator, step, signature, site, api)

    def channel(self, axis_names: tuple, api: str) -> Channel:
        """A new channel of this lane over ``axis_names`` (NameError for an unbound name). The lanes of a
        top-level call resolve each tuple of names once per mesh (``templates``), and their communicators are
        interned objects: equal keys, one object, hashed by identity, no world lock."""
        template = None if self.templates is None else self.templates.get(axis_names)
        if template is None:
            frames = resolve_axes(self.frames, axis_names, api)
            if not frames:
                return Channel(frames)
            key = membership(self.frames, axis_ids(frames))
            if self.templates is None:
                comm = self.world.communicator_id(key)
                return Channel(frames, key, comm, self.steps.setdefault(comm, [0]))
            comm = _interned(key)
            template = self.templates[axis_names] = Channel(frames, key, comm)
        comm = template.comm
        return template.renewed(comm, self.steps.setdefault(comm, [0]))

    def recycle(self) -> None:
        """Reset for the next call of the same placement, after a call in which every lane returned: no
        reference to that call's world, rendezvous (the blocks) or thread is kept; each channel's step counter
        starts again at 0 and its mailbox is emptied; the wake lock is held, as after every collective."""
        self.world = self.call = self.waiting = self.thread = None
        self.state = RUNNING  # `where` is already "": it says how a lane that did not return ended
        self.nested_calls = 0
        if self.calls:  # collectives were called (psend's included): their counters, mailboxes and history
            self.calls = 0
            for step in self.steps.values():
                step[0] = 0
            for chan in self.channels.values():
                if chan.mailbox:
                    chan.mailbox.clear()
            self.history.clear()

    def status_row(self) -> tuple[str, ...]:
        """(device, state, collective, axis, step, source line) for the device tables."""
        if self.state == WAITING:
            rv, rank = self.waiting
            sig = rv.signature_of(rank)
            return (self.label, "waiting", f"{rv.apis[rank] or sig.op}({shown_avals(sig.avals)})",
                    ", ".join(map(repr, sig.names)), str(rv.seq), rv.sites[rank])
        state = f"raised {self.where}" if self.state == RAISED else _STATE_TEXT[self.state]
        return (self.label, state, "", "", "", "")

    def status_line(self) -> str:
        if self.state == WAITING:
            rv, rank = self.waiting
            return f"{self.label}: waiting in {describe(rv.signature_of(rank), rv.apis[rank])} (step {rv.seq}) at " \
                   f"{rv.sites[rank]}"
        return f"{self.label}: {self.status_row()[1]}"


class _Communicator:
    """The communicator of a top-level call's lanes for one key (see :func:`spmdsim.runtime._axes.membership`),
    interned: one object per key, hashed by identity."""

    __slots__ = ("key",)

    def __init__(self, key: tuple):
        self.key = key

    def __repr__(self) -> str:
        return f"<communicator {self.key!r}>"


_communicators: dict = {}
_communicators_lock = threading.Lock()


def _interned(key: tuple) -> _Communicator:
    with _communicators_lock:
        comm = _communicators.get(key)
        if comm is None:
            comm = _communicators[key] = _Communicator(key)
        return comm


class Rendezvous:
    """One collective step of one communicator: the blocks, lanes, sites and public API names by rank (the
    rank within the communicator), then the results. ``conflicts``: rank -> signature of the lanes that arrived
    with a call other than the first arriver's (``signature``), None while every call is the same; such a step
    never completes, and its members wait until every one of them has arrived (or cannot), so that the mismatch
    reported names every member's call, the same whatever the order of arrival."""

    __slots__ = ("key", "key_comm", "seq", "signature", "size", "blocks", "lanes", "sites", "apis", "arrived",
                 "results", "error", "arrivals", "successor", "conflicts")

    def __init__(self, key, seq: int, signature: Signature, size: int):
        self.key, self.seq, self.signature, self.size = key, seq, signature, size
        self.blocks: list = [None] * size
        self.lanes: list = [None] * size
        self.sites: list = [None] * size
        self.apis: list = [None] * size
        self.arrived = 0
        self.results = None
        self.error: BaseException | None = None
        self.arrivals: list = [0.0] * size  # time.perf_counter() of each arrival, filled when observed
        self.successor: dict = {}  # the wake-up baton: lane -> the next waiting lane to wake
        self.conflicts: dict | None = None

    def signature_of(self, rank: int) -> Signature:
        """The call of the lane of ``rank``."""
        return self.signature if self.conflicts is None else self.conflicts.get(rank, self.signature)


_CALLS = itertools.count()


class World:
    """Every lane of one top-level mapped call, and the open rendezvous, behind one lock. ``observers``: those
    of :data:`observers` that watch the calling thread. ``group``: the process group that made the call (see
    :mod:`spmdsim.runtime._process_group`; its devices' threads run in it); ``failure_callbacks``: ``callback(error)``
    run once, under the lock, when the world fails (they must only wake someone)."""

    def __init__(self, group: ProcessGroup = SINGLE_PROCESS):
        me = threading.get_ident()
        self.call = next(_CALLS)  # this top-level mapped call's number in the process (a trace groups by it)
        self.observers = [o for o in observers if getattr(o, "thread", None) in (None, me)]
        self.group = group
        self.failure_callbacks: list = []
        self.lock = threading.Lock()
        self.lanes: list[Lane] = []
        self.finished: list[Lane] = []
        self.running = 0
        self.open: dict[tuple, Rendezvous] = {}  # (communicator id, step) -> its open rendezvous
        self.failure: BaseException | None = None
        self._communicators: dict[tuple, int] = {}

    def communicator_id(self, key: tuple) -> int:
        """A small int standing for the communicator ``key``."""
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
            if self.open and self.failure is None and state == DONE:
                for rv in list(self.open.values()):
                    if membership(lane.frames, rv.key[0]) == rv.key:
                        self._fail_locked(self._missing(rv, lane, f"{lane.label} returned without reaching it"))
                        return
                self._check_stuck_locked()

    def fail(self, error: BaseException) -> None:
        with self.lock:
            self._fail_locked(error)

    def _fail_locked(self, error: BaseException) -> None:
        """Record the first failure and wake every waiting lane (each unwinds with Aborted)."""
        if self.failure is not None:
            return
        self.failure = error
        for hook in failure_hooks:
            hook(self, error)
        for callback in self.failure_callbacks:
            callback(error)
        for rv in self.open.values():
            for lane in rv.lanes:
                if lane is not None and lane.state == WAITING:
                    lane.state = RUNNING
                    self.running += 1
                    lane.wake.release()

    # -- error reports ---------------------------------------------------------------------------------

    def state_table(self) -> list[str]:
        return [lane.status_line() for lane in self.lanes]

    def device_table(self) -> str:
        """Every device's state as a table: where it is, the collective, axis, step and source line."""
        return format_table([TABLE_HEADER, *(lane.status_row() for lane in self.lanes)])

    def _deadlock(self, rv: Rendezvous, reason: str) -> CollectiveDeadlockError:
        return CollectiveDeadlockError(
            deadlock_text(f"{describe(rv.signature, _first(rv.apis))} (step {rv.seq})", reason, self.device_table()),
            self.state_table())

    def _missing(self, rv: Rendezvous, lane: Lane, reason: str) -> BaseException:
        """``lane`` finished without reaching ``rv``: a mismatch when, at the position in its sequence of
        collectives where a lane waiting in ``rv`` called it, ``lane`` called a collective of another
        communicator (``psum`` over 'j' where the others of its 'i' group call ``psum`` over 'i'); otherwise a
        deadlock."""
        if rv.conflicts is not None:  # its members called different collectives: that is the report
            return self._conflict(rv)
        waiter = next(w for w in rv.lanes if w is not None)
        index = next((k for k, comm, step, *_ in waiter.history if comm == rv.key_comm and step == rv.seq), None)
        other = next((call for k, comm, _step, *call in lane.history or () if k == index and comm != rv.key_comm),
                     None)
        if other is None:
            return self._deadlock(rv, reason)
        return self._mismatch(rv, [(lane, *other)], f"at step {rv.seq} of {rv.signature.op} over "
                                                    f"{', '.join(map(repr, rv.signature.names))} (the "
                                                    f"{ordinal(index + 1)} collective of each device)")

    def _check_stuck_locked(self) -> None:
        """No lane can make progress: every unfinished lane waits in a rendezvous that lacks someone. A
        missing member that waits in another collective called something else at this point: a mismatch;
        otherwise the missing members finished or wait in a nested call: a deadlock."""
        if self.running == 0 and self.open and self.failure is None:
            broken = min((r for r in self.open.values() if r.conflicts is not None), key=lambda r: r.seq, default=None)
            rv = broken or min(self.open.values(), key=lambda r: r.seq)
            elsewhere = [lane for lane in self.lanes if lane.state == WAITING and lane not in rv.lanes
                         and membership(lane.frames, rv.key[0]) == rv.key]
            if broken is not None:
                self._fail_locked(self._conflict(rv, [(lane, *_call_of(*lane.waiting)) for lane in elsewhere]))
            elif elsewhere:
                calls = [(lane, *_call_of(*lane.waiting)) for lane in elsewhere]
                self._fail_locked(self._mismatch(rv, calls, f"at step {rv.seq} of {rv.signature.op} over "
                                                           f"{', '.join(map(repr, rv.signature.names))}"))
            else:
                self._fail_locked(self._deadlock(rv, "the devices still missing are blocked elsewhere or finished"))

    def _conflict(self, rv: Rendezvous, others: list = ()) -> CollectiveMismatchError:
        """The mismatch of a step whose members arrived with different calls (``rv.conflicts``)."""
        return self._mismatch(rv, list(others), f"at step {rv.seq} of the same communicator")

    def _mismatch(self, rv: Rendezvous, others: list, where: str) -> CollectiveMismatchError:
        """``others``: (lane, signature, site, api) of the lanes whose call differs from ``rv``'s. Every call is
        listed in device order (the order of the table), whatever the order the devices arrived in; the table
        shows each device's own call (a device that called a collective and is not waiting in it is shown
        ``calling`` it)."""
        calls = [(lane, rv.signature_of(rank), site, api)
                 for rank, (lane, site, api) in enumerate(zip(rv.lanes, rv.sites, rv.apis, strict=True))
                 if lane is not None]
        calls += [call for call in others if all(call[0] is not c[0] for c in calls)]
        order = {id(lane): k for k, lane in enumerate(self.lanes)}
        calls.sort(key=lambda call: order.get(id(call[0]), len(order)))
        lines = [f"{lane.label}: {describe(signature, api)} at {site}" for lane, signature, site, api in calls]
        rows, states = {}, {}
        for lane, signature, site, api in calls:
            if lane.state == RUNNING:
                rows[id(lane)] = (lane.label, "calling", f"{api or signature.op}({shown_avals(signature.avals)})",
                                  ", ".join(map(repr, signature.names)), str(rv.seq), site)
                states[id(lane)] = f"{lane.label}: calling {describe(signature, api)} at {site}"
        table = format_table([TABLE_HEADER, *(rows.get(id(lane)) or lane.status_row() for lane in self.lanes)])
        states = [states.get(id(lane)) or lane.status_line() for lane in self.lanes]
        return CollectiveMismatchError(mismatch_text(where, lines, table), states)

    # -- the rendezvous ----------------------------------------------------------------------------------

    def rendezvous(self, lane: Lane, chan: Channel, signature: Signature, site: str, api: str | None, leaves: list,
                   combine: Callable[[list], list]) -> list:
        """Meet the other lanes of ``chan``'s communicator at its next step; return this lane's results.

        ``combine(blocks)`` receives every lane's leaves by rank and returns the results by rank; it runs
        once, in the last lane to arrive, outside the lock.
        """
        rank, size = chan.rank, chan.size
        with self.lock:
            if self.failure is not None:
                raise Aborted
            step = chan.step
            seq = step[0]
            step[0] = seq + 1
            at = (chan.comm, seq)
            rv = self.open.get(at)
            created = rv is None
            if created:
                rv = self.open[at] = Rendezvous(chan.key, seq, signature, size)
                rv.key_comm = chan.comm
            elif rv.lanes[rank] is not None:
                self._fail_locked(self._mismatch(rv, [(lane, signature, site, api)],
                                                 f"at step {rv.seq} of the same communicator"))
                raise Aborted
            elif rv.signature != signature:  # a mismatch: reported once every member has arrived (or cannot)
                if rv.conflicts is None:
                    rv.conflicts = {}
                rv.conflicts[rank] = signature
            rv.blocks[rank], rv.lanes[rank], rv.sites[rank], rv.apis[rank] = leaves, lane, site, api
            if lane.history is None:
                lane.history = collections.deque(maxlen=HISTORY)
            lane.history.append((lane.calls, chan.comm, seq, signature, site, api))
            lane.calls += 1
            rv.arrived += 1
            if self.observers:
                rv.arrivals[rank] = time.perf_counter()
            last = rv.arrived == size and rv.conflicts is None
            if not last:
                lane.state, lane.waiting = WAITING, (rv, rank)
                self.running -= 1
                if rv.conflicts is not None and rv.arrived == size:  # all here, not all with the same call
                    self._fail_locked(self._conflict(rv))
                elif created and self.finished:  # a member that already finished will never come
                    key = chan.key
                    done = next((d for d in self.finished if membership(d.frames, key[0]) == key), None)
                    if done is not None:
                        self._fail_locked(self._missing(rv, done, f"{done.label} {done.state} without reaching it"))
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
                raise Aborted
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
            released = time.perf_counter() if self.observers else 0.0
            waiting = [other for other in rv.lanes if other is not lane]
            rv.successor = dict(zip(waiting, waiting[1:]))
            if waiting:
                waiting[0].wake.release()
        for observer in self.observers:
            observer.record(rv, released)
        return rv.results[rank]


def _call_of(rv: Rendezvous, rank: int) -> tuple:
    """(signature, site, api) of the lane of ``rank`` in ``rv``."""
    return rv.signature, rv.sites[rank], rv.apis[rank]


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _first(apis: list) -> str | None:
    return next((a for a in apis if a is not None), None)
