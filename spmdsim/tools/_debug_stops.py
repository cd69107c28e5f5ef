"""What a stop of the debugger (:mod:`spmdsim.debug`) shows and where it evaluates: the :class:`Stop` (a
collective's rendezvous, a would-hang or a mismatch, with every device's line, operands and results) and its
table, and evaluating an expression in a held device's frame (:func:`evaluate`). Public through
:mod:`spmdsim.debug`."""
from __future__ import annotations

import dataclasses
import functools
import os
import queue
import re
import sys
import threading
from typing import Any, Sequence

import numpy as np

from spmdsim.runtime import _runtime
from spmdsim.runtime._rendezvous import RUNNING, WAITING
from spmdsim.runtime._reports import cell_names

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_DEBUGGER_FILES = {os.path.join(_PACKAGE_DIR, "debug.py"), os.path.join(_PACKAGE_DIR, "tools", "_debugger.py"),
                   os.path.abspath(__file__)}  # the debugger's own frames (they hold lanes too)

_WAITING_IN = (threading.__file__, queue.__file__)  # a held thread may sit in a lock or queue under spmdsim
_USER_CODE = (os.path.join(_PACKAGE_DIR, "demo.py"),)  # spmdsim's files that are programs, not machinery


def _internal(filename: str) -> bool:
    """Whether a frame of ``filename`` is spmdsim's machinery (not the user's program): its files, and the
    code it generates (the JAX front end's compiled jaxprs, ``<spmdsim: jaxpr>``)."""
    return (filename.startswith(_PACKAGE_DIR) and filename not in _USER_CODE) or filename.startswith("<spmdsim")


def _device_number(label: str) -> int | None:
    """5 from ``device 5 [i=1, j=1]`` (or ``host 1 device 5 [i=5]``); None for a vmap lane."""
    match = re.match(r"(?:host \d+ )?device (\d+)(?: \[|$)", label)
    return int(match.group(1)) if match else None


# Collectives by the names users write (spmdsim.lax / jax.lax) and by the primitives that implement them (the
# rule table's names, which rendezvous carry, and JAX's primitives: jax.lax.psum in a jax.shard_map binds
# psum_invariant). A breakpoint's OP matches the function called and the primitive it meets in: b psum stops at
# every psum, psum_invariant and pmean (a pmean meets in a psum); b pmean at pmeans only.
PRIMITIVE = {"psum_scatter": "reduce_scatter", "pshuffle": "ppermute", "pswapaxes": "all_to_all",
             "psum_invariant": "psum", "all_gather_invariant": "all_gather"}
OPS = ("psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "reduce_scatter", "all_to_all", "pswapaxes",
       "ppermute", "pshuffle", "pbroadcast", "ragged_all_to_all", "psum_invariant", "all_gather_invariant")


class DebuggerQuit(BaseException):
    """Raised inside the program when the user quits the debugger (a BaseException, so user code's
    ``except Exception`` does not swallow it)."""


