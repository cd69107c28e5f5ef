"""Stepping through collectives: every device of a group is held at each rendezvous, after the rule ran
and before anyone takes its result, so every device's operands and results can be read side by side.

Python (a script or a notebook)::

    session = spmdsim.debug.step(spmdsim.pmap(f, axis_name="i"), x)   # runs to the first rendezvous
    print(session.stop.table())          # op, axis, step, and per device: site, operand, result
    session.stop.operands[2]             # device 2's operand leaves (NumPy arrays)
    session.next()                       # on to the next rendezvous (None at the end)
    session.cont()                       # run to the end without stopping; returns the call's result
    session.quit()                       # stop the program: the call raises DebuggerQuit

Terminal: ``spmdsim debug SCRIPT.py [script args] [--devices N]`` runs a script (NumPy or, with jax
installed, JAX with ``jax.pmap`` replaced as by ``spmdsim run``) and prompts at each rendezvous with pdb-style
commands: ``n``\\ext, ``c``\\ontinue, ``s``\\how DEVICE [operand|result], ``w``\\here, ``l``\\ist, ``q``\\uit,
``h``\\elp. One debugging session at a time.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import queue
import runpy
import sys
import threading
from typing import Any, Callable

import numpy as np

from spmdsim import _output, _runtime
from spmdsim._runtime import describe

__all__ = ["Stop", "Session", "step", "DebuggerQuit", "main"]


class DebuggerQuit(BaseException):
    """Raised inside the program when the user quits the debugger (a BaseException, so user code's
    ``except Exception`` does not swallow it)."""


@dataclasses.dataclass
class Stop:
    """One paused rendezvous. Per-device lists are indexed by rank (the axis index for one axis)."""

    number: int
    description: str
    step: int
    devices: list[str]
    sites: list[str]
    operands: list[list[np.ndarray]]
    results: list[list[np.ndarray]]
    state: list[str]

    def table(self) -> str:
        """The stop as text: a header line, then one line per device with its site, operand and result."""
        rows = [("device", "site", "operand", "result")]
        for d, site, ops, res in zip(self.devices, self.sites, self.operands, self.results):
            rows.append((d, site, "; ".join(_brief(o) for o in ops), "; ".join(_brief(r) for r in res)))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        return f"stop {self.number}: {self.description} (step {self.step})\n" + "\n".join(lines)


def _stop(number: int, rv) -> Stop:
    """A Stop from a completed rendezvous; its devices are shown as held there."""
    held = {id(lane): rank for rank, lane in enumerate(rv.lanes)}
    where = describe(rv.signature)
    state = [f"{lane.label}: held at {where} (step {rv.seq}) at {rv.sites[held[id(lane)]]}" if id(lane) in held
             else lane.status_line() for lane in rv.lanes[0].world.lanes]
    return Stop(number, where, rv.seq, [lane.label for lane in rv.lanes], list(rv.sites),
                [list(b) for b in rv.blocks], [list(r) for r in rv.results], state)


def _brief(a) -> str:
    a = np.asarray(a)
    if a.size <= 6:
        return np.array2string(a, precision=4, separator=", ").replace("\n", "")
    flat = a.ravel()
    return f"{a.dtype}{list(a.shape)} [{', '.join(f'{v:.4g}' for v in flat[:3])}, ...]"


class Session:
    """A mapped call running in a background thread, held at each rendezvous (see the module docs)."""

    _active: "Session | None" = None

    def __init__(self, fun: Callable, args: tuple, kwargs: dict):
        if Session._active is not None:
            raise RuntimeError("another spmdsim debugging session is active; finish it (cont() or quit()) first.")
        Session._active = self
        self.stop: Stop | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self._stops: "queue.Queue[Stop | None]" = queue.Queue()
        self._command: "queue.Queue[str]" = queue.Queue()
        self._lock = threading.Lock()
        self._stepping = True
        self._count = 0
        _runtime.pause_hooks.append(self._pause)
        self._thread = threading.Thread(target=self._run, args=(fun, args, kwargs), name="spmdsim debug", daemon=True)
        self._thread.start()
        self.stop = self._stops.get()

    def _run(self, fun, args, kwargs) -> None:
        try:
            self.result = fun(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - reported through the session
            self.error = e
        finally:
            _runtime.pause_hooks.remove(self._pause)
            Session._active = None
            self.finished = True
            self._stops.put(None)

    def _pause(self, rv) -> None:
        if not self._stepping:
            return
        with self._lock:  # one rendezvous at a time
            stop = _stop(self._count, rv)
            self._count += 1
            self._stops.put(stop)
            command = self._command.get()
            if command == "quit":
                raise DebuggerQuit("the user quit the spmdsim debugger")

    def next(self) -> Stop | None:
        """Release the current rendezvous and run to the next one; None when the call has finished."""
        if self.stop is None:
            return None
        self._command.put("next")
        self.stop = self._stops.get()
        return self.stop

    def cont(self) -> Any:
        """Run to the end without stopping; returns the call's result (or raises its error)."""
        self._stepping = False
        if self.stop is not None:
            self._command.put("next")
        self._thread.join()
        self.stop = None
        if self.error is not None:
            raise self.error
        return self.result

    def quit(self) -> None:
        """Stop the program at the current rendezvous: the call ends with DebuggerQuit."""
        if self.stop is not None:
            self._stepping = False
            self._command.put("quit")
        self._thread.join()
        self.stop = None


