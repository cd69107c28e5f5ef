"""A mapped call that tests/test_interrupt.py stops with SIGINT (run as a script, never imported by pytest).

``python _interrupt_program.py FRONT STALL SCOPE NESTED [AFTER]``

- FRONT: ``numpy`` (spmdsim.pmap) or ``jax`` (spmdsim.jax.pmap, the stall in a ``jax.debug.callback``).
- STALL: what device 3 does while the others wait in a psum: ``sleep`` (``time.sleep(30)``, in C), ``loop``
  (an endless Python loop), ``blocked`` (waits on a lock forever, in C).
- SCOPE: ``default`` (reused threads), ``reuse`` (inside ``spmdsim.reuse_threads()``) or ``fresh``
  (``spmdsim._threads.REUSE = False``: a new thread per device per call).
- NESTED: ``1`` runs the call inside an outer pmap of size 1 (device 3's label is ``device 3 [o=0, i=3]``).
- AFTER: ``after`` catches the KeyboardInterrupt and checks what happens next (see ``after_interrupt``);
  device 3 then sleeps 1.5 s only.

Device 3 waits until the 7 others wait in the psum, then writes ``stalling`` to fd 1 and stalls: the test
sends SIGINT when it reads that line. With AFTER only the first call stalls. When the KeyboardInterrupt reaches
the program it writes ``interrupted at <time.monotonic()>``.
"""
import contextlib
import json
import os
import sys
import threading
import time

import numpy as np

import spmdsim

FRONT, STALL, SCOPE, NESTED = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
AFTER = len(sys.argv) > 5 and sys.argv[5] == "after"
if SCOPE == "fresh":
    spmdsim._threads.REUSE = False


stalled = []


def stall(i) -> None:
    if int(i) != 3 or stalled:
        return
    stalled.append(i)
    world = spmdsim._runtime.current_lane().world
    while sum(lane.state == "waiting" for lane in world.lanes) < 7:
        time.sleep(0.001)
    os.write(1, b"stalling\n")
    if STALL == "sleep":
        time.sleep(1.5 if AFTER else 30)
        os.write(1, b"user code ran after the interrupt\n")
    elif STALL == "loop":
        while True:
            pass
    elif STALL == "blocked":
        threading.Event().wait()


if FRONT == "numpy":
    from spmdsim import lax

    def step(x):
        stall(lax.axis_index("i"))
        return lax.psum(x, "i") + threading.get_ident()

    pmap, dtype = spmdsim.pmap, np.float64
else:
    import jax

    import spmdsim.jax

    def step(x):
        jax.debug.callback(stall, jax.lax.axis_index("i"))
        return jax.lax.psum(x, "i")

    pmap, dtype = spmdsim.jax.pmap, np.float32

mapped = pmap(step, axis_name="i")
x = np.zeros(8, dtype)
if NESTED:
    inner = mapped
    mapped = pmap(lambda v: inner(v), axis_name="o")
    x = x[None]


def after_interrupt(interrupted: BaseException) -> dict:
    """After the Ctrl-C: later calls work on other threads than the abandoned one, which never runs user code
    again and ends when its sleep returns; then no parked thread remains after the idle time."""
    abandoned = [t.ident for t in threading.enumerate() if t.name.startswith("spmdsim device")]
    results = [mapped(np.ones(8, dtype)) for _ in range(5)]
    used = {int(v) for r in results for v in np.ravel(r) - 8} if FRONT == "numpy" else set()
    deadline = time.monotonic() + 10
    while any(t.ident in abandoned for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    deadline = time.monotonic() + 10
    while any(t.name.startswith("spmdsim") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"abandoned": len(abandoned), "reused_abandoned": bool(used & set(abandoned)),
            "abandoned_alive": [t.name for t in threading.enumerate() if t.ident in abandoned],
            "spmdsim_threads_left": [t.name for t in threading.enumerate() if t.name.startswith("spmdsim")],
            "notes": interrupted.__notes__}


with spmdsim.reuse_threads() if SCOPE == "reuse" else contextlib.nullcontext():
    try:
        mapped(x)
    except KeyboardInterrupt as e:
        os.write(1, f"interrupted at {time.monotonic()}\n".encode())  # one clock for every process on Linux
        if not AFTER:
            raise
        print(json.dumps(after_interrupt(e)), flush=True)
