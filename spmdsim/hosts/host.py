"""The protocol that makes the hosts' mapped calls one global call (see :mod:`spmdsim.hosts`).

Host 0 is the **coordinator**. For each top-level mapped call (the k-th of every host):

1. **Meeting.** Every other host sends ``("call", k, desc)``; the coordinator, at its own k-th call, waits until
   every host has either sent it or finished its program (or died): a host that finished is a
   CollectiveDeadlockError, calls over different meshes a CollectiveMismatchError, both naming the hosts; all
   hosts get the answer. No timeout: a host that has neither called nor finished is still computing.
2. **One World.** The coordinator runs the call's :class:`~spmdsim.runtime._rendezvous.World` with a lane for every
   global device: its own devices run the function; every other device has a *stand-in* lane there (a thread
   serving that device's messages, :mod:`spmdsim.hosts.coordinator`). A device of another host runs the
   function on its host, in a :class:`~spmdsim.hosts.remote_world.RemoteWorld`, and each of its collectives is a
   message to its stand-in, which meets the other lanes in the World's rendezvous and sends back the device's
   results. So the rule runs once, on the coordinator, on every device's block in global rank order: the numbers
   are those of one process, bit for bit. Deadlocks and mismatches are found by the one World, which knows every
   device's state exactly (a device of another host counts as running until its message arrives), so they are
   certain, never timed out.
3. **Outcome.** When every lane (stand-ins included) has finished, the coordinator sends the call's outcome (
   nothing, or the error to raise: the first device error in global device order, or the World's failure) to
   every host, and each host returns its own devices' outputs or raises it.

What a device prints travels with its messages and is printed by the coordinator, in global device order at each
rendezvous. A device that raises, a failure of the World, a lost host: the coordinator's stand-ins tell their
hosts to stop (``abort``); devices waiting there unwind at once, running ones at their next collective.

The vectorized executor (one thread per host, all its devices at once) needs no World: see
:class:`~spmdsim.hosts.vectorized.VectorCall`. The end of a host's program is the last message (``exit``); the
coordinator answers late callers (a deadlock: host 0 finished) and, once every host has finished, sends everyone
every host's result (``bye``).
"""
from __future__ import annotations

import math
import threading
from typing import Any, Callable

import numpy as np

from spmdsim.primitives import _batch

from spmdsim.runtime import _runtime
from spmdsim.runtime._process_group import ProcessGroup
from spmdsim.runtime._rendezvous import World, ordinal
from spmdsim.runtime._reports import format_table
from spmdsim.errors import CollectiveDeadlockError, CollectiveMismatchError, HostLostError, RemoteError
from spmdsim.hosts.coordinator import CoordinatorCall
from spmdsim.hosts.messages import COORDINATOR, FIX, CallDesc, describe_call, how_it_ended, portable, steps_text
from spmdsim.hosts.remote_world import RemoteWorld
from spmdsim.hosts import wire
from spmdsim.hosts.vectorized import VectorCall

__all__ = ["Host"]


class Host(ProcessGroup):
    """One host of a multi-host run: ``index`` of ``count`` hosts, ``local`` devices, and its end of the
    ``transport`` to the others. Its host thread (spoofed) or main thread (MPI) makes the mapped calls. The process
    group (see :mod:`spmdsim.runtime._process_group`) that :mod:`spmdsim.hosts` installs: the runtime hands it the
    top-level mapped calls (:meth:`run`, :meth:`run_vectorized`)."""

    def __init__(self, index: int, count: int, local: int, transport):
        self.index, self.count, self.local = index, count, local
        self.transport = transport
        self.cond = threading.Condition()
        self.calls = 0
        self.call = None              # the global call in progress here: CoordinatorCall, RemoteWorld, VectorCall
        self.meeting: dict = {}       # coordinator: call -> {host: CallDesc}
        self.exited: dict = {}        # coordinator: host -> (calls made, how its program ended)
        self.failed: dict = {}        # coordinator: call -> the error its meeting ended with
        self.answers: dict = {}       # call -> None (go) or the error the meeting ended with
        self.outcomes: dict = {}      # call -> None or the error every host raises
        self.vector: dict = {}        # call -> messages of a vectorized call (see VectorCall)
        self.lost: dict = {}          # host -> what happened to it
        self.farewell = None          # every host's result, from the coordinator's "bye"
        self.main_thread: threading.Thread | None = None
        self.on_lost_main: Callable | None = None  # MPI: ends the main thread's program (spmdsim.hosts.mpi)
        self.waiting_main = 0         # > 0 while the main thread waits for another host (it sees a loss there)
        self.pending: BaseException | None = None  # a lost host's error, for the main thread's signal handler
        self.finished = False
        transport.start(self._deliver, self._lose)

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
        """Host ``host`` is gone (or sent a malformed message): every wait for it ends with a HostLostError naming
        it."""
        if reason.startswith("malformed message"):
            error = HostLostError(f"{reason}; every host stops (the hosts' messages are plain data of spmdsim's "
                                  f"wire format: something else wrote to their channel, or the hosts run different "
                                  f"versions of spmdsim).")
        else:
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
        if self.on_lost_main is not None:
            self.on_lost_main(error)

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
        desc = CallDesc("gather", (), how_it_ended(error), "")
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
            wire.travels(item)
        except TypeError as e:
            return "error", RemoteError(f"the program's result ({type(item).__name__}) cannot travel between hosts: "
                                        f"{e}")
        return result

    def _finished_error(self, k: int, desc: CallDesc, caller: int) -> CollectiveDeadlockError:
        calls, how = self.exited[COORDINATOR]
        rows = [("host 0", f"finished after {steps_text(calls)} ({how})", "", "")]
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
                rows.append((f"host {h}", f"finished after {steps_text(calls)} ({how})", "", ""))
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
        call = CoordinatorCall(self, k, World(self)) if self.index == COORDINATOR else RemoteWorld(self, k)
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

    def _coordinate(self, k: int, body: Callable, axes: tuple, call: "CoordinatorCall") -> list:
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
        outcome = portable(error)
        for h in range(1, self.count):
            self.send(h, ("outcome", k, outcome))
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
        this host's devices (a :class:`~spmdsim.primitives._batch.Batch` of the global mesh holding them), its
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
            result = fn(_batch.Batch(axes, np.arange(self.devices.start, self.devices.stop), comm=call))
        except BaseException as e:  # noqa: BLE001 - every host learns of it
            error = e
        finally:
            with self.cond:
                self.call = None
        return call.end(error, result)
