"""The protocol that makes the hosts' mapped calls one global call (see :mod:`spmdsim._hosts`).

Host 0 is the **coordinator**. For each top-level mapped call (the k-th of every host):

1. **Meeting.** Every other host sends ``("call", k, desc)``; the coordinator, at its own k-th call, waits until
   every host has either sent it or finished its program (or died): a host that finished is a
   CollectiveDeadlockError, calls over different meshes a CollectiveMismatchError, both naming the hosts; all
   hosts get the answer. No timeout: a host that has neither called nor finished is still computing.
2. **One World.** The coordinator runs the call's :class:`~spmdsim._rendezvous.World` with a lane for every
   global device: its own devices run the function; every other device has a *stand-in* lane there (a thread
   serving that device's messages). A device of another host runs the function on its host, in a
   :class:`RemoteWorld`, and each of its collectives is a message to its stand-in, which meets the other lanes
   in the World's rendezvous and sends back the device's results. So the rule runs once, on the coordinator, on
   every device's block in global rank order: the numbers are those of one process, bit for bit. Deadlocks
   and mismatches are found by the one World, which knows every device's state exactly (a device of another
   host counts as running until its message arrives), so they are certain, never timed out.
3. **Outcome.** When every lane (stand-ins included) has finished, the coordinator sends the call's outcome (
   nothing, or the error to raise: the first device error in global device order, or the World's failure) to
   every host, and each host returns its own devices' outputs or raises it.

What a device prints travels with its messages and is printed by the coordinator, in global device order at each
rendezvous. A device that raises, a failure of the World, a lost host: the coordinator's stand-ins tell their
hosts to stop (``abort``); devices waiting there unwind at once, running ones at their next collective.

The vectorized executor (one thread per host, all its devices at once) needs no World: see
:class:`VectorCall`. The end of a host's program is the last message (``exit``); the coordinator answers
late callers (a deadlock: host 0 finished) and, once every host has finished, sends everyone every host's
result (``bye``).
"""
from __future__ import annotations

import collections
import functools
import math
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, NamedTuple

import numpy as np

from spmdsim import _hosts, _output, _primitives, _reduction, _runtime
from spmdsim._axes import Unnamed
from spmdsim._reports import Signature, describe, format_table, mismatch_text
from spmdsim._rendezvous import DONE, JOINING, RAISED, RUNNING, WAITING, Aborted, World, ordinal
from spmdsim.errors import CollectiveDeadlockError, CollectiveMismatchError, HostLostError, RemoteError

__all__ = ["Host", "RemoteWorld", "CallDesc", "run_spoofed", "portable"]

COORDINATOR = 0
FIX = ("Fix: every host must take the same steps in the same order: the same mapped calls (the same mesh and "
       "executor), and the end of the run_hosts function.")


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


def _how(error: BaseException | None) -> str:
    """How a host's function ended, in a few words: "returned" or "raised ValueError: first line"."""
    if error is None:
        return "returned"
    text = str(error).split("\n", 1)[0]
    return f"raised {type(error).__name__}: {text[:60]}{'...' if len(text) > 60 else ''}"


def portable(error: BaseException | None) -> BaseException | None:
    """``error`` as another host will receive it: a copy made by pickling (the class, message, notes and
    ``device_errors``; no traceback), or a :class:`~spmdsim.errors.RemoteError` with its text when it does not
    pickle."""
    if error is None:
        return None
    try:
        return pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any failure to pickle or unpickle
        copy = RemoteError(f"{type(error).__name__}: {error}")
        for note in getattr(error, "__notes__", ()):
            copy.add_note(note)
        return copy


def _steps(n: int) -> str:
    return f"{n} step{'' if n == 1 else 's'}"


def _shipped(error: BaseException | None, label: str) -> BaseException | None:
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


class _Waiting:
    """Where a device of a :class:`RemoteWorld` waits, shaped like a rendezvous for its status row."""

    __slots__ = ("signature", "seq", "sites", "apis")

    def __init__(self, signature, seq: int, site: str, api):
        self.signature, self.seq, self.sites, self.apis = signature, seq, (site,), (api,)


