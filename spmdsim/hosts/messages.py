"""What the hosts send each other about a call (see :mod:`spmdsim.hosts.host`): the step a host takes
(:class:`CallDesc`), how its program ended, and errors made fit to travel (:func:`portable`, :func:`shipped`).
"""
from __future__ import annotations

import traceback
from typing import NamedTuple

from spmdsim.runtime import _runtime
from spmdsim.runtime._axes import Unnamed
from spmdsim.errors import RemoteError
from spmdsim.hosts import wire

__all__ = ["COORDINATOR", "FIX", "CallDesc", "describe_call", "how_it_ended", "portable", "shipped", "steps_text"]

COORDINATOR = 0
FIX = ("Fix: every host must take the same steps in the same order: the same mapped calls (the same mesh and "
       "executor), and the end of the run_hosts function.")


@wire.record_type
class CallDesc(NamedTuple):
    """A host's k-th step in the sequence the hosts must agree on: a top-level mapped call (``kind="map"``: the
    global mesh, the executor, where) or the end of a ``run_hosts`` function (``kind="gather"``: how it ended)."""

    kind: str        # "map" or "gather"
    axes: tuple      # ((name, size), ...), unnamed axes written as text
    executor: str    # "threads" or "vectorized"; for "gather": how the function ended
    site: str

    def same_call(self, other: "CallDesc") -> bool:
        if self.kind == "gather":
            return other.kind == "gather"
        return (self.kind, self.axes, self.executor) == (other.kind, other.axes, other.executor)

    def text(self) -> str:
        if self.kind == "gather":
            return f"the end of its run_hosts function ({self.executor})"
        mesh = ", ".join(f"{n}={s}" if isinstance(n, str) else f"{n!r}={s}" for n, s in self.axes)
        return f"map over [{mesh}] ({self.executor})"


def describe_call(axes, executor: str) -> CallDesc:
    names = tuple((f"<unnamed {n.api} axis>" if isinstance(n, Unnamed) else n, s) for n, s in axes)
    return CallDesc("map", names, executor, _runtime.user_site())


def how_it_ended(error: BaseException | None) -> str:
    """How a host's function ended, in a few words: "returned" or "raised ValueError: first line"."""
    if error is None:
        return "returned"
    text = str(error).split("\n", 1)[0]
    return f"raised {type(error).__name__}: {text[:60]}{'...' if len(text) > 60 else ''}"


def portable(error: BaseException | None) -> BaseException | None:
    """``error`` as another host will receive it, through the hosts' wire format (:mod:`spmdsim.hosts.wire`: the
    class when it is on the allow-list, the message, notes and ``device_errors``; no traceback), or a
    :class:`~spmdsim.errors.RemoteError` with its text when it cannot travel."""
    if error is None:
        return None
    try:
        return wire.roundtrip(error)
    except Exception:  # noqa: BLE001 - any failure to make the copy
        copy = RemoteError(f"{type(error).__name__}: {error}")
        for note in getattr(error, "__notes__", ()):
            copy.add_note(note)
        return copy


def steps_text(n: int) -> str:
    return f"{n} step{'' if n == 1 else 's'}"


def shipped(error: BaseException | None, label: str) -> BaseException | None:
    """A device's error as the coordinator receives it (see :func:`portable`), with a note holding the user's
    frames of its traceback (a traceback does not travel)."""
    shipped = portable(error)
    if shipped is not None:
        frames = [f for f in traceback.extract_tb(error.__traceback__)
                  if not f.filename.startswith(_runtime._PACKAGE_DIR)]
        if frames:
            text = "".join(traceback.format_list(frames)).rstrip()
            shipped.add_note(f"spmdsim: traceback on {label}:\n{text}")
    return shipped
