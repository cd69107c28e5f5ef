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

import queue
import sys
import threading
from typing import Any, Callable, Sequence

from spmdsim.runtime import _output, _runtime
from spmdsim.errors import CollectiveError
from spmdsim.tools._debug_stops import DebuggerQuit, Stop, _collective_stop, _error_stop, evaluate
from spmdsim.tools._debug_stops import brief  # noqa: F401  (public here: spmdsim.debug.brief)
from spmdsim.tools._debugger import Breakpoint, _Controller, main

__all__ = ["Stop", "Breakpoint", "Session", "step", "DebuggerQuit", "main"]


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