class Host:
    """One host of a multi-host run: ``index`` of ``count`` hosts, ``local`` devices, and its end of the
    ``transport`` to the others. Its host thread (spoofed) or main thread (MPI) makes the mapped calls."""

    def __init__(self, index: int, count: int, local: int, transport):
        self.index, self.count, self.local = index, count, local
        self.transport = transport
        self.cond = threading.Condition()
        self.calls = 0
        self.call = None              # the global call in progress here: _CoordinatorCall, RemoteWorld, VectorCall
        self.meeting: dict = {}       # coordinator: call -> {host: CallDesc}
        self.exited: dict = {}        # coordinator: host -> (calls made, how its program ended)
        self.failed: dict = {}        # coordinator: call -> the error its meeting ended with
        self.answers: dict = {}       # call -> None (go) or the error the meeting ended with
        self.outcomes: dict = {}      # call -> None or the error every host raises
        self.vector: dict = {}        # call -> messages of a vectorized call (see VectorCall)
        self.lost: dict = {}          # host -> what happened to it
        self.farewell = None          # every host's result, from the coordinator's "bye"
        self.main_thread: threading.Thread | None = None
        self.waiting_main = 0         # > 0 while the main thread waits for another host (it sees a loss there)
        self.pending: BaseException | None = None  # a lost host's error, for the main thread's signal handler
        self.finished = False
        transport.start(self._deliver, self._lose)

    @property
    def devices(self) -> range:
        """The global indices of this host's devices: ``index * local`` up to ``(index + 1) * local``."""
        return range(self.index * self.local, (self.index + 1) * self.local)

    # -- messages ---------------------------------------------------------------------------------------

    def send(self, dest: int, message: tuple) -> None:
        self.transport.send(dest, message)

    def _deliver(self, source: int, message: tuple) -> None:
        """File a message from host ``source`` and wake whoever waits for it (never blocks, never sends)."""
        kind = message[0]
        if kind in ("arrive", "nested", "done", "result", "abort"):
            call = self.call
            if call is not None and call.k == message[1]:
                call.deliver(source, message)
            return
        with self.cond:
            if kind == "call":
                self.meeting.setdefault(message[1], {})[source] = message[2:]
            elif kind == "answer":
                self.answers[message[1]] = message[2:]
            elif kind == "outcome":
                self.outcomes[message[1]] = message[2]
            elif kind == "vx":  # ("vx", call, tag, source host, *payload)
                self.vector.setdefault(message[1], {})[(message[2], message[3])] = message[4:]
            elif kind == "exit":
                self.exited[source] = message[1:]
                self.transport.departed(source)
            elif kind == "bye":
                self.farewell = True
                for h in range(self.count):  # every host has finished: ends from now on are expected
                    self.transport.departed(h)
            else:
                raise AssertionError(f"spmdsim bug: unknown host message {kind!r}")
            self.cond.notify_all()

    def _lose(self, host: int, reason: str) -> None:
        """Host ``host`` is gone: every wait for it ends with a HostLostError naming it."""
        error = HostLostError(f"{reason}; every host stops. On real hardware the others would wait for it "
                              f"(JAX: until its heartbeat times out).")
        with self.cond:
            if host in self.lost or host in self.exited:
                return
            self.lost[host] = error
            call = self.call
            self.cond.notify_all()
        if call is not None:
            call.lose(error)
        if self.main_thread is not None:
            _interrupt_main(self, error)

    def lost_error(self, hosts=None) -> HostLostError | None:
        """A copy of the error of a lost host among ``hosts`` (default: any), or None."""
        for h, error in sorted(self.lost.items()):
            if hosts is None or h in hosts:
                return portable(error)
        return None

    def wait_for(self, ready: Callable[[], Any], hosts=None):
        """Wait (holding ``cond``) until ``ready()`` returns something other than None and return it; a lost host
        among ``hosts`` (default: any) raises its HostLostError."""
        self.waiting_main += threading.current_thread() is self.main_thread
        try:
            while True:
                found = ready()
                if found is not None:
                    return found
                error = self.lost_error(hosts)
                if error is not None:
                    raise error
                self.cond.wait()
        finally:
            self.waiting_main -= threading.current_thread() is self.main_thread

    # -- a host's program --------------------------------------------------------------------------------

    def run_program(self, fn: Callable, args: tuple = (), kwargs: dict | None = None) -> list:
        """Run ``fn`` as this host's function (``spmdsim.run_hosts``), then gather every host's result: the end of
        the function is a step of the hosts' sequence (a host still making mapped calls there is reported).
        Returns the results in host order; raises this host's own error, else the first other host's."""
        error = None
        try:
            result = ("value", fn(*args, **(kwargs or {})))
        except BaseException as e:  # noqa: BLE001 - reported to the other hosts, then raised
            error, result = e, ("error", e)
        k = self.calls
        self.calls += 1
        desc = CallDesc("gather", (), _how(error), "")
        try:
            results = self.meet(k, desc, self._portable_result(result))
        except BaseException:
            if error is None:
                raise
            results = None
        if error is not None:
            raise error  # the function's own error comes first
        for h, (kind, item) in enumerate(results):
            if kind == "error":
                item.add_note(f"spmdsim: raised by the function of host {h}.")
                raise item
        return [item for _, item in results]

    def finish(self, how: str = "returned") -> None:
        """The end of this host's program (``how``: "returned", "raised ...", "exited with status 1"). The
        coordinator answers every step taken after its own end with a deadlock report and waits for every host's
        end; then every host may exit (``bye``). Only the first call counts."""
        if self.finished:
            return
        self.finished = True
        if self.index != COORDINATOR:
            self.send(COORDINATOR, ("exit", self.calls, how))
            with self.cond:
                try:
                    self.wait_for(lambda: self.farewell, hosts=(COORDINATOR,))
                except HostLostError:
                    pass
            return
        answered: set = set()
        with self.cond:
            self.exited[COORDINATOR] = (self.calls, how)
        while True:
            with self.cond:
                late = [(k, h, desc) for k, hosts in self.meeting.items() for h, (desc, _) in hosts.items()
                        if (k, h) not in answered]
                done = all(h in self.exited or h in self.lost for h in range(self.count))
                if not late and not done:
                    self.cond.wait()
                    continue
                lost = self.lost_error()
            for k, h, desc in late:  # a lost host, not the coordinator's end, is why these steps cannot complete
                answered.add((k, h))
                self.send(h, ("answer", k, lost or self.failed.get(k) or self._finished_error(k, desc, h), None))
            if done and not late:
                break
        for h in range(1, self.count):
            self.transport.departed(h)
            if h in self.exited:
                self.send(h, ("bye", True))

    @staticmethod
    def _portable_result(result: tuple) -> tuple:
        kind, item = result
        if kind == "error":
            return kind, portable(item)
        try:
            pickle.dumps(item)
        except Exception as e:  # noqa: BLE001
            return "error", RemoteError(f"the program's result ({type(item).__name__}) does not pickle: {e}")
        return result

    def _finished_error(self, k: int, desc: CallDesc, caller: int) -> CollectiveDeadlockError:
        calls, how = self.exited[COORDINATOR]
        rows = [("host 0", f"finished after {_steps(calls)} ({how})", "", "")]
        rows += [(f"host {h}", f"waiting in its {ordinal(k + 1)} step", d.text(), d.site)
                 for h, (d, _) in sorted(self.meeting.get(k, {}).items())]
        text = (f"the {ordinal(k + 1)} step of the hosts ({desc.text()}, at {desc.site} on host {caller}) "
                f"can never complete: host 0 finished its program without reaching it. On real hardware this "
                f"program hangs.\n\n" + format_table([("host", "state", "mapped call", "source line"), *rows])
                + f"\n\n{FIX}")
        return CollectiveDeadlockError(text, [" ".join(r).strip() for r in rows])

    # -- a mapped call -----------------------------------------------------------------------------------

    def begin(self, executor: str, axes) -> tuple[int, CallDesc]:
        """Number this host's next top-level mapped call over ``axes`` and describe it."""
        k = self.calls
        self.calls += 1
        return k, describe_call(axes, executor)

    def meet(self, k: int, desc: CallDesc, payload=None):
        """Step 1 of the module docstring: return when every host takes the same k-th step (with every host's
        ``payload``, in host order, for a "gather"), else raise."""
        if self.index != COORDINATOR:
            self.send(COORDINATOR, ("call", k, desc, payload))
            with self.cond:
                error, payloads = self.wait_for(lambda: self.answers.pop(k, None), hosts=(COORDINATOR,))
            if error is not None:
                raise error
            return payloads
        others = range(1, self.count)
        with self.cond:
            def settled():
                arrived = self.meeting.get(k, {})
                missing = [h for h in others if h not in arrived]
                if any(h in self.lost for h in missing):
                    return ("lost", self.lost_error(missing))
                if any(h in self.exited for h in missing):
                    return ("exited", [h for h in missing if h in self.exited])
                return None if missing else ("all", None)
            state, detail = self.wait_for(settled, hosts=())
            arrived = self.meeting.pop(k, {})
        descs = {COORDINATOR: desc, **{h: d for h, (d, _) in arrived.items()}}
        if state == "lost":
            error = detail
        elif state == "exited":
            error = self._meeting_deadlock(k, descs, detail)
        elif any(not d.same_call(desc) for d in descs.values()):
            error = self._meeting_mismatch(k, descs)
        else:
            error = None
        payloads = None
        if error is None and desc.kind == "gather":
            payloads = [payload] + [arrived[h][1] for h in others]
        for h in arrived:
            self.send(h, ("answer", k, portable(error), payloads))
        if error is not None:
            self.failed[k] = portable(error)  # also the answer to a host that reaches this step later
            raise error
        return payloads

    def _meeting_table(self, k: int, descs: dict) -> list[tuple]:
        rows = []
        for h in range(self.count):
            if h in descs:
                rows.append((f"host {h}", f"waiting in its {ordinal(k + 1)} step", descs[h].text(),
                             descs[h].site))
            elif h in self.exited:
                calls, how = self.exited[h]
                rows.append((f"host {h}", f"finished after {_steps(calls)} ({how})", "", ""))
            else:
                rows.append((f"host {h}", f"running, not yet at its {ordinal(k + 1)} step", "", ""))
        return rows

    def _meeting_deadlock(self, k: int, descs: dict, missing: list) -> CollectiveDeadlockError:
        rows = self._meeting_table(k, descs)
        desc = descs[COORDINATOR]
        gone = ", ".join(f"host {h}" for h in missing)
        text = (f"the {ordinal(k + 1)} step of the hosts ({desc.text()}, at {desc.site}) can never "
                f"complete: {gone} finished {'its program' if len(missing) == 1 else 'their programs'} without "
                f"reaching it. On real hardware this program hangs.\n\n"
                + format_table([("host", "state", "mapped call", "source line"), *rows])
                + f"\n\n{FIX}")
        return CollectiveDeadlockError(text, [" ".join(r).strip() for r in rows])

    def _meeting_mismatch(self, k: int, descs: dict) -> CollectiveMismatchError:
        rows = self._meeting_table(k, descs)
        lines = "\n".join(f"  host {h}: {d.text()}{f' at {d.site}' if d.site else ''}"
                           for h, d in sorted(descs.items()))
        text = (f"hosts took different steps as their {ordinal(k + 1)}:\n{lines}\nOn real hardware this "
                f"hangs or exchanges garbage.\n\n" + format_table([("host", "state", "mapped call", "source line"),
                                                                    *rows])
                + f"\n\n{FIX}")
        return CollectiveMismatchError(text, [" ".join(r).strip() for r in rows])

    def _check_spans(self, axes: tuple) -> None:
        """A mapped call made by the hosts spans every host's devices: ValueError otherwise."""
        total = math.prod(size for _, size in axes)
        if total != self.count * self.local:
            raise ValueError(f"a top-level mapped call in a multi-host run spans every host's devices "
                             f"({self.count} hosts x {self.local} local devices = {self.count * self.local}), "
                             f"but this one's mesh ({', '.join(f'{n}={s}' for n, s in axes)}) has {total}. Build "
                             f"the mesh from every device (jax.devices(), spmdsim.devices()), or map over the "
                             f"local devices (pmap's mapped axis is the host's local device count).")

    def run(self, body: Callable[[int], Any], axes: tuple) -> list:
        """A top-level mapped call over the global mesh ``axes`` on the thread executor: ``body(j)`` runs this
        host's j-th device; returns this host's devices' results (see the module docstring)."""
        self._check_spans(axes)
        k, desc = self.begin("threads", axes)
        # The call's state exists before the meeting ends: the other hosts' devices send to it right after.
        call = _CoordinatorCall(self, k, World(self)) if self.index == COORDINATOR else RemoteWorld(self, k)
        with self.cond:
            self.call = call
        try:
            self.meet(k, desc)
            if self.index == COORDINATOR:
                return self._coordinate(k, body, axes, call)
            return self._follow(k, body, axes, call)
        finally:
            with self.cond:
                self.call = None

    def _coordinate(self, k: int, body: Callable, axes: tuple, call: "_CoordinatorCall") -> list:
        world = call.world
        lanes = _runtime.top_level_placement(axes).lanes_in(world)
        L = self.local

        def lane_body(i: int):
            return body(i) if i < L else call.serve((i,), i // L)

        error = None
        try:
            results, errors = _runtime.run_lanes(world, lanes, lane_body, None)
            results = _runtime.outcome(world, lanes, results, errors, None)
        except BaseException as e:  # noqa: BLE001 - every host raises it
            error = e
        with self.cond:
            self.call = None
        shipped = portable(error)
        for h in range(1, self.count):
            self.send(h, ("outcome", k, shipped))
        if error is not None:
            raise error
        return results[:L]

    def _follow(self, k: int, body: Callable, axes: tuple, world: "RemoteWorld") -> list:
        lanes = _runtime.top_level_placement(axes).lanes_in(world, indices=self.devices)
        for d, lane in zip(self.devices, lanes, strict=True):
            world.keys[lane], world.by_key[(d,)] = (d,), lane
        results, _ = _runtime.run_lanes(world, lanes, body, None)
        with self.cond:
            error = self.wait_for(lambda: (self.outcomes.pop(k),) if k in self.outcomes else None,
                                  hosts=(COORDINATOR,))[0]
        if error is not None:
            raise world.localized(error)
        return results

    def run_vectorized(self, fn: Callable, axes: tuple):
        """A top-level mapped call over the global mesh ``axes`` on the vectorized executor: ``fn(batch)`` computes
        this host's devices (a :class:`~spmdsim._primitives.Batch` of the global mesh holding them), its
        collectives across hosts going through a :class:`VectorCall`. Returns ``fn``'s result; raises the error of
        the first host (in host order) that failed."""
        self._check_spans(axes)
        k, desc = self.begin("vectorized", axes)
        self.meet(k, desc)
        call = VectorCall(self, k)
        with self.cond:
            self.call = call
        error, result = None, None
        try:
            result = fn(_primitives.Batch(axes, np.arange(self.devices.start, self.devices.stop), host=call))
        except BaseException as e:  # noqa: BLE001 - every host learns of it
            error = e
        finally:
            with self.cond:
                self.call = None
        return call.end(error, result)

    def watch_main_thread(self) -> None:
        """MPI: this process's main thread runs the host's program; a lost host interrupts it (see
        :func:`_interrupt_main`). Call from the main thread."""
        self.main_thread = threading.main_thread()

        def raise_pending(signum, frame):
            error, self.pending = self.pending, None
            if error is not None:
                raise error

        signal.signal(LOST_SIGNAL, raise_pending)
        signal.signal(signal.SIGUSR1, lambda signum, frame: None)  # MPICH: "a process died"; the watcher sees it

    def exit_process(self, how: str = "returned") -> None:
        """MPI, at the end of the process: :meth:`finish`, then stop the messenger. After a lost host, end the
        process at once (MPI's own finalization would wait for the dead one)."""
        self.finish(how)
        self.transport.close()
        if self.lost:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)


