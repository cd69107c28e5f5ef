"""The devices of one global call that run on a host other than the coordinator (see
:mod:`spmdsim.hosts.host`): a world with the methods the runtime calls on a :class:`~spmdsim.runtime._rendezvous.World`,
whose every collective is a message to the device's stand-in on the coordinator (:mod:`spmdsim.hosts.coordinator`).
"""
from __future__ import annotations

import functools
import threading

from spmdsim.runtime import _output, _runtime
from spmdsim.runtime._rendezvous import JOINING, RUNNING, WAITING, Aborted
from spmdsim.runtime._reports import TABLE_HEADER, format_table
from spmdsim.errors import HostLostError
from spmdsim.hosts.messages import COORDINATOR, shipped

__all__ = ["RemoteWorld"]


class _Waiting:
    """Where a device of a :class:`RemoteWorld` waits, shaped like a rendezvous for its status row."""

    __slots__ = ("signature", "seq", "sites", "apis")

    def __init__(self, signature, seq: int, site: str, api):
        self.signature, self.seq, self.sites, self.apis = signature, seq, (site,), (api,)


class RemoteWorld:
    """The devices of one global call that run on a host other than the coordinator, as the runtime sees a
    world (see :class:`~spmdsim.runtime._rendezvous.World`): each collective, nested call and end is a message to the
    device's stand-in on the coordinator, whose answer it waits for. ``orders_output`` is False: their text
    goes to the coordinator with their messages."""

    observers = ()
    orders_output = False

    def __init__(self, host, k: int):
        self.host, self.k = host, k
        self.group = host  # the process group its devices run in (see spmdsim.runtime._process_group)
        self.lock = threading.Lock()
        self.lanes: list = []
        self.keys: dict = {}       # lane -> its key: (global device,) or a nested device's path
        self.by_key: dict = {}
        self.failure: BaseException | None = None
        self.raised: dict = {}     # lane -> the error it raised (sent when it finishes)
        self.local_errors: dict = {}  # label -> the error raised by that local device
        self.replies: dict = {}
        self._communicators: dict = {}

    def communicator_id(self, key: tuple) -> int:
        with self.lock:
            return self._communicators.setdefault(key, len(self._communicators))

    def send(self, message: tuple) -> None:
        self.host.send(COORDINATOR, message)

    def deliver(self, source: int, message: tuple) -> None:
        if message[0] == "abort":
            self.fail_here(Aborted())
            return
        _, _, key, results = message  # "result"
        with self.lock:
            lane = self.by_key.get(key)
            if lane is None or lane.state != WAITING:
                return
            self.replies[lane] = results
            lane.state = RUNNING
        lane.wake.release()

    def lose(self, error: HostLostError) -> None:
        self.fail_here(error)

    def fail_here(self, error: BaseException) -> None:
        """Stop this host's devices: the waiting ones now, the others at their next collective."""
        with self.lock:
            if self.failure is None:
                self.failure = error
            waiting = [lane for lane in self.lanes if lane.state == WAITING]
            for lane in waiting:
                lane.state = RUNNING
        for lane in waiting:
            lane.wake.release()

    # -- the runtime's side --------------------------------------------------------------------------------

    def start(self, lanes: list, parent) -> None:
        with self.lock:
            self.lanes.extend(lanes)
            if parent is None:
                return
            parent.state = JOINING
            parent_key = self.keys[parent]
            for j, lane in enumerate(lanes):
                self.keys[lane] = key = parent_key + (parent.nested_calls - 1, j)
                self.by_key[key] = lane
        frames = lanes[0].frames[len(parent.frames):]
        self.send(("nested", self.k, parent_key, tuple((f.name, f.size) for f in frames), frames[-1].is_device,
                   _output.take(parent)))

    def finish(self, lane, state: str, where: str = "") -> None:
        with self.lock:
            lane.state, lane.where = state, where
            call = lane.call
            call.remaining -= 1
            if call.remaining == 0 and call.parent is not None:
                call.parent.state = RUNNING
            error = self.raised.pop(lane, None)
            key = self.keys[lane]
        self.send(("done", self.k, key, state, shipped(error, lane.label), _output.take(lane)))

    def fail(self, error: BaseException) -> None:
        lane = _runtime.current_lane()
        if lane is not None and lane.world is self:
            with self.lock:  # the device's own error: sent to the coordinator when it finishes
                self.raised[lane] = self.local_errors[lane.label] = error
            return
        self.fail_here(error)  # Ctrl-C here

    def rendezvous(self, lane, chan, signature, site: str, api, leaves: list, combine) -> list:
        with self.lock:
            if self.failure is not None:
                raise Aborted
            seq = chan.step[0]
            chan.step[0] = seq + 1
            lane.state, lane.waiting = WAITING, (_Waiting(signature, seq, site, api), 0)
            key = self.keys[lane]
        epilogue = combine.keywords.get("epilogue") if isinstance(combine, functools.partial) else None
        self.send(("arrive", self.k, key, chan.names, signature, site, api, leaves, epilogue, _output.take(lane)))
        lane.wake.acquire()
        with self.lock:
            reply = self.replies.pop(lane, None)
        if reply is None:
            raise Aborted
        return reply

    def device_table(self) -> str:
        return format_table([TABLE_HEADER, *(lane.status_row() for lane in self.lanes)])

    def localized(self, error: BaseException) -> BaseException:
        """The outcome ``error`` to raise here: when its first device ran on this host, that device's own
        exception (with its traceback), given the outcome's notes and ``device_errors``."""
        errors = getattr(error, "device_errors", None)
        if not errors:
            return error
        mine = self.local_errors.get(next(iter(errors)))
        # a class not on the wire's allow-list came back as a RemoteError naming it (spmdsim.hosts.wire)
        same = mine is not None and (type(mine) is type(error) or getattr(error, "remote_type", None)
                                     == f"{type(mine).__module__}.{type(mine).__qualname__}")
        if not same:
            return error
        mine.device_errors = errors
        mine.__notes__ = list(getattr(error, "__notes__", ()))
        return mine.with_traceback(_runtime._filtered(mine.__traceback__))
