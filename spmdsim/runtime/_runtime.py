"""The runtime: run a mapped function once per lane, each in its own thread, and report what went wrong.

:func:`run_mapped` starts one lane per index of the mapped axes (a mesh: several axes at once) in their own
threads (:mod:`spmdsim.runtime._threads`), joins them to the caller's world when called from inside a lane (a nested
map), and turns what the lanes did into one outcome: the results in index order, the first device error with
the others attached, or the world's CollectiveMismatchError / CollectiveDeadlockError. One Ctrl-C ends the
call within half a second, whatever the devices are doing (:func:`_interrupted`).

Collectives reach the other lanes through :func:`channel` and the world's rendezvous
(:mod:`spmdsim.runtime._rendezvous`); :mod:`spmdsim.primitives._primitives` binds them.
"""
from __future__ import annotations

import functools
import itertools
import operator
import os
import sys
import threading
import time
import types
from typing import Any, Callable, Hashable, Sequence

from spmdsim.runtime import _blas, _fpenv, _output, _process_group, _threads
from spmdsim.runtime._axes import Channel, Frame, Unnamed, frames_label, resolve_axes
from spmdsim.runtime._process_group import SINGLE_PROCESS
from spmdsim.runtime._rendezvous import (ABORTED, DONE, RAISED, WAITING, Aborted, CallCount, Lane, Rendezvous,  # noqa: F401
                                 World, failure_hooks, observers, pause_hooks)
from spmdsim.runtime._reports import cell_number, describe, format_table, who  # noqa: F401  (describe, format_table: for the debugger)

__all__ = ["Frame", "Lane", "Channel", "Unnamed", "current_lane", "run_mapped", "run_lanes", "outcome",
           "top_level_placement", "channel", "user_site", "api_boundary", "frames_label", "observers", "pause_hooks"]

class _Local(threading.local):
    lane = None  # the lane running in this thread; a class default: no exception to catch when unset
    call_name = None  # the mapped function's name while run_mapped hands a call to a process group


_local = _Local()
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # spmdsim/
_SKIP_FILES = (_PACKAGE_DIR + os.sep, threading.__file__)
_USER_FILES = (os.path.join(_PACKAGE_DIR, "demo.py"),)  # spmdsim's files that are programs
INTERRUPT_GRACE_SECONDS = 0.5
_thread_name = operator.attrgetter("thread_name")  # "spmdsim device 3 [i=3]": a device thread's name
_FILTER_TRACEBACKS = os.environ.get("SPMDSIM_TRACEBACK_FILTERING", "on") != "off"


def current_lane() -> Lane | None:
    """The lane running in this thread, or None outside any mapped function."""
    return _local.lane


def lane_local() -> threading.local:
    """The thread-local whose ``lane`` attribute is :func:`current_lane` (read directly on hot paths)."""
    return _local


def channel(lane: Lane | None, axis_names: tuple, api: str) -> Channel:
    """``lane``'s :class:`~spmdsim.runtime._axes.Channel` for ``axis_names`` (a tuple of hashable names; empty: no
    communication), made once per lane and names. Raises NameError for a name no enclosing map binds
    (with a "did you mean"), ValueError for a repeated name."""
    if lane is None:
        return Channel(resolve_axes((), axis_names, api))
    chan = lane.channels.get(axis_names)
    if chan is None:
        chan = lane.channels[axis_names] = lane.channel(axis_names, api)
    return chan


def user_site(depth: int = 1) -> str:
    """``file:line`` of the innermost caller outside spmdsim (the user's line that called a collective)."""
    f = sys._getframe(depth)
    while f is not None and f.f_code.co_filename.startswith(_SKIP_FILES) and f.f_code.co_filename not in _USER_FILES:
        f = f.f_back
    if f is None:
        return "<unknown>"
    cell = cell_number(f.f_code.co_filename)  # a notebook cell's line, as IPython writes it: In [3], line 2
    return f"In [{cell}], line {f.f_lineno}" if cell is not None else f"{_short_path(f.f_code.co_filename)}:{f.f_lineno}"


@functools.lru_cache(maxsize=1024)
def _short_path(filename: str) -> str:
    """Relative to the working directory (at first use) when the file lies under it, else as given."""
    if filename.startswith("<"):
        return filename
    rel = os.path.relpath(filename)
    return filename if rel.startswith("..") else rel