class _CoordinatorCall:
    """The coordinator's side of one global call: the World, and the mailboxes of the stand-in lanes."""

    def __init__(self, host: Host, k: int, world: World):
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


class _PeerFailed(Exception):
    """This host stopped its vectorized call because another host failed (its error is the call's outcome)."""


class VectorCall:
    """The hosts' side of one global call on the vectorized executor: each host computes its own devices, all at
    once, in its host thread; a collective whose communicators lie within each host is computed there, one that
    spans hosts is a numbered step of the call:

    1. every host sends every other host its call (signature, line) and, unless the step is a chain, its devices'
       operands; different calls are a CollectiveMismatchError on every host, the same on each;
    2. a **chain**, for a reduction that every host holds a run of consecutive ranks of, in every group
       (``psum`` over a pmap axis, or over the host-major mesh axis): the partial fold travels host to host in
       rank order (each host folds its ranks into it, exactly the one-process fold) and the last host sends the
       result to all: every host holds its own blocks and one partial, never every host's;
    3. otherwise every host computes the collective on every host's operands, in global device order (the
       one-process computation) and keeps its devices' results.

    A host whose devices finished without reaching a step the others wait in is a CollectiveDeadlockError; at the
    end every host sends every other its outcome, and every host raises the first host's error."""

    def __init__(self, host: Host, k: int):
        self.host, self.k = host, k
        self.step = 0

    def lose(self, error: HostLostError) -> None:
        pass  # every wait here is in the host thread, which sees the loss itself

    # -- messages ------------------------------------------------------------------------------------------

    def _send(self, dest: int, tag, *payload) -> None:
        self.host.send(dest, ("vx", self.k, tag, self.host.index, *payload))

    def _wait(self, tag, source: int, what: str = ""):
        """The payload of message ``tag`` from host ``source``; raises when ``source`` ended the call before
        sending it (a deadlock, or _PeerFailed when it failed)."""
        host, inbox = self.host, None

        def ready():
            found = host.vector.get(self.k, {})
            if (tag, source) in found:
                return (found.pop((tag, source)),)
            if tag != "end" and ("end", source) in found:
                return ("ended",)
            return None

        with host.cond:
            inbox = host.wait_for(ready)
        if inbox[0] != "ended":
            return inbox[0]
        steps, error, peer_failed = host.vector[self.k][("end", source)][:3]
        if error is not None or peer_failed:  # it ended because a device failed somewhere: not a deadlock
            raise _PeerFailed
        raise self._deadlock(source, what, steps)

    def _deadlock(self, source: int, what: str, steps: int) -> CollectiveDeadlockError:
        return CollectiveDeadlockError(
            f"{what} can never complete: host {source}'s devices returned without reaching it (after {steps} "
            f"collective{'' if steps == 1 else 's'} across hosts). On real hardware this program hangs.\n\n"
            f"Fix: make every device call the same collectives in the same order.", [f"host {source}: returned"])

    def end(self, error: BaseException | None, result):
        """The outcome of the call on every host: the error of the first host that failed, else ``result``."""
        mine = None if isinstance(error, _PeerFailed) else error
        for h in range(self.host.count):
            if h != self.host.index:
                self._send(h, "end", self.step, portable(mine), isinstance(error, _PeerFailed))
        errors = {}
        for h in range(self.host.count):
            if h == self.host.index:
                errors[h] = mine
                continue
            with self.host.cond:
                found = self.host.wait_for(lambda: self.host.vector.get(self.k, {}).get(("end", h)))
            errors[h] = found[1]
        with self.host.cond:
            self.host.vector.pop(self.k, None)
        first = next((h for h in sorted(errors) if errors[h] is not None), None)
        if first is None:
            if error is not None:  # _PeerFailed, yet nobody failed: cannot happen
                raise AssertionError("spmdsim bug: a host stopped for a failure nobody reported") from error
            return result
        if first == self.host.index:
            raise mine
        raise errors[first]

    # -- collectives ---------------------------------------------------------------------------------------

    def collective(self, batch, prim, named: tuple, positions: list, groups, rule_params: dict, operands: list,
                   params: dict, api: str, site, epilogue) -> list:
        """``Batch.collective`` for a batch of this host's devices (see the class docstring)."""
        count = self.host.count
        per_host = batch.count // count
        box = _hosts.host_box(batch.axes, per_host)
        first = self.host.index * per_host
        present = batch.present()
        if all(box[p][1] == batch.sizes[p] for p in positions):  # every communicator lies within a host
            ids = None if len(present) == per_host else present - first
            return _primitives.Batch(box, ids).collective(prim, named, operands, params, api, site, epilogue)
        if len(present) != per_host:
            raise NotImplementedError(
                f"{api} over {named!r} inside a cond or while branch that only some of a host's devices take, in a "
                f"multi-host run: the vectorized executor cannot exchange the blocks of part of a host's devices "
                f"with other hosts. Use executor='threads', or move the collective out of the branch.")
        avals = tuple((x.shape[1:], x.dtype) for x in operands)
        signature = Signature(prim.name, tuple(named), tuple(batch.sizes[p] for p in positions),
                              (("axis_index_groups", groups), *sorted(rule_params.items())), avals)
        site = (site() if callable(site) else site) or "<unknown>"
        step, self.step = self.step, self.step + 1
        order = self._chain_order(batch, prim, positions, groups, per_host)
        payload = None if order is not None else list(operands)
        others = [h for h in range(count) if h != self.host.index]
        for h in others:
            self._send(h, step, signature, site, api, payload)
        what = f"{describe(signature, api)} (collective {step} across hosts)"
        calls = {self.host.index: (signature, site, api, payload)}
        for h in others:
            calls[h] = self._wait(step, h, what)
        if any(c[0] != signature for c in calls.values()):
            raise self._mismatch(calls, step)
        if order is None:
            full = [np.concatenate([calls[h][3][i] for h in range(count)]) for i in range(len(operands))]
            out = _primitives.Batch(batch.axes).collective(prim, named, full, params, api, site, epilogue)
            return [o[first:first + per_host] for o in out]
        return self._chain(step, order, box, positions, prim, operands, epilogue, signature.sizes)

    def _mismatch(self, calls: dict, step: int) -> CollectiveMismatchError:
        lines = [f"host {h}'s devices: {describe(sig, api)} at {site}" for h, (sig, site, api, _) in
                 sorted(calls.items())]
        return CollectiveMismatchError(mismatch_text(f"at collective {step} across hosts", lines,
                                                     "(vectorized executor: every device of a host makes the "
                                                     "same call)"), lines)

    def _chain_order(self, batch, prim, positions: list, groups, per_host: int) -> list | None:
        """The hosts in rank order when the reduction can be a chain (see the class docstring), else None."""
        if prim.name not in ("psum", "pmax", "pmin") or groups is not None:
            return None
        if prim.name == "psum" and _reduction.current_reduction_order().order != "sequential":
            return None
        others = [p for p in range(len(batch.axes)) if p not in positions]
        box = _hosts.host_box(batch.axes, per_host)
        if any(box[p][1] != batch.sizes[p] for p in others):
            return None  # some groups lie on other hosts only
        ranges = []
        for h in range(self.host.count):
            ranks = _primitives.Batch(batch.axes, np.arange(h * per_host, (h + 1) * per_host)).axis_index(
                tuple(batch.names[p] for p in positions), "psum")
            low = int(ranks.min())
            within = np.sort(np.unique(ranks))
            if len(within) * (batch.count // math.prod(batch.sizes[p] for p in positions)) != per_host \
                    or not np.array_equal(within, np.arange(low, low + len(within))):
                return None
            ranges.append((low, h))
        return [h for _, h in sorted(ranges)]

    def _chain(self, step: int, order: list, box, positions: list, prim, operands: list, epilogue,
               sizes: tuple) -> list:
        local = _primitives.Batch(box)
        ufunc = _primitives.REDUCERS[prim.name]
        grouped = [local._to_groups(x, positions) for x in operands]  # (G, ranks here, *block), in rank order
        me = order.index(self.host.index)
        partial = None if me == 0 else self._wait((step, "chain"), order[me - 1],
                                                  f"{prim.name} (collective {step} across hosts)")[0]
        folded = [_fold_on(ufunc, None if partial is None else partial[i], x) for i, x in enumerate(grouped)]
        if me + 1 < len(order):
            self._send(order[me + 1], (step, "chain"), folded)
            final = self._wait((step, "final"), order[-1], f"{prim.name} (collective {step} across hosts)")[0]
        else:
            final = [_frozen(f.astype(x.dtype, copy=False)) for f, x in zip(folded, grouped, strict=True)]
            for h in order[:-1]:
                self._send(h, (step, "final"), final)
        n = math.prod(sizes)
        out = []
        for f, x in zip(final, grouped, strict=True):
            y = _primitives._replicated(x, f)
            out.append(local._from_groups(y if epilogue is None else epilogue(y, n), positions))
        return out


def _fold_on(ufunc, partial, x: np.ndarray) -> np.ndarray:
    """``partial`` (None: nothing yet) folded with ``x[:, 0], x[:, 1], ...`` left to right, in the accumulation
    dtype of the current reduction order: the one-process sequential fold, continued on this host."""
    acc = None
    if ufunc is np.add:
        order = _reduction.current_reduction_order()
        acc = order.accumulation_dtype or (np.dtype(np.float32) if x.dtype == _reduction._BFLOAT16 else None)
    blocks = [x[:, r] if acc is None else x[:, r].astype(acc) for r in range(x.shape[1])]
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.array(blocks[0]) if partial is None else ufunc(partial, blocks[0])
        for b in blocks[1:]:
            ufunc(out, b, out=out)
    return out


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class RemoteWorld:
    """The devices of one global call that run on a host other than the coordinator, as the runtime sees a
    world (see :class:`~spmdsim._rendezvous.World`): each collective, nested call and end is a message to the
    device's stand-in on the coordinator, whose answer it waits for. ``orders_output`` is False: their text
    goes to the coordinator with their messages."""

    observers = ()
    orders_output = False

    def __init__(self, host: Host, k: int):
        self.host, self.k = host, k
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
        self.send(("done", self.k, key, state, _shipped(error, lane.label), _output.take(lane)))

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
        from spmdsim._reports import TABLE_HEADER
        return format_table([TABLE_HEADER, *(lane.status_row() for lane in self.lanes)])

    def localized(self, error: BaseException) -> BaseException:
        """The outcome ``error`` to raise here: when its first device ran on this host, that device's own
        exception (with its traceback), given the outcome's notes and ``device_errors``."""
        errors = getattr(error, "device_errors", None)
        if not errors:
            return error
        mine = self.local_errors.get(next(iter(errors)))
        if mine is None or type(mine) is not type(error):
            return error
        mine.device_errors = errors
        mine.__notes__ = list(getattr(error, "__notes__", ()))
        return mine.with_traceback(_runtime._filtered(mine.__traceback__))


LOST_SIGNAL = signal.SIGUSR2  # MPICH's mpiexec sends SIGUSR1 itself
LOST_EXIT_SECONDS = 3.0


def _interrupt_main(host: Host, error: HostLostError) -> None:
    """MPI: a lost host ends this process's program within a few seconds, wherever its main thread is: a wait for
    another host or a mapped call ends with the error by itself; otherwise the main thread gets it from a signal
    (which also interrupts a ``time.sleep``). A program still running ``LOST_EXIT_SECONDS`` later (it caught the
    error, or is stuck in C) is ended with the error on stderr."""
    def end() -> None:
        time.sleep(0.2)
        if not host.waiting_main and host.call is None and not host.finished:
            host.pending = error
            signal.pthread_kill(host.main_thread.ident, LOST_SIGNAL)
        time.sleep(LOST_EXIT_SECONDS)
        sys.stderr.write(f"spmdsim: host {host.index}: {error}\nspmdsim: host {host.index}'s program did not end "
                         f"within {LOST_EXIT_SECONDS:g} s; exiting.\n")
        sys.stderr.flush()
        os._exit(1)

    threading.Thread(target=end, name="spmdsim lost host", daemon=True).start()


STOP_SECONDS = 1.0  # after Ctrl-C, how long run_spoofed waits for the host threads (one busy in its own code
#                    runs on, a daemon, until its next mapped call, which raises)


def run_spoofed(count: int, local: int, fn: Callable, args: tuple, kwargs: dict) -> list:
    """``spmdsim.run_hosts`` in one process: ``count`` host threads, each running ``fn`` as its host."""
    from spmdsim import _hosts, _transport

    fabric = _transport.Fabric(count)
    hosts = [Host(h, count, local, fabric.transport(h)) for h in range(count)]
    outcome: list = [None] * count

    def host_main(h: int) -> None:
        _hosts._local.host = host = hosts[h]
        try:
            outcome[h] = ("value", host.run_program(fn, args, kwargs))
        except BaseException as e:  # noqa: BLE001 - raised by run_hosts
            outcome[h] = ("error", e)
        finally:
            host.finish(_how(outcome[h][1] if outcome[h][0] == "error" else None))
            _hosts._local.host = None

    threads = [threading.Thread(target=host_main, args=(h,), name=f"spmdsim host {h}", daemon=True)
               for h in range(count)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:  # Ctrl-C: every host loses the others, so that every wait ends, then stops
        for host in hosts:
            for h in range(count):
                if h != host.index:
                    host._lose(h, f"host {h} stopped by Ctrl-C")
        for t in threads:
            t.join(timeout=STOP_SECONDS)
        raise
    kind, item = outcome[0]
    if kind == "error":
        raise item
    return item
