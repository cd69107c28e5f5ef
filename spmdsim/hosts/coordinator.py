"""The coordinator's side of one global call on the thread executor (step 2 of :mod:`spmdsim.hosts.host`): the
call's one :class:`~spmdsim.runtime._rendezvous.World` on host 0, and a *stand-in* lane there for every device of another
host, serving that device's messages (its collectives, nested calls and end) from a mailbox.
"""
from __future__ import annotations

import collections
import functools
import threading

from spmdsim.runtime import _output, _runtime

from spmdsim.primitives import _primitives
from spmdsim.runtime._rendezvous import DONE, RAISED, Aborted, World
from spmdsim.errors import HostLostError

__all__ = ["CoordinatorCall"]


class _Mailbox:
    """Messages for one stand-in lane, in arrival order."""

    def __init__(self):
        self.items: collections.deque = collections.deque()
        self.ready = threading.Semaphore(0)

    def put(self, item) -> None:
        self.items.append(item)
        self.ready.release()

    def get(self):
        self.ready.acquire()
        return self.items.popleft()


class CoordinatorCall:
    """The coordinator's side of one global call: the World, and the mailboxes of the stand-in lanes."""

    def __init__(self, host, k: int, world: World):
        self.host, self.k, self.world = host, k, world
        self.lock = threading.Lock()
        self.boxes: dict = {}
        self.aborted: set = set()
        world.failure_callbacks.append(self._wake_all)

    def box(self, key: tuple) -> _Mailbox:
        with self.lock:
            box = self.boxes.get(key)
            if box is None:
                box = self.boxes[key] = _Mailbox()
            return box

    def deliver(self, source: int, message: tuple) -> None:
        self.box(message[2]).put(message)

    def _wake_all(self, error) -> None:
        with self.lock:
            boxes = list(self.boxes.values())
        for box in boxes:
            box.put(None)

    def lose(self, error: HostLostError) -> None:
        self.world.fail(error)

    def serve(self, key: tuple, owner: int):
        """The stand-in for device ``key`` of host ``owner`` (run as that device's lane here): meet the others
        in each collective it reaches, start its nested calls, end as it ends."""
        lane = _runtime.current_lane()
        box = self.box(key)
        try:
            while True:
                if self.world.failure is not None and not box.items:
                    raise Aborted
                message = box.get()
                if message is None:
                    continue
                kind = message[0]
                _output.emit(lane, message[-1])
                if kind == "arrive":
                    _, _, _, names, signature, site, api, leaves, epilogue, _ = message
                    chan = _runtime.channel(lane, names, api)
                    results = self.world.rendezvous(lane, chan, signature, site, api, leaves,
                                                    _combine(signature, epilogue))
                    self.host.send(owner, ("result", self.k, key, results))
                elif kind == "nested":
                    _, _, _, axes, is_device, _ = message
                    nested = lane.nested_calls
                    try:
                        _runtime.run_mapped(lambda j: self.serve(key + (nested, j), owner), axes,
                                            is_device=is_device)
                    except Exception:  # noqa: BLE001 - the nested devices' host reports them (their "done")
                        pass
                else:  # "done"
                    _, _, _, state, error, _ = message
                    if state == DONE:
                        return None
                    if state == RAISED:
                        raise error
                    raise Aborted
        except Aborted:
            with self.lock:
                tell = owner not in self.aborted
                self.aborted.add(owner)
            if tell:
                self.host.send(owner, ("abort", self.k))
            raise


@functools.lru_cache(maxsize=256)
def _combine_cached(op: str, params: tuple, epilogue):
    prim = _primitives.PRIMITIVES[op]
    rule_params = dict(params)
    groups = rule_params.pop("axis_index_groups")
    return functools.partial(_primitives.apply_grouped, prim.rule, groups=groups, params=rule_params,
                             epilogue=epilogue)


def _combine(signature, epilogue):
    """The combine step of a rendezvous whose last arriver is a stand-in (see ``bind``)."""
    try:
        return _combine_cached(signature.op, signature.params, epilogue)
    except TypeError:  # an unhashable parameter
        return _combine_cached.__wrapped__(signature.op, signature.params, epilogue)