def run_mapped(body: Callable[[int], Any], axes: Sequence[tuple[Hashable, int]], *, is_device: bool,
               blas: bool = True, name: str | None = None) -> list:
    """Run ``body(i)`` for every index ``i`` of the mapped ``axes`` ((name, size) pairs; several for a mesh,
    row-major), each in its own thread with the axes bound; return the results in index order. ``blas=False``:
    the bodies call no BLAS (a jaxpr without products), so BLAS's thread count is left as it is
    (:mod:`spmdsim.runtime._blas`; ~5 µs per call saved). ``name``: the mapped function's name (a trace's device calls are
    named after it, see :func:`function_name`).

    Called from inside a lane, the new lanes join that lane's world (a nested map). A top-level call over devices
    made in a process group of several processes (:mod:`spmdsim.runtime._process_group`) is handed to the group
    (:meth:`~spmdsim.runtime._process_group.ProcessGroup.run`): one global call, ``axes`` the global mesh, ``body(j)``
    running this process's j-th device, the results this process's devices'. Raises the first error in
    index order with the lane named in a note and the other lanes' errors attached (``device_errors``), or the
    world's CollectiveMismatchError/CollectiveDeadlockError; KeyboardInterrupt with the device table.
    """
    parent = current_lane()
    if parent is None:
        group = _process_group.current()
        if group is not SINGLE_PROCESS and is_device:
            previous, _local.call_name = _local.call_name, name  # for the group's run_lanes
            try:
                return group.run(body, tuple(axes))
            finally:
                _local.call_name = previous
        world = World(group)
        placement = _top_level_frames(tuple(axes), is_device, group.layout)
        lanes = placement.take(world)
        results, errors = run_lanes(world, lanes, body, parent, blas, name=name)
        out = outcome(world, lanes, results, errors, parent)
        if not world.observers and not pause_hooks:  # nothing kept them: the next call may use them
            placement.give_back(lanes)
        return out
    else:
        world, frames = parent.world, parent.frames
        instance = frames[-1].instance + (parent.nested_calls,)
        parent.nested_calls += 1
        placed = _frames(frames, tuple(axes), is_device, instance, shared_channels=False)
        lanes = placed.lanes_in(world, CallCount(parent, len(placed.lanes)))
    results, errors = run_lanes(world, lanes, body, parent, name=name)
    return outcome(world, lanes, results, errors, parent)


def function_name(fun: Callable) -> str | None:
    """The name of a mapped function (``step``; that of a ``functools.partial``'s function), None without one."""
    while isinstance(fun, functools.partial):
        fun = fun.func
    name = getattr(fun, "__name__", None)
    return name if isinstance(name, str) and name else None


def run_lanes(world, lanes: list[Lane], body: Callable[[int], Any], parent: Lane | None,
              blas: bool = True, name: str | None = None) -> tuple[list, list]:
    """Run ``body(i)`` as ``lanes[i]`` of ``world``, each in its own thread; return every lane's result and error
    (None where it had none). KeyboardInterrupt (with the device table, every lane stopped) on Ctrl-C. ``name``:
    the mapped function's (observers name each device's call after it); by default that given to the
    :func:`run_mapped` that handed this call to a process group on this thread."""
    if name is None and parent is None:
        name = _local.call_name
    size = len(lanes)
    results: list = [None] * size
    errors: list[BaseException | None] = [None] * size

    observed = world.observers
    group = world.group  # a device runs in the process group of its call (see spmdsim.runtime._process_group)
    enters = group is not SINGLE_PROCESS

    def target(i: int) -> None:
        lane = lanes[i]
        lane.thread = threading.current_thread()
        _local.lane = lane
        if enters:
            _process_group.enter(group)
        start, how = time.perf_counter() if observed else 0.0, "returned"
        try:
            if isinstance(world.failure, KeyboardInterrupt):  # Ctrl-C before this device started
                raise Aborted
            results[i] = body(i)
        except Aborted:
            how = "stopped"
            world.finish(lane, ABORTED)
        except BaseException as e:
            how = "raised"
            errors[i] = e
            world.fail(e)
            world.finish(lane, RAISED, f"{type(e).__name__}: {e}")
        else:
            world.finish(lane, DONE)
        finally:
            _local.lane = None  # a reused thread must not keep this call's lane (and its world) alive
            if enters:
                _process_group.leave()
        for observer in observed:
            observer.lane(lane.label, start, time.perf_counter(), how, name=name, call=getattr(world, "call", None))

    stream = _output.begin(current_lane) if parent is None else None
    world.start(lanes, parent)
    try:
        with _threads.on_lanes_cpu(), _blas.limited(parent is None and blas):
            threads = _threads.run_threads(target, list(map(_thread_name, lanes)))
            try:
                threads.wait()
            except KeyboardInterrupt as e:
                _interrupted(e, world, lanes, threads)
                raise
    finally:
        _output.end(stream, release=getattr(world, "orders_output", True))
    return results, errors


