"""The debugger's breakpoints and decision to stop (:class:`Breakpoint`, shared by :mod:`spmdsim.debug`'s
``Session`` and the terminal), and its terminal front end, ``spmdsim debug`` (:func:`main`: the prompt, its
commands, Ctrl-C at a stop). Public through :mod:`spmdsim.debug`."""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import re
import sys
import threading
from typing import Any, Sequence

import numpy as np

from spmdsim.runtime import _output, _runtime
from spmdsim.runtime._reports import cell_names
from spmdsim.errors import CollectiveError
from spmdsim.tools._debug_stops import (OPS, PRIMITIVE, DebuggerQuit, Stop, _collective_stop, _device_frames,
                                        _device_number, _error_stop, _held, _held_frame, _in_frame, _state, _states)


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
    from spmdsim.cli import ArgumentParser, add_device_options

    p = ArgumentParser(
        prog="spmdsim debug",
        usage="spmdsim debug [options] SCRIPT.py [args]\n       spmdsim debug [options] -m MODULE [args]",
        description="Run a program and stop at its collectives: every device of the group is held there, its "
                    "operands and results side by side; a would-hang or mismatch stops too. NumPy programs need no "
                    "jax; with jax installed, jax.pmap is replaced as by spmdsim run. Type h at the prompt for the "
                    "commands.",
        epilog="--devices and --break are spmdsim's wherever they appear; arguments after -- all go to the program.")
    add_device_options(p)
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
