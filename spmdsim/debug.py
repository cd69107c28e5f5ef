"""Stepping through collectives: every device of a group is held at each rendezvous, after the rule ran
and before anyone takes its result, so every device's operands and results can be read side by side, and
any device's local variables evaluated. A collective that would hang (a deadlock) or devices calling
different collectives (a mismatch) stop the program the same way, with every device still where it was.

From Python or a notebook::

    s = spmdsim.debug.step(spmdsim.pmap(f, axis_name="i"), x)   # runs to the first rendezvous
    s.stop                      # op, axis, step; per device: source line, operands, results
    s.stop.operands[2]          # device 2's operand leaves (NumPy arrays)
    s.eval(2, "x * 2")          # an expression in device 2's frame at its collective call
    s.next()                    # on to the next rendezvous (None when the call has finished)
    s.break_at("all_gather")    # a breakpoint; s.cont() runs to the next one
    s.finish()                  # run to the end; returns the call's result (or raises its error)

From a terminal: ``spmdsim debug [--devices N] [-b SPEC] SCRIPT.py [args]`` (or ``-m MODULE``) runs a NumPy
program (or, with jax installed, a JAX program with ``jax.pmap`` replaced as by ``spmdsim run``) and prompts
at each stop; type ``h`` for the commands. One debugging session at a time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import os
import queue
import re
import sys
import threading
from typing import Any, Callable, Sequence

import numpy as np

from spmdsim.runtime import _output, _runtime
from spmdsim.runtime._rendezvous import RUNNING, WAITING
from spmdsim.runtime._reports import cell_names
from spmdsim.errors import CollectiveError

__all__ = ["Stop", "Breakpoint", "Session", "step", "DebuggerQuit", "main"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_THIS_FILE = os.path.abspath(__file__)
_WAITING_IN = (threading.__file__, queue.__file__)  # a held thread may sit in a lock or queue under spmdsim
_USER_CODE = (os.path.join(_PACKAGE_DIR, "demo.py"),)  # spmdsim's files that are programs, not machinery


def _internal(filename: str) -> bool:
    """Whether a frame of ``filename`` is spmdsim's machinery (not the user's program): its files, and the
    code it generates (the JAX front end's compiled jaxprs, ``<spmdsim: jaxpr>``)."""
    return (filename.startswith(_PACKAGE_DIR) and filename not in _USER_CODE) or filename.startswith("<spmdsim")

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
            if f.f_code.co_filename != _THIS_FILE:
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


# -- breakpoints and the decision to stop -------------------------------------------------------------------

@dataclasses.dataclass
class Breakpoint:
    """Stop at a collective that matches every field that is set (None matches anything).

    Written as text: any of ``OP`` (``psum``, ``all_gather``, ...: the function called, or a primitive that
    implements it, so ``psum`` also matches ``psum_invariant`` and a ``pmean``'s psum), ``FILE:LINE`` or ``LINE``
    (a device's source line), ``axis=NAME``, ``step=K``, ``device=D`` (a device taking part, by its number), separated by
    spaces, e.g. ``"psum axis=batch step=3"`` or ``"train.py:42 device=2"``.
    """

    op: str | None = None
    line: str | None = None
    axis: str | None = None
    step: int | None = None
    device: int | None = None
    number: int = 0
    hits: int = 0
    ignore: int = 0  # hits still to pass over (gdb's ignore count; ``continue N`` at this breakpoint sets N - 1)

    @classmethod
    def parse(cls, text: str, number: int = 0) -> "Breakpoint":
        """A breakpoint from its text form (see the class).

        Raises:
            ValueError: an unknown collective, field or malformed value, with what is accepted.
        """
        fields: dict[str, Any] = {}
        for word in text.split():
            key, _, value = word.partition("=")
            if not _:
                key, value = ("line", word) if (":" in word or word.isdigit()) else ("op", word)
            if key not in ("op", "line", "axis", "step", "device") or not value:
                raise ValueError(f"breakpoint {text!r}: cannot read {word!r}; write any of OP, FILE:LINE, LINE, "
                                 f"axis=NAME, step=K, device=D")
            if key in ("step", "device"):
                if not value.isdigit():
                    raise ValueError(f"breakpoint {text!r}: {key} must be a number >= 0, got {value!r}")
                value = int(value)
            if key == "line" and not value.rpartition(":")[2].isdigit():
                raise ValueError(f"breakpoint {text!r}: a source line is FILE:LINE or LINE, got {value!r}")
            if key == "op" and value not in OPS:
                close = difflib.get_close_matches(value, OPS, n=1)
                raise ValueError(f"breakpoint {text!r}: unknown collective {value!r}"
                                 + (f"; did you mean {close[0]!r}?" if close else f"; one of {', '.join(OPS)}"))
            fields[key] = value
        if not fields:
            raise ValueError("an empty breakpoint: write any of OP, FILE:LINE, LINE, axis=NAME, step=K, device=D")
        return cls(**fields, number=number)

    def matches(self, op: str | Sequence[str], axis_name: Sequence, step: int, sites: Sequence[str],
                devices: Sequence[str]) -> bool:
        """Whether a collective matches: ``op`` its names (the function called and the primitive it binds, e.g.
        ``("pmean", "psum")``, or one name), its axis names, step, sites and device labels."""
        names = {op} if isinstance(op, str) else set(op)
        if self.op is not None and not {self.op, PRIMITIVE.get(self.op, self.op)} & (
                names | {PRIMITIVE.get(n, n) for n in names}):
            return False
        if self.axis is not None and self.axis not in (str(a) for a in axis_name):
            return False
        if self.step is not None and self.step != step:
            return False
        if self.device is not None and not any(_device_number(d) == self.device for d in devices):
            return False
        return self.line is None or any(_same_line(site, self.line) for site in sites)

    def __str__(self) -> str:
        words = [self.op, self.line] + [f"{k}={getattr(self, k)}" for k in ("axis", "step", "device")
                                         if getattr(self, k) is not None]
        return " ".join(w for w in words if w)


def _device_number(label: str) -> int | None:
    """5 from ``device 5 [i=1, j=1]`` (or ``host 1 device 5 [i=5]``); None for a vmap lane."""
    match = re.match(r"(?:host \d+ )?device (\d+)(?: \[|$)", label)
    return int(match.group(1)) if match else None


def _same_line(site: str, spec: str) -> bool:
    """Whether ``site`` (``file:line``, or the JAX front end's ``file:line:column (function)``) is the line
    ``spec`` (``FILE:LINE`` or ``LINE``) names."""
    match = re.match(r"(.*?):(\d+)(?::\d+)?(?: \(.*\))?$", site)
    if match is None:
        return False
    s_file, s_line = match.groups()
    b_file, _, b_line = spec.rpartition(":")
    if s_line != b_line:
        return False
    return not b_file or s_file == b_file or os.path.abspath(s_file) == os.path.abspath(b_file) \
        or s_file.endswith(os.sep + b_file) or os.path.basename(s_file) == b_file


def _check_line(text: str, spec: str, program: str | None) -> None:
    """Refuse a breakpoint at a line past the end of its file: ``spec``'s FILE when it names one found from the
    working directory, else ``program`` (the file a bare LINE names)."""
    import linecache

    file, _, line = spec.rpartition(":")
    file = file or program
    if not file or not os.path.isfile(file):
        return
    n = len(linecache.getlines(os.path.abspath(file)))
    if not 1 <= int(line) <= n:
        raise ValueError(f"breakpoint {text!r}: {file} has {n} line{'s' * (n != 1)}; line {line} is not one of them")


class _Controller:
    """When to stop, shared by the terminal and :class:`Session`: ``next N`` (the N-th next collective) or
    ``continue`` (the next hit of a breakpoint whose ignore count is 0; never without breakpoints). ``continue N``
    at a breakpoint's stop first sets that breakpoint's ignore count to N - 1, as gdb's ``continue N`` does. A
    would-hang or mismatch always stops."""

    def __init__(self, breakpoints: Sequence[str] = (), program: str | None = None):
        self.breakpoints: list[Breakpoint] = []
        self._numbers = 0
        self.program = program  # the program's file, which a breakpoint's bare LINE names
        for text in breakpoints:
            self.add(text)
        self.mode, self.remaining = ("continue", None) if self.breakpoints else ("next", 1)
        self.count = 0
        self.hit: list[Breakpoint] = []  # the breakpoints the stop wanted last was hit at
        self.lock = threading.Lock()  # one stop at a time, whichever device thread completes a rendezvous

    def add(self, text: str) -> Breakpoint:
        """A new breakpoint (see :class:`Breakpoint`). Raises ValueError for one that cannot be read, or whose
        line lies past the end of its file (FILE:LINE with FILE found, or LINE in the program's file)."""
        bp = Breakpoint.parse(text, self._numbers + 1)
        if bp.line is not None:
            _check_line(text, bp.line, self.program)
        self._numbers += 1
        self.breakpoints.append(bp)
        return bp

    def clear(self, number: int | None = None) -> list[Breakpoint]:
        """Delete breakpoint ``number`` (all of them with None); returns those deleted."""
        gone = [bp for bp in self.breakpoints if number is None or bp.number == number]
        if not gone:
            raise ValueError(f"no breakpoint {number}; the breakpoints are: "
                             + (", ".join(str(bp.number) for bp in self.breakpoints) or "none"))
        self.breakpoints = [bp for bp in self.breakpoints if bp not in gone]
        return gone

    def go(self, mode: str, n: int | None) -> None:
        self.mode, self.remaining = mode, n

    def ignore_at(self, stop: "Stop", n: int) -> str:
        """``continue N`` at ``stop``, as gdb's: each breakpoint the stop was hit at passes over its next N - 1
        hits. Returns what was done, to be said."""
        if not stop.breakpoints:
            return f"not stopped at a breakpoint; {n} ignored (continue N passes over the next N - 1 hits of the " \
                   f"breakpoint stopped at, as gdb's)"
        for bp in stop.breakpoints:
            bp.ignore = n - 1
        return "; ".join(f"will ignore the next {n - 1} hit{'s' * (n != 2)} of breakpoint {bp.number} ({bp})"
                         for bp in stop.breakpoints)

    def wants(self, rv) -> bool:
        """Whether to stop at this completed rendezvous (and count it toward ``next N``); every breakpoint it
        matches counts a hit (and, when continuing, passes over it while its ignore count lasts). ``self.hit``:
        the breakpoints it stops at."""
        if self.mode == "run":
            return False
        matched = []
        if self.breakpoints:
            ops = (next((a for a in rv.apis if a), None) or rv.signature.op, rv.signature.op)
            labels = [lane.label for lane in rv.lanes]
            matched = [bp for bp in self.breakpoints if bp.matches(ops, rv.signature.names, rv.seq, rv.sites, labels)]
        for bp in matched:
            bp.hits += 1
        if self.mode == "continue":
            self.hit = []
            for bp in matched:
                if bp.ignore > 0:
                    bp.ignore -= 1
                else:
                    self.hit.append(bp)
            return bool(self.hit)
        self.hit = matched
        self.remaining -= 1
        return self.remaining <= 0


# -- the Python API -------------------------------------------------------------------------------------------

class Session:
    """A mapped call running in a background thread, held at its stops (see the module's docs).

    Attributes:
        stop: the current :class:`Stop`, or None once the call has finished.
        result: the call's result once it finished without error.
        error: the exception the call ended with (DebuggerQuit after :meth:`quit`), else None.
        finished: whether the call has ended.
    """

    _active: "Session | None" = None

    def __init__(self, fun: Callable, args: tuple, kwargs: dict, breakpoints: Sequence[str] = ()):
        if Session._active is not None:
            raise RuntimeError("another spmdsim debugging session is active; finish it (finish() or quit()) first.")
        self._control = _Controller(breakpoints)
        Session._active = self
        self.stop: Stop | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self._stops: "queue.Queue[Stop | None]" = queue.Queue()
        self._command: "queue.Queue[str]" = queue.Queue()
        _runtime.pause_hooks.append(self._pause)
        _runtime.failure_hooks.append(self._failed)
        self._thread = threading.Thread(target=self._run, args=(fun, args, kwargs), name="spmdsim debug", daemon=True)
        self._thread.start()
        self.stop = self._stops.get()
        _keep_jupyter_output()

    @property
    def breakpoints(self) -> list[Breakpoint]:
        """The breakpoints set, in the order set."""
        return list(self._control.breakpoints)

    def _run(self, fun, args, kwargs) -> None:
        try:
            self.result = fun(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - reported through the session
            self.error = e
        finally:
            _runtime.pause_hooks.remove(self._pause)
            _runtime.failure_hooks.remove(self._failed)
            Session._active = None
            self.finished = True
            self._stops.put(None)

    def _hold(self, stop: Stop) -> None:
        """Hand ``stop`` to the caller and wait for its command (in the device thread holding the devices)."""
        self._stops.put(stop)
        command = self._command.get()
        stop.held = False
        if command == "quit":
            self._control.go("run", None)
            if stop.error is None:
                raise DebuggerQuit("the user quit the spmdsim debugger")

    def _pause(self, rv) -> None:
        with self._control.lock:
            if self._control.wants(rv):
                self._control.count += 1
                self._hold(_collective_stop(self._control.count - 1, rv, self._control.hit))

    def _failed(self, world, error) -> None:
        if isinstance(error, CollectiveError) and self._control.mode != "run":
            with self._control.lock:
                self._control.count += 1
                self._hold(_error_stop(self._control.count - 1, world, error))

    def _resume(self, mode: str, n: int | None) -> Stop | None:
        if self.stop is None:
            return None
        self._control.go(mode, n)
        self._command.put(mode)
        self.stop = self._stops.get()
        _keep_jupyter_output()
        return self.stop

    def next(self, n: int = 1) -> Stop | None:
        """Release the current stop and run to the ``n``-th next rendezvous.

        Returns:
            The new stop, or None when the call has finished (see ``result`` and ``error``).
        """
        return self._resume("next", _count(n))

    def cont(self, n: int | None = None) -> Stop | None:
        """Release the current stop and run to the next breakpoint hit; with no breakpoint set, to the end. A
        would-hang or mismatch stops anyway. As gdb's ``continue N``: with ``n``, the breakpoints the current stop
        was hit at pass over their next ``n - 1`` hits (ignored when the stop is at no breakpoint).

        Returns:
            The new stop, or None when the call has finished (see ``result`` and ``error``).
        """
        if n is not None and self.stop is not None:
            self._control.ignore_at(self.stop, _count(n))
        return self._resume("continue", None)

    def finish(self) -> Any:
        """Run to the end without stopping (not even at a would-hang or mismatch).

        Returns:
            The call's result.

        Raises:
            Exception: the call's error, e.g. CollectiveDeadlockError.
        """
        self._control.breakpoints.clear()
        while self._resume("run", None) is not None:
            pass
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.result

    def quit(self) -> None:
        """Stop the program at the current stop: the call ends with DebuggerQuit (or, at an error stop, with
        that error)."""
        if self.stop is not None:
            self._command.put("quit")
        self._thread.join()
        self.stop = None

    def break_at(self, spec: str) -> Breakpoint:
        """Add a breakpoint (see :class:`Breakpoint` for ``spec``); :meth:`cont` runs to the next hit.

        Raises:
            ValueError: ``spec`` cannot be read.
        """
        return self._control.add(spec)

    def clear(self, number: int | None = None) -> None:
        """Delete breakpoint ``number`` (every breakpoint without it).

        Raises:
            ValueError: there is no such breakpoint.
        """
        self._control.clear(number)

    def eval(self, device: int, expression: str) -> Any:
        """Evaluate ``expression`` in the frame of the current stop's ``device`` (see :func:`evaluate`).

        Raises:
            ValueError: no current stop, or the device has no frame held there.
        """
        if self.stop is None:
            raise ValueError("the call has finished: there is no stop to evaluate in.")
        return evaluate(self.stop, device, expression)


def _keep_jupyter_output() -> None:
    """While a session holds a call across notebook cells, the call's ordered-output stream stays installed as
    ``sys.stdout``; ipykernel points output at the running cell through ``sys.stdout.set_parent``, so the
    stream must pass that on (else later cells' output is lost). To be moved into spmdsim.runtime._output."""
    stream = sys.stdout
    if isinstance(stream, _output.DeviceStream) and hasattr(stream.stream, "set_parent") \
            and "set_parent" not in vars(stream):
        stream.set_parent = stream.stream.set_parent


def _count(n) -> int:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"expected a count of at least 1, got {n!r}")
    return n


def step(fun: Callable, *args, breakpoints: Sequence[str] = (), **kwargs) -> Session:
    """Start ``fun(*args, **kwargs)`` (a mapped function) in the debugger.

    Args:
        fun: a mapped function, e.g. ``spmdsim.pmap(f, axis_name="i")``.
        *args: its positional arguments.
        breakpoints: breakpoint texts (see :class:`Breakpoint`); with none the call stops at its first
            collective, with some at the first breakpoint hit.
        **kwargs: its keyword arguments.

    Returns:
        A :class:`Session` at its first stop (``session.stop`` is None if the call finished first).

    Raises:
        RuntimeError: another session is active.
        ValueError: a breakpoint cannot be read.

    Example:
        >>> import numpy as np, spmdsim
        >>> f = spmdsim.pmap(lambda x: spmdsim.lax.psum(x, "i"), axis_name="i")
        >>> s = spmdsim.debug.step(f, np.arange(3.0))
        >>> print(s.stop)
        stop 0: psum(float64[], axis_name='i') (step 0) at <doctest spmdsim.debug.step[1]>:1
        device          operand  result
        --------------  -------  ------
        device 0 [i=0]  0.       3.
        device 1 [i=1]  1.       3.
        device 2 [i=2]  2.       3.
        >>> s.finish()
        array([3., 3., 3.])
    """
    return Session(fun, args, kwargs, breakpoints)


# -- the terminal front end -----------------------------------------------------------------------------------

HELP = """commands (a command's first letter is enough):
  n, next [N]              release; stop at the next collective (the N-th next)
  c, continue [N]          run to the next breakpoint; with none set, to the end. N (as gdb's): the
                           breakpoint stopped at passes over its next N-1 hits first
  b, break [SPEC]          add a breakpoint; SPEC: any of OP, FILE:LINE, LINE, axis=NAME, step=K, device=D
                           (e.g. 'b psum step=3', 'b train.py:42 device=2'); alone: list the breakpoints.
                           OP is the function called or a primitive implementing it: psum also stops at
                           psum_invariant (jax.lax.psum in a shard_map) and at pmean (which meets in a psum)
  cl, clear [K]            delete breakpoint K (every breakpoint without K)
  s, show DEVICE [operand|result]   a device's full operand (default) or result
  p, print DEVICE EXPR     evaluate EXPR in DEVICE's frame where it called the collective
  w, where                 every device: its state, collective, step and source line
  l, list                  show this stop again
  q, quit                  stop the program (exit status 0, as pdb; Ctrl-D too)
  h, help                  this text
DEVICE is a device id (5 for device 5 [x=2, y=1]), as in b device=D. Enter repeats the last command; Up
and Down recall earlier ones. Ctrl-C does not end the program at a stop (q does)."""

COMMANDS = {"n": "next", "next": "next", "c": "continue", "cont": "continue", "continue": "continue",
            "b": "break", "break": "break", "cl": "clear", "clear": "clear", "s": "show", "show": "show",
            "p": "print", "print": "print", "w": "where", "where": "where", "l": "list", "list": "list",
            "q": "quit", "quit": "quit", "exit": "quit", "h": "help", "help": "help", "?": "help"}


PROMPT = "(spmdsim) "
INTERRUPT_HINT = ("--KeyboardInterrupt--\n(the program is held at this stop; Ctrl-C does not end it here: type q to "
                  "quit, c to run on)")


class _Prompt:
    """The terminal debugger: runs in the device thread that stopped, reads commands from ``stdin`` (through
    GNU readline, with line editing and history, when ``line_editing`` is set: stdin is a terminal). An empty
    line repeats the last command, as in pdb and gdb."""

    def __init__(self, stdin, stdout, control: _Controller, line_editing: bool = False):
        self.stdin, self.stdout, self.control = stdin, stdout, control
        self.line_editing = line_editing
        self.quitting = False
        self.holding = False  # a stop is up: a Ctrl-C now gets a hint, not a KeyboardInterrupt that ends the devices
        self.reading = False  # waiting for a command (the hint is followed by the prompt again)
        self.last = ""  # the last command, for an empty line
        self.errors_shown: list[BaseException] = []

    def _read(self) -> str | None:
        """The next command line, or None at the end of input."""
        self.reading = True
        try:
            if self.line_editing:  # input() in this (device) thread: readline draws the prompt and edits the line
                try:
                    return input(PROMPT)
                except EOFError:
                    return None
            self.stdout.write(PROMPT)
            self.stdout.flush()
            line = self.stdin.readline()
            return line or None
        finally:
            self.reading = False

    def interrupted(self) -> None:
        """A Ctrl-C at a stop (called in the main thread, by the SIGINT handler): as pdb does, say so and go on;
        at the prompt, the line typed so far is drawn again under the hint (readline keeps it; the terminal drops
        it)."""
        typed = ""
        if self.reading and self.line_editing:
            import readline
            typed = readline.get_line_buffer()
        self.stdout.write("\n" + INTERRUPT_HINT + "\n" + (PROMPT + typed if self.reading else ""))
        self.stdout.flush()

    def say(self, text: str) -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def pause(self, rv) -> None:
        with self.control.lock:
            if self.control.wants(rv):
                self.control.count += 1
                self.interact(_collective_stop(self.control.count - 1, rv, self.control.hit))

    def failed(self, world, error) -> None:
        if isinstance(error, CollectiveError) and not self.quitting:
            with self.control.lock:
                self.control.count += 1
                self.errors_shown.append(error)
                self.interact(_error_stop(self.control.count - 1, world, error))

    def interact(self, stop: Stop) -> None:
        """Show ``stop`` and answer commands until one releases it. Raises DebuggerQuit on quit (at a
        collective; at an error stop the program ends with that error)."""
        self.holding = True
        try:
            self.say(stop.table())
            if stop.error is not None:
                self.say(_error_hint(stop))
            while not self._command(stop):
                pass
        finally:
            stop.held = self.holding = False

    def _command(self, stop: Stop) -> bool:
        """Read and run one command; True when it releases the stop."""
        line = self._read()
        if line is None:
            line = "quit"
        words = line.split() or self.last.split()
        if not words:
            return False
        self.last = " ".join(words)
        command, rest = COMMANDS.get(words[0]), words[1:]
        try:
            if command in ("next", "continue"):
                if rest and not (rest[0].isdigit() and int(rest[0]) >= 1):
                    raise ValueError(f"{command} N: N is a count of at least 1, got {rest[0]!r}")
                n = int(rest[0]) if rest else None
                if command == "next":
                    self.control.go("next", n or 1)
                else:
                    if n is not None:
                        self.say(self.control.ignore_at(stop, n))
                    self.control.go("continue", None)
                return True
            if command == "quit":
                self.quitting = True
                self.control.go("run", None)
                if stop.error is None:
                    raise DebuggerQuit("the user quit the spmdsim debugger")
                return True
            self.say(self._answer(command, rest, stop, words[0]))
        except ValueError as e:
            self.say(f"*** {e}")
        return False

    def _answer(self, command: str | None, rest: list[str], stop: Stop, word: str) -> str:
        if command == "list":
            return stop.table()
        if command == "where":
            stop.state = _states(stop)
            return cell_names("\n".join(stop.state))
        if command == "help":
            return HELP
        if command == "break":
            if not rest:
                return "\n".join(f"{bp.number}: {bp} (hit {bp.hits} times"
                                 + (f"; the next {bp.ignore} ignored)" if bp.ignore else ")")
                                 for bp in self.control.breakpoints) \
                    or "no breakpoints; add one with: b SPEC (see h)"
            bp = self.control.add(" ".join(rest))
            return f"breakpoint {bp.number}: {bp}"
        if command == "clear":
            gone = self.control.clear(int(rest[0]) if rest and rest[0].isdigit() else None)
            return "deleted " + ", ".join(f"breakpoint {bp.number} ({bp})" for bp in gone)
        if command == "show":
            return _show(stop, rest)
        if command == "print":
            if len(rest) < 2 or not rest[0].isdigit():
                raise ValueError("usage: p DEVICE EXPR, e.g. p 2 x.sum()")
            return _safe_eval(stop, int(rest[0]), " ".join(rest[1:]))
        return f"*** unknown command {word!r}; h lists the commands"


def _safe_eval(stop: Stop, device: int, expression: str) -> str:
    """The expression's value as text, or its error as one line (the program goes on). Raises ValueError
    when the device has no frame to evaluate in."""
    frame = _held_frame(stop, device)
    try:
        value = _in_frame(frame, expression)
    except Exception as e:  # noqa: BLE001 - the user's expression failed; say so and go on
        return f"*** {type(e).__name__}: {e}"
    if isinstance(value, (np.ndarray, np.generic)):  # values with their dtype and shape, not np.float64(...)
        with np.printoptions(threshold=64, edgeitems=3, precision=6):
            return f"{np.array2string(np.asarray(value))}  ({value.dtype}{list(np.shape(value))})"
    return repr(value)


def _error_hint(stop: Stop) -> str:
    """What to do at an error stop, fitting the program: NumPy programs' held devices have Python frames (p);
    a JAX program's devices run jaxprs, so their operands are what there is to read (s)."""
    held = [k for k in range(len(stop.devices)) if _held(stop, k)]
    if stop._frames is None:
        stop._frames = _device_frames(stop._lanes)
    inspect = "where, p DEVICE EXPR" if any(k in stop._frames for k in held) or not held else \
        "where; s DEVICE: the operand a waiting device holds"
    return (f"The program stopped here; every device is still where it was. Inspect them ({inspect}), then c to "
            f"end the program with this error.")


def _show(stop: Stop, rest: list[str]) -> str:
    if not rest or not rest[0].isdigit():
        raise ValueError("usage: show DEVICE [operand|result], DEVICE a device id of the stop, e.g. s 2 r")
    device = int(rest[0])
    rank = stop.row(device)
    what = "result" if len(rest) > 1 and rest[1].startswith("r") else "operand"
    if stop.error is not None:  # the operand a waiting device holds; nothing has a result
        lane = stop._lanes[rank]
        if not _held(stop, rank) or what == "result":
            raise ValueError(f"at an error stop only a waiting device's operand can be shown; {lane.label} is "
                             f"{_state(stop, rank)}")
        if rank in stop._calling:
            raise ValueError(f"{lane.label} is {_state(stop, rank)}: its operand never reached a rendezvous; "
                             f"p {device} EXPR reads its variables")
        rv, at = lane.waiting
        values, site = rv.blocks[at], rv.sites[at]
    else:
        values, site = (stop.results if what == "result" else stop.operands)[rank], stop.sites[rank]
    with np.printoptions(threshold=1000, edgeitems=5, precision=6):
        body = "\n".join(np.array2string(np.asarray(v)) for v in values)
    return f"{stop.devices[rank]} {what} at {cell_names(site)}:\n{body}"


def parser():
    """The options of ``spmdsim debug`` (the program and its arguments are split off first)."""
    from spmdsim.cli import ArgumentParser, positive_int

    p = ArgumentParser(
        prog="spmdsim debug",
        usage="spmdsim debug [options] SCRIPT.py [args]\n       spmdsim debug [options] -m MODULE [args]",
        description="Run a program and stop at its collectives: every device of the group is held there, its "
                    "operands and results side by side; a would-hang or mismatch stops too. NumPy programs need no "
                    "jax; with jax installed, jax.pmap is replaced as by spmdsim run. Type h at the prompt for the "
                    "commands.",
        epilog="--devices and --break are spmdsim's wherever they appear; arguments after -- all go to the program.")
    p.add_argument("--devices", type=positive_int, default=None, metavar="N",
                   help="number of virtual devices (default: SPMDSIM_NUM_DEVICES or 8)")
    p.add_argument("-b", "--break", dest="breakpoints", action="append", default=[], metavar="SPEC",
                   help="stop only at collectives matching SPEC (any of OP, FILE:LINE, LINE, axis=NAME, step=K, "
                        "device=D; quote it if it has spaces); repeatable. Without it: stop at every collective")
    return p


def main(argv: list[str] | None = None) -> int:
    """``spmdsim debug``: returns 0 when the program finished or the user quit (``q``, Ctrl-D: as pdb), the
    program's exit status when it raised (1) or exited.

    Raises:
        UsageError: bad options or breakpoints, no program, or a program that does not exist.
    """
    import spmdsim
    from spmdsim.tools._script import check_program, run_program, split_argv
    from spmdsim.cli import UsageError

    ours, program = split_argv(list(sys.argv[1:] if argv is None else argv), ("--devices", "-b", "--break"))
    args = parser().parse_args(ours)
    if program is None:
        raise UsageError("give the program to debug: spmdsim debug [options] SCRIPT.py [args], or -m MODULE [args]")
    origin = check_program(program)
    try:
        control = _Controller(args.breakpoints, program=origin)
    except ValueError as e:
        raise UsageError(str(e)) from None
    prompt = _Prompt(sys.stdin, _output.real_stdout(), control, line_editing=_line_editing())
    where = (f"stopping at {' or '.join(repr(str(bp)) for bp in control.breakpoints)}" if control.breakpoints
             else "stopping at every collective")
    prompt.say(f"spmdsim debug: {program.name}; {where}. Type h for help.")
    n_devices = args.devices or spmdsim.device_count()
    _runtime.pause_hooks.append(prompt.pause)
    _runtime.failure_hooks.append(prompt.failed)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_interrupts_at(prompt))
            stack.enter_context(spmdsim.set_device_count(n_devices))
            stack.enter_context(spmdsim.reuse_threads())
            if _jax_installed():
                from spmdsim.jax.integration._patch import patched_jax
                stack.enter_context(patched_jax(n_devices))
            code = run_program(program, shown=prompt.errors_shown)
    except DebuggerQuit as e:
        prompt.say(f"spmdsim debug: stopped ({e}).")
        return 0  # the user quit: a success, as pdb's q
    finally:
        _runtime.pause_hooks.remove(prompt.pause)
        _runtime.failure_hooks.remove(prompt.failed)
    if prompt.quitting:  # q at a would-hang or mismatch: the program ended with the error shown there
        prompt.say("spmdsim debug: stopped (the user quit the spmdsim debugger).")
        return 0
    prompt.say("spmdsim debug: the program finished." if code == 0 else
               f"spmdsim debug: the program ended with exit status {code}.")
    return code


def _line_editing() -> bool:
    """Whether the prompt reads through GNU readline (stdin and stdout are a terminal, readline imports)."""
    if not (sys.stdin.isatty() and _output.real_stdout().isatty()):
        return False
    try:
        import readline  # noqa: F401 - imported for input()'s line editing and history, as pdb does
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def _interrupts_at(prompt: _Prompt):
    """While the program runs under the debugger, a Ctrl-C at a stop is answered as pdb answers one at its prompt
    (a hint, and the prompt again; the devices stay held); while the program runs it is a KeyboardInterrupt, as
    without the debugger."""
    import signal

    def on_interrupt(signum, frame):
        if prompt.holding:
            prompt.interrupted()
        elif callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _jax_installed() -> bool:
    """Whether jax can be imported (checked without importing it; a folder named jax is not jax)."""
    import importlib.util

    spec = importlib.util.find_spec("jax")
    return spec is not None and spec.origin is not None