class _Placement:
    """The lanes of one mapped call: per lane its frames (the enclosing ones, then one per mapped axis,
    row-major), label and channel templates (top-level calls: a dict shared by the calls of that mesh, see
    :meth:`Lane.channel`; None for nested calls). A top-level placement also keeps the lanes of its calls that
    ended cleanly, for the next call (:meth:`take`, :meth:`give_back`)."""

    def __init__(self, lanes: list):
        self.lanes = lanes
        self.spare: list[list[Lane]] = []  # lanes given back by calls that ended cleanly

    def lanes_in(self, world, call: CallCount | None = None, indices: Sequence[int] | None = None) -> list[Lane]:
        """New lanes of ``world`` for the placement's lanes (those at ``indices``, default all), counted by
        ``call`` (default: a new top-level count)."""
        chosen = [self.lanes[i] for i in indices] if indices is not None else self.lanes
        call = call if call is not None else CallCount(None, len(chosen))
        return [Lane(world, frames, call, label, templates) for frames, label, templates in chosen]

    def take(self, world) -> list[Lane]:
        """Every lane of a top-level call in ``world``: those of an earlier call given back (see
        :meth:`give_back`), else new ones."""
        try:
            lanes = self.spare.pop()  # atomic: two threads calling at once never get the same lanes
        except IndexError:
            return self.lanes_in(world)
        call = CallCount(None, len(lanes))
        for lane in lanes:
            lane.world, lane.call = world, call
        return lanes

    def give_back(self, lanes: list[Lane]) -> None:
        """The lanes of a top-level call that ended cleanly (every device returned; no observer or debugger
        keeps them), reset for the next call (~1 µs per lane less than making them anew, their channels kept)."""
        for lane in lanes:
            lane.recycle()
        if len(self.spare) < 4:
            self.spare.append(lanes)


def _frames(outer: tuple, axes: tuple, is_device: bool, instance: tuple, *, shared_channels: bool) -> _Placement:
    """The placement of the lanes of a call over ``axes`` inside ``outer`` frames (``instance``: the call's);
    ``shared_channels``: give each lane a dict of channel templates (for placements reused across calls)."""
    lanes = []
    for coords in itertools.product(*(range(n) for _, n in axes)):
        frames = outer + tuple(Frame(name, n, c, instance, is_device)
                               for (name, n), c in zip(axes, coords, strict=True))
        lanes.append((frames, frames_label(frames), {} if shared_channels else None))
    return _Placement(lanes)


def top_level_placement(axes: tuple, is_device: bool = True) -> _Placement:
    """The placement of a top-level call, made once per mesh (and host layout, which the labels name)."""
    return _top_level_frames(axes, is_device, _process_group.layout())


@functools.lru_cache(maxsize=64)
def _top_level_frames(axes: tuple, is_device: bool, layout) -> _Placement:
    """The placement of a top-level call: a top-level call has a world of its own, so its frames need no
    instance that tells it from other calls, and its channels can be worked out once."""
    return _frames((), axes, is_device, (0,), shared_channels=True)


def outcome(world: World, lanes: list[Lane], results: list, errors: list, parent: Lane | None) -> list:
    """The results of a call whose lanes ran (:func:`run_lanes`), or what it raises: the first device error in
    device order (see :func:`device_error`), else the world's failure (Aborted inside a nested call)."""
    raised = [(lane, e) for lane, e in zip(lanes, errors, strict=True) if e is not None]
    if raised:
        raise device_error([(lane.label, e) for lane, e in raised])
    if world.failure is not None:
        if parent is not None:
            raise Aborted
        raise world.failure
    return results