# -- what a stop shows ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Stop:
    """One paused rendezvous, or a program stopped by a would-hang or mismatch error.

    Per-device lists are indexed by rank in the collective (the axis index for one axis); for an error stop
    they list every device of the program, and ``operands``/``results`` are empty.

    Attributes:
        number: the stop's number in this session (0, 1, ...).
        description: the collective, e.g. ``psum(float32[4], axis_name='i')``, or the error's first line.
        step: the collective's step in its communicator (-1 for an error stop).
        devices: device labels, e.g. ``device 2 [i=2]``.
        sites: each device's source line (``file:line``) of the call.
        operands: each device's operand leaves.
        results: each device's result leaves.
        state: one line per device of the program: where it is.
        op: the collective's name in the rendezvous (``psum``, ``reduce_scatter``, ...), or the error's class.
        axis_name: the axis names of the collective (empty for an error stop).
        error: the CollectiveDeadlockError or CollectiveMismatchError that stopped the program, else None.
        breakpoints: the breakpoints this stop was hit at (empty when it stopped for ``next`` or an error).

    Methods that take a device (:func:`evaluate`, :meth:`Session.eval`, the prompt's ``p`` and ``s``) take its
    device id (5 for ``device 5 [x=2, y=1]``), as ``b device=D`` and the rest of spmdsim do;
    :meth:`row` gives the index of a device's row in these lists.
    """

    number: int
    description: str
    step: int
    devices: list[str]
    sites: list[str]
    operands: list[list[np.ndarray]]
    results: list[list[np.ndarray]]
    state: list[str]
    op: str = ""
    axis_name: tuple = ()
    error: BaseException | None = None
    _lanes: list = dataclasses.field(default_factory=list, repr=False)
    _frames: dict | None = dataclasses.field(default=None, repr=False)
    held: bool = dataclasses.field(default=True, repr=False)
    _calling: dict = dataclasses.field(default_factory=dict, repr=False)  # row -> the failed call it is in
    breakpoints: list = dataclasses.field(default_factory=list)

    def row(self, device: int) -> int:
        """The index in this stop's lists (``devices``, ``operands``, ...) of the device with id ``device``.

        Under ``vmap`` the lanes of a stop may share a device (or have none): there ``device`` is a row.

        Raises:
            ValueError: no such device at this stop.
        """
        numbers = [_device_number(d) for d in self.devices]
        if None in numbers or len(set(numbers)) != len(numbers):  # vmap lanes: rows
            if not 0 <= device < len(self.devices):
                raise ValueError(f"this stop's lanes share devices (vmap): DEVICE is a row, 0..{len(self.devices) - 1}"
                                 f", got {device}")
            return device
        if device not in numbers:
            raise ValueError(f"no device {device} at this stop: its devices are {_id_list(numbers)}")
        return numbers.index(device)

    def table(self, width: int = 100) -> str:
        """The stop as text: a header line, then one row per device (source line, operand, result).

        Several operands (a pytree) get one block each, headed by its shape and dtype; large arrays are
        elided to fit ``width`` characters per row.

        Args:
            width: the widest row wanted, in characters.

        Returns:
            The text, lines separated by newlines.
        """
        return cell_names(self._table(width))

    def _table(self, width: int) -> str:
        if self.error is not None:
            return f"stop {self.number}: {type(self.error).__name__}: {self.error}"
        same_site = len(set(self.sites)) == 1
        head = f"stop {self.number}: {self.description} (step {self.step})" + (
            f" at {self.sites[0]}" if same_site else "") + _hit_text(self.breakpoints)
        n_leaves = max((len(ops) for ops in self.operands), default=0)
        label_w = max(len(d) for d in self.devices)
        site_w = 0 if same_site else max(len(s) for s in self.sites)
        cell_w = max(12, (width - label_w - site_w - 6) // 2)
        blocks = []
        for k in range(n_leaves):
            rows = [["device", *([] if same_site else ["site"]), "operand", "result"]]
            for d, site, ops, res in zip(self.devices, self.sites, self.operands, self.results, strict=True):
                rows.append([d, *([] if same_site else [site]), brief(ops[k], cell_w),
                             brief(res[k], cell_w) if k < len(res) else ""])
            title = ""
            if n_leaves > 1:
                a = np.asarray(self.operands[0][k])
                title = f"operand {k} of {n_leaves}: {a.dtype}{list(a.shape)}\n"
            blocks.append(title + _runtime.format_table(rows))
        return head + "\n" + "\n".join(blocks)

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython and Jupyter show the table
        printer.text(self.table())


def _hit_text(breakpoints: Sequence) -> str:
    """`` [breakpoint 2: psum step=3]``: the breakpoints a stop was hit at, as gdb's "Breakpoint 2, ..."."""
    if not breakpoints:
        return ""
    return " [" + ", ".join(f"breakpoint {bp.number}: {bp}" for bp in breakpoints) + "]"


def _id_list(numbers: Sequence[int]) -> str:
    """``0, 1, 2, 3`` or, for many, ``0, 1, 2, ..., 63``."""
    shown = list(numbers) if len(numbers) <= 8 else [*numbers[:3], "...", numbers[-1]]
    return ", ".join(map(str, shown))


def brief(value, width: int = 40) -> str:
    """A value in at most ``width`` characters: small arrays in full, larger ones as dtype, shape and their
    first and last elements (``float64[100] [0, 1, 2, …, 99]``)."""
    a = np.asarray(value)
    text = np.array2string(a, precision=4, separator=", ", max_line_width=10**6).replace("\n", "")
    if len(text) <= width and a.size <= 16:
        return text
    flat = a.ravel()
    head = f"{a.dtype}{list(a.shape)} "
    shown = []
    for v in flat[:4]:
        item = _item(v)
        if len(head) + len(", ".join(shown + [item])) + len(", …, ") + len(_item(flat[-1])) + 2 > width:
            break
        shown.append(item)
    return head + "[" + ", ".join(shown + ["…", _item(flat[-1])]) + "]"


def _item(v) -> str:
    v = v.item() if isinstance(v, np.generic) else v
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _collective_stop(number: int, rv, hit: Sequence = ()) -> Stop:
    """A Stop from a completed rendezvous; its devices are shown as held there; ``hit``: the breakpoints it was
    hit at."""
    api = next((a for a in rv.apis if a), None)  # the public function called (pmean binds psum)
    where = _runtime.describe(rv.signature, api)
    lanes, sites = list(rv.lanes), list(rv.sites)
    frames = None
    if "<unknown>" in sites:  # a program inside spmdsim's package (spmdsim debug -m spmdsim.demo): its lines
        frames = _device_frames(lanes)
        sites = [_site(frames[k]) if site == "<unknown>" and k in frames else site for k, site in enumerate(sites)]
    results = [list(r) for r in rv.results]
    if api == "pmean" and rv.signature.op == "psum":
        results = _means(rv, results)
    stop = Stop(number, where, rv.seq, [lane.label for lane in lanes], sites, [list(b) for b in rv.blocks], results,
                [], op=api or rv.signature.op, axis_name=tuple(rv.signature.names), _lanes=lanes, _frames=frames,
                breakpoints=list(hit))
    stop.state = _states(stop)
    return stop


def _site(frame) -> str:
    """``file:line`` of a frame, its file relative to the working directory when under it (as stops show)."""
    path = os.path.relpath(frame.f_code.co_filename)
    return f"{frame.f_code.co_filename if path.startswith('..') else path}:{frame.f_lineno}"


def _means(rv, results: list[list]) -> list[list]:
    """A pmean's results as the mean. The NumPy front end's pmean divides in the rendezvous (its results are
    the mean already); JAX's ``jax.lax.pmean`` meets in a psum and divides after it, so a result that is its
    group's sum is shown divided by the group's size, as the device will have it."""
    groups = dict(rv.signature.params).get("axis_index_groups") or (tuple(range(rv.size)),)
    out = []
    for rank, leaves in enumerate(results):
        group = next((g for g in groups if rank in g), range(rv.size))
        shown = []
        for k, leaf in enumerate(leaves):
            total = functools.reduce(np.add, (np.asarray(rv.blocks[r][k]) for r in group))
            summed = np.shape(leaf) == np.shape(total) and np.allclose(leaf, total, equal_nan=True)
            dtype = leaf.dtype if np.issubdtype(leaf.dtype, np.inexact) else np.float32  # as JAX divides
            shown.append(np.true_divide(leaf, len(group)).astype(dtype) if summed else leaf)
        out.append(shown)
    return out


def _error_stop(number: int, world, error: BaseException) -> Stop:
    """A Stop for a world that failed with a would-hang or mismatch error; every device as it was."""
    lanes = list(world.lanes)
    stop = Stop(number, str(error).split("\n", 1)[0], -1, [lane.label for lane in lanes],
                [lane.status_row()[-1] for lane in lanes], [[] for _ in lanes], [[] for _ in lanes], [],
                op=type(error).__name__, error=error, _lanes=lanes)
    caller = _runtime.current_lane()  # the failure is reported in the thread of the device that found it
    if caller is not None and caller.state == RUNNING and caller in lanes:  # held in the call that does not match
        for line in str(error).split("\n\n", 1)[0].splitlines()[1:]:
            label, _, call = line.strip().partition(": ")
            if label == caller.label:
                stop._calling[lanes.index(caller)] = call
    stop.state = _states(stop)
    return stop


def _held(stop: Stop, device: int) -> bool:
    """Whether ``stop``'s ``device`` (a row) is held: at the stop's collective, or (at an error stop) waiting in
    one."""
    return stop.error is None or stop._lanes[device].state == WAITING or device in stop._calling


def _state(stop: Stop, device: int) -> str:
    """``returned``, ``running``, ``waiting in psum(...) ...``: the state of ``stop``'s ``device`` now."""
    if device in stop._calling:
        return f"stopped in {stop._calling[device]}, the call that does not match"
    return stop._lanes[device].status_line().split(": ", 1)[1]


def _states(stop: Stop) -> list[str]:
    """Every device of the program as it is now, in device order: those held at the stop's collective, the
    others as the runtime has them (waiting in another collective, running, returned, raised)."""
    rows = {id(lane): k for k, lane in enumerate(stop._lanes)}
    lines = []
    for lane in stop._lanes[0].world.lanes if stop._lanes else ():
        k = rows.get(id(lane))
        if stop.error is None and k is not None:
            lines.append(f"{lane.label}: held at {stop.description} (step {stop.step}) at {stop.sites[k]}")
        else:
            lines.append(f"{lane.label}: {_state(stop, k)}" if k is not None else lane.status_line())
    return lines


# -- evaluating in a device's frame -----------------------------------------------------------------------

def _device_frames(lanes: Sequence) -> dict[int, Any]:
    """For each held lane (by index in ``lanes``), the Python frame of the user's code that called the
    collective it waits in: found by looking through every thread's stack for spmdsim's frame holding the
    lane, then going out to the first frame outside spmdsim. A lane whose thread is not inside spmdsim (still
    computing) or that has no user frame (the JAX front end runs a jaxpr) is left out."""
    index = {id(lane): k for k, lane in enumerate(lanes)}
    found: dict[int, Any] = {}
    for f in sys._current_frames().values():
        while f is not None and f.f_code.co_filename in _WAITING_IN:
            f = f.f_back
        while f is not None and _internal(f.f_code.co_filename):  # else: running user code
            if f.f_code.co_filename not in _DEBUGGER_FILES:
                k = next((index[id(v)] for v in list(f.f_locals.values()) if id(v) in index), None)
                if k is not None:
                    user = f.f_back
                    while user is not None and (_internal(user.f_code.co_filename)
                                                or user.f_code.co_filename == threading.__file__):
                        user = user.f_back
                    if user is not None:
                        found.setdefault(k, user)
                    break
            f = f.f_back
    return found


def evaluate(stop: Stop, device: int, expression: str) -> Any:
    """Evaluate ``expression`` in the frame of ``stop``'s device ``device`` (its device id, as in ``device 5
    [x=2, y=1]``; see :meth:`Stop.row`).

    The expression sees the device's local and global variables where it called the collective. It runs in
    a thread of its own, outside every mapped call, so calling a collective in it raises NameError.

    Args:
        stop: a stop whose devices are still held.
        device: the device's id (one of the stop's devices).
        expression: Python source of an expression.

    Returns:
        The expression's value.

    Raises:
        ValueError: the stop was released, ``device`` is not at the stop, or that device has no Python frame
            held here (it is computing, finished, or runs a jaxpr).
        Exception: whatever the expression raises.
    """
    return _in_frame(_held_frame(stop, device), expression)


def _held_frame(stop: Stop, device: int):
    """The frame where ``stop``'s ``device`` called the collective (see :func:`evaluate`'s ValueErrors)."""
    if not stop.held:
        raise ValueError(f"stop {stop.number} was released: the devices have moved on. Evaluate at the current "
                         f"stop.")
    row = stop.row(device)
    if not _held(stop, row):  # running, returned or raised: the same state as 'where' gives
        raise ValueError(f"{stop.devices[row]} is not held at a collective ({_state(stop, row)}): only a "
                         f"held device's variables can be read; see 'where'.")
    if stop._frames is None:
        stop._frames = _device_frames(stop._lanes)
    frame = stop._frames.get(row)
    if frame is None:
        raise ValueError(f"{stop.devices[row]} runs a jaxpr (a JAX program): it has no Python variables to "
                         f"read. 's {device}' shows its operand" + (f" and 's {device} r' its result."
                                                                    if stop.error is None else "."))
    return frame


def _in_frame(frame, expression: str) -> Any:
    """Evaluate ``expression`` with ``frame``'s variables, in a thread of its own (outside any mapped call)."""
    code = compile(expression, "<spmdsim debug>", "eval")
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = eval(code, frame.f_globals, dict(frame.f_locals))  # noqa: S307 - the user's input
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            outcome["error"] = e

    thread = threading.Thread(target=run, name="spmdsim debug eval", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
