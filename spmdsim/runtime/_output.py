"""Ordered per-device output: what a device prints is labelled with the device and released in device order
at each rendezvous (and when the mapped call ends), instead of interleaving the way threads (or
``jax.debug.print`` on hardware) do. Text printed outside mapped functions passes straight through.

On by default; ``spmdsim.set_ordered_output(False)`` (a statement or a context manager) turns it off.
"""
from __future__ import annotations

import functools
import io
import os
import sys
import threading

__all__ = ["DeviceStream", "set_ordered_output", "ordered_output_enabled", "take", "emit"]

_enabled = True


def ordered_output_enabled() -> bool:
    return _enabled


class set_ordered_output:
    """Turn ordered, labelled device output on or off; as a context manager the previous setting returns."""

    def __init__(self, enabled: bool = True):
        global _enabled
        self.previous, _enabled = _enabled, bool(enabled)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        global _enabled
        _enabled = self.previous


class StandInStream(io.TextIOBase):
    """A text stream standing in for ``stream`` (``sys.stdout``, ``sys.stderr``): writable, with its file
    descriptor, encoding and errors, so that ``input()`` (the debugger's prompt) reads through readline as it
    would on the terminal itself. Subclasses say what ``write`` does."""

    stream: io.TextIOBase

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", None)

    @property
    def errors(self):
        return getattr(self.stream, "errors", None)


class DeviceStream(StandInStream):
    """Stands in for ``sys.stdout`` during a mapped call: device threads write into per-device buffers."""

    def __init__(self, stream, current_lane):
        self.stream, self._current_lane = stream, current_lane
        self._buffers: dict = {}
        self._lock = threading.Lock()
        self.users = 0
        self.saved_hook = sys.breakpointhook
        self.hook = functools.partial(_breakpoint, self)

    def write(self, text: str) -> int:
        lane = self._current_lane()
        if lane is None:
            return self.stream.write(text)
        with self._lock:
            self._buffers.setdefault(lane, []).append(text)
        return len(text)

    def flush(self) -> None:
        if self._current_lane() is None and not getattr(self.stream, "closed", False):  # (closed: at exit)
            self.stream.flush()

    def release(self) -> None:
        """Write every device's buffered text, device by device in device order, each line labelled."""
        if not self._buffers:  # nothing printed (a device printing now is released at the next release)
            return
        with self._lock:
            if not self._buffers:
                return
            buffers, self._buffers = self._buffers, {}
        out = []
        for lane in sorted(buffers, key=lambda ln: tuple(f.index for f in ln.frames)):
            text = "".join(buffers[lane])
            out.extend(f"{lane.label} | {line}\n" for line in text.splitlines())
        self.stream.write("".join(out))
        self.stream.flush()


_install_lock = threading.Lock()
_last: DeviceStream | None = None  # the device stream of the last call, for the next call over the same stream


def begin(current_lane) -> DeviceStream | None:
    """Install the device stream for a top-level mapped call (shared by concurrent calls), and a
    ``breakpoint()`` hook whose pdb talks to the terminal, not to the device's buffer."""
    global _last
    if not _enabled:
        return None
    with _install_lock:
        stream = sys.stdout
        if not isinstance(stream, DeviceStream):
            if _last is None or _last.stream is not stream or _last._current_lane is not current_lane:
                _last = DeviceStream(stream, current_lane)
            stream = _last
        if stream.users == 0:
            stream.saved_hook = sys.breakpointhook
            sys.breakpointhook = stream.hook
        stream.users += 1
        sys.stdout = stream
        return stream


def end(stream: DeviceStream | None, release: bool = True) -> None:
    """The end of a top-level call: release what its devices printed (``release=False``: a host whose devices'
    text goes to another host, see :func:`take`), and put the terminal stream back after the last call."""
    if stream is None:
        return
    if release:
        stream.release()
    with _install_lock:
        stream.users -= 1
        if stream.users == 0:
            sys.breakpointhook = stream.saved_hook
            if sys.stdout is stream:
                sys.stdout = stream.stream


def _breakpoint(stream: DeviceStream, *args, **kwargs):
    """``breakpoint()`` inside a device: pdb on the terminal, its prompt naming the device. Devices that reach a
    breakpoint together take turns: one device's pdb prompt at a time, the others wait for theirs (see
    :func:`_device_pdb`)."""
    lane = stream._current_lane()
    if lane is None or os.environ.get("PYTHONBREAKPOINT") is not None:
        return stream.saved_hook(*args, **kwargs)
    stream.release()
    _device_pdb(lane.label, stream.stream).set_trace(sys._getframe().f_back)


_pdb_turn = threading.Lock()  # the terminal, held by the device whose pdb prompt is up


def _device_pdb(label: str, stdout):
    """A pdb for the device ``label`` that takes the terminal while it prompts: its prompt names the device,
    and another device's pdb waits until this one runs on (n, s, c, ...). The turn is held only while prompting,
    so a device stepping into a collective lets the others reach it. spmdsim's own frames are skipped."""
    import pdb

    class DevicePdb(pdb.Pdb):
        def interaction(self, frame, traceback):
            with _pdb_turn:
                super().interaction(frame, traceback)

    debugger = DevicePdb(stdout=stdout, skip=["spmdsim", "spmdsim.*"])
    debugger.prompt = f"(Pdb {label}) "
    return debugger


def take(lane) -> str:
    """What ``lane`` printed and has not been released yet, taken out of the device stream (a host passes its
    devices' text to the host that orders every host's output; see :mod:`spmdsim.hosts.host`)."""
    stream = sys.stdout
    if not isinstance(stream, DeviceStream):
        return ""
    with stream._lock:
        return "".join(stream._buffers.pop(lane, ()))


def emit(lane, text: str) -> None:
    """Buffer ``text`` as printed by ``lane`` (released with the others, in device order); written at once when
    ordered output is off."""
    if not text:
        return
    stream = sys.stdout
    if isinstance(stream, DeviceStream):
        with stream._lock:
            stream._buffers.setdefault(lane, []).append(text)
    else:
        stream.write(text)


def release_all() -> None:
    """Called at each rendezvous: release what the devices printed so far."""
    stream = sys.stdout
    if isinstance(stream, DeviceStream):
        stream.release()


def real_stdout():
    """The terminal stream under any device stream (for the debugger's own output)."""
    stream = sys.stdout
    return stream.stream if isinstance(stream, DeviceStream) else stream