def device_error(raised: list[tuple[str, BaseException]]) -> BaseException:
    """The error to raise when devices raised (``raised``: (device label, error) in device order): the first,
    with ``device_errors`` (every device's error by label), notes naming the device and what the others raised,
    and spmdsim's frames filtered from its traceback. Used by both executors."""
    label, error = raised[0]
    if not hasattr(error, "device_errors"):
        error.device_errors = dict(raised)
        _explain(error, label, raised[1:])
    return error.with_traceback(_filtered(error.__traceback__))


def _explain(error: BaseException, label: str, others: list) -> None:
    """Notes on a device error: where it was raised, which other devices raised what (identical errors in
    one line). (A write into a read-only block explains itself: the front ends rewrite NumPy's message.)"""
    error.add_note(f"spmdsim: raised on {label}.")
    groups: dict = {}
    for other, e in others:
        groups.setdefault((type(e).__name__, str(e)), []).append(other)
    for (kind, text), labels in groups.items():
        same = (kind, text) == (type(error).__name__, str(error))
        error.add_note(f"spmdsim: {who(labels)} also raised {'the same error' if same else f'{kind}: {text}'}.")


def api_boundary(fun: Callable) -> Callable:
    """Decorator for a public entry point (a mapped function): an exception leaving it carries a traceback
    without spmdsim's own frames (JAX filters its frames the same way), so the user's lines are what they see;
    ``SPMDSIM_TRACEBACK_FILTERING=off`` keeps every frame. The call runs in the default floating-point environment
    (:mod:`spmdsim.runtime._fpenv`), whatever the caller's."""
    @functools.wraps(fun)
    def entry(*args, **kwargs):
        try:
            with _fpenv.default():  # a call from XLA's host callback: subnormals are flushed there
                return fun(*args, **kwargs)
        except Exception as e:
            if current_lane() is not None or not _FILTER_TRACEBACKS:
                raise  # inside a device the outer call filters; unfiltered on request
            e.with_traceback(_filtered(e.__traceback__)).__suppress_context__ = True
            raise  # a bare raise adds no frame of this one
    return entry


def _filtered(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without spmdsim's own frames (as JAX filters its frames); SPMDSIM_TRACEBACK_FILTERING=off keeps
    them."""
    if not _FILTER_TRACEBACKS:
        return tb
    frames = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR + os.sep):
            frames.append((tb.tb_frame, tb.tb_lasti, tb.tb_lineno))
        tb = tb.tb_next
    out = None
    for frame, lasti, lineno in reversed(frames):
        out = types.TracebackType(out, frame, lasti, lineno)
    return out


def _interrupted(error: KeyboardInterrupt, world: World, lanes: list[Lane], threads: _threads.Threads) -> None:
    """Ctrl-C while the devices run: note where every device was and stop them within
    INTERRUPT_GRACE_SECONDS. Waiting devices unwind at once (the world fails); a device still running after
    a tenth of the grace gets an :class:`Aborted` raised in its thread (at its next Python instruction, or
    when the C call it is in returns); devices still busy at the end of the grace are given up on (they stop
    when that C call returns, never running user code again). A second Ctrl-C skips the grace."""
    table = world.device_table()
    world.fail(error)
    try:
        if not threads.wait(INTERRUPT_GRACE_SECONDS / 10):
            with world.lock:  # a lane's state changes under this lock: a finished lane is never interrupted
                for lane in world.lanes:
                    if lane.state not in (DONE, RAISED, ABORTED) and lane.thread is not None:
                        _threads.interrupt(lane.thread, Aborted)
            threads.wait(INTERRUPT_GRACE_SECONDS * 9 / 10)
    except KeyboardInterrupt:
        pass
    stuck = threads.running()
    threads.abandon(stuck)
    error.add_note(f"spmdsim: interrupted; where every device was:\n{table}")
    if stuck:
        error.add_note(f"spmdsim: {', '.join(lanes[i].label for i in stuck)} did not stop within "
                       f"{INTERRUPT_GRACE_SECONDS:g} s (busy outside Python, e.g. in time.sleep or a long NumPy "
                       f"call) and {'was' if len(stuck) == 1 else 'were'} abandoned: "
                       f"{'it stops' if len(stuck) == 1 else 'they stop'} when that call returns, and never run "
                       f"user code again.")
