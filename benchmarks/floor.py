"""The floor of the thread design: ``python -m benchmarks.floor``.

One OS thread per device, as spmdsim's thread executors run them (pinned to one CPU as ``SCHED_BATCH``
threads, parked between calls, started by a baton in which each device wakes the next), one ``psum`` whose
last arriver folds the blocks and wakes the waiting devices one after another, and nothing else: no argument
checks, no lane states, no deadlock or mismatch detection, no reports, no error propagation. It prints the
time per call of that bare protocol next to ``spmdsim.pmap``'s default call of the same program, in one run:
what a call would cost if every spmdsim feature were free, and so how far the per-call targets of issue 15
are from what one thread per device allows. Not part of ``python -m benchmarks``: nothing to compare with JAX.
"""
from __future__ import annotations

import argparse
import os
import threading

import numpy as np

from benchmarks.timing import measure


def _pin() -> None:
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


class _Device:
    """A parked thread: ``go`` wakes it for a call, ``wake`` for the end of a psum."""

    def __init__(self):
        self.go, self.wake = threading.Lock(), threading.Lock()
        self.go.acquire()
        self.wake.acquire()
        self.call: _Call | None = None
        self.index = 0
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        _pin()
        while True:
            self.go.acquire()
            self.call.run(self.index)


class _Call:
    def __init__(self, devices: list[_Device], fn, blocks: list[np.ndarray]):
        self.devices, self.fn, self.blocks = devices, fn, blocks
        self.results: list = [None] * len(devices)
        self.lock, self.done = threading.Lock(), threading.Lock()
        self.done.acquire()
        self.remaining = len(devices)
        self.arrived: list[int] = []
        self.operands: dict = {}
        self.total = None
        self.successor: dict = {}

    def run(self, i: int) -> None:
        if i + 1 < len(self.devices):
            self.devices[i + 1].go.release()  # the start baton
        _local.call, _local.index = self, i
        self.results[i] = self.fn(self.blocks[i])
        with self.lock:
            self.remaining -= 1
            if self.remaining == 0:
                self.done.release()

    def psum(self, i: int, x: np.ndarray) -> np.ndarray:
        with self.lock:
            self.arrived.append(i)
            self.operands[i] = x
            last = len(self.arrived) == len(self.devices)
        if not last:
            self.devices[i].wake.acquire()
            successor = self.successor.get(i)
            if successor is not None:
                self.devices[successor].wake.release()
            return self.total
        total = self.operands[0]
        for k in range(1, len(self.devices)):
            total = np.add(total, self.operands[k])
        self.total = total
        waiting = [k for k in self.arrived if k != i]
        self.successor = dict(zip(waiting, waiting[1:]))
        if waiting:
            self.devices[waiting[0]].wake.release()
        return total


_local = threading.local()


def bare_psum(x: np.ndarray) -> np.ndarray:
    return _local.call.psum(_local.index, x)


def bare_pmap(devices: list[_Device], fn, x: np.ndarray) -> np.ndarray:
    call = _Call(devices, fn, list(x))
    for i, device in enumerate(devices):
        device.call, device.index = call, i
    devices[0].go.release()
    call.done.acquire()
    return np.array(call.results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    import spmdsim
    caller_affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    print("| devices | bare protocol, µs per call | spmdsim.pmap default call, µs | spmdsim / bare |")
    print("|---:|---:|---:|---:|")
    for n in (8, 64):
        x = np.arange(4 * n, dtype=np.float32).reshape(n, 4)
        devices = [_Device() for _ in range(n)]
        if caller_affinity is not None and len(caller_affinity) > 1:  # the caller on the devices' CPU for the
            os.sched_setaffinity(0, {min(caller_affinity)})           # whole loop (spmdsim: for each call)
        assert (bare_pmap(devices, bare_psum, x) == x.sum(0)).all()
        bare = measure(lambda: bare_pmap(devices, bare_psum, x), args.repeats)["median_s"]
        if caller_affinity is not None:
            os.sched_setaffinity(0, caller_affinity)
        with spmdsim.set_device_count(n):
            f = spmdsim.pmap(lambda v: spmdsim.lax.psum(v, "i"), axis_name="i")
            ours = measure(lambda: f(x), args.repeats)["median_s"]
        print(f"| {n} | {bare * 1e6:.0f} | {ours * 1e6:.0f} | {ours / bare:.1f} |")


if __name__ == "__main__":
    main()