def step(fun: Callable, *args, **kwargs) -> Session:
    """Start ``fun(*args, **kwargs)`` (a mapped function) paused at its first rendezvous."""
    return Session(fun, args, kwargs)


# -- the terminal front end -------------------------------------------------------------------------------

HELP = """commands:
  n, next                  release this rendezvous and stop at the next one
  c, continue              run to the end without stopping
  s, show DEVICE [operand|result]   print a device's full operand (default) or result
  w, where                 where every device is (state, collective, step, source line)
  l, list                  show this stop again
  q, quit                  stop the program
  h, help                  this text"""


class _Prompt:
    """Runs in the device thread that completed the rendezvous; reads commands from stdin."""

    def __init__(self, stdin, stdout):
        self.stdin, self.stdout = stdin, stdout
        self.count = 0
        self.stepping = True

    def say(self, text: str) -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def __call__(self, rv) -> None:
        if not self.stepping:
            return
        stop = _stop(self.count, rv)
        self.count += 1
        self.say(stop.table())
        while True:
            self.stdout.write("(spmdsim) ")
            self.stdout.flush()
            line = self.stdin.readline()
            if not line:
                raise DebuggerQuit("end of input")
            words = line.split()
            if not words:
                continue
            cmd, rest = words[0], words[1:]
            if cmd in ("n", "next"):
                return
            if cmd in ("c", "continue", "cont"):
                self.stepping = False
                return
            if cmd in ("q", "quit", "exit"):
                raise DebuggerQuit("the user quit the spmdsim debugger")
            if cmd in ("l", "list"):
                self.say(stop.table())
            elif cmd in ("w", "where"):
                self.say("\n".join(stop.state))
            elif cmd in ("s", "show", "p", "print"):
                self.say(self._show(stop, rest))
            else:
                self.say(HELP)

    @staticmethod
    def _show(stop: Stop, rest: list[str]) -> str:
        if not rest or not rest[0].lstrip("-").isdigit() or not 0 <= int(rest[0]) < len(stop.devices):
            return f"usage: show DEVICE [operand|result], DEVICE in 0..{len(stop.devices) - 1}"
        rank = int(rest[0])
        what = rest[1] if len(rest) > 1 else "operand"
        values = stop.results[rank] if what.startswith("r") else stop.operands[rank]
        body = "\n".join(np.array2string(np.asarray(v), precision=6) for v in values)
        return f"{stop.devices[rank]} {'result' if what.startswith('r') else 'operand'} at {stop.sites[rank]}:\n{body}"


def main(argv=None) -> int:
    from spmdsim.jax._run import split_argv  # pure argv handling, no jax import

    argv = list(sys.argv[1:] if argv is None else argv)
    ours, script = split_argv(argv)
    parser = argparse.ArgumentParser(prog="spmdsim debug", description="step through a script's collectives")
    parser.add_argument("--devices", type=int, default=None, help="number of virtual devices")
    args = parser.parse_args(ours)
    if not script:
        parser.error("give the script to debug: spmdsim debug SCRIPT.py [script args] [--devices N]")
    import spmdsim

    prompt = _Prompt(sys.stdin, _output.real_stdout())
    prompt.say(f"spmdsim debug: {script[0]}; stopping at every collective. Type h for help.")
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = script
    sys.path.insert(0, os.path.dirname(os.path.abspath(script[0])))
    _runtime.pause_hooks.append(prompt)
    try:
        with spmdsim.set_device_count(args.devices or spmdsim.device_count()), _maybe_patched_jax(args.devices), \
                spmdsim.reuse_threads():
            runpy.run_path(script[0], run_name="__main__")
    except DebuggerQuit as e:
        prompt.say(f"spmdsim debug: stopped ({e}).")
        return 1
    finally:
        _runtime.pause_hooks.remove(prompt)
        sys.argv, sys.path[:] = saved_argv, saved_path
    prompt.say("spmdsim debug: the program finished.")
    return 0


def _maybe_patched_jax(n_devices):
    import contextlib

    import spmdsim
    try:
        import jax  # noqa: F401
    except ImportError:
        return contextlib.nullcontext()
    from spmdsim.jax._patch import patched_jax
    return patched_jax(n_devices or spmdsim.device_count())
