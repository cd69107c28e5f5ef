"""A mapped call that tests/test_interrupt.py stops with SIGINT (run as a script, never imported by pytest).

``python _interrupt_program.py FRONT STALL SCOPE NESTED [AFTER]``

- FRONT: ``numpy`` (spmdsim.pmap) or ``jax`` (spmdsim.jax.pmap, the stall in a ``jax.debug.callback``).
- STALL: what device 3 does while the others wait in a psum: ``sleep`` (``time.sleep(30)``, in C), ``loop``
  (an endless Python loop), ``blocked`` (waits on an event, in C: forever, or with AFTER until the program
  sets it).
- SCOPE: ``default`` (reused threads), ``reuse`` (inside ``spmdsim.reuse_threads()``) or ``fresh``
  (``spmdsim.runtime._threads.REUSE = False``: a new thread per device per call).
- NESTED: ``1`` runs the call inside an outer pmap of size 1 (device 3's label is ``device 3 [o=0, i=3]``).
- AFTER: ``after`` catches the KeyboardInterrupt and checks what happens next (see ``after_interrupt``).

Device 3 waits until the 7 others wait in the psum, then writes ``stalling`` to fd 1 and stalls: the test
sends SIGINT when it reads that line. With AFTER only the first call stalls. When the KeyboardInterrupt reaches
the program it writes ``interrupted at <time.monotonic()>``; with ``loop`` it then waits (up to a minute) for
device 3's thread to end, stopped by the exception spmdsim raised in it, and writes ``device 3 stopped: <bool>``.
No outcome depends on how fast the machine is: device 3 is abandoned when it stalls in C (``sleep``, ``blocked``)
and stopped when it loops, whenever it gets the CPU; only the time until the KeyboardInterrupt is measured.
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
    spmdsim.runtime._threads.REUSE = False


stalled = []  # device 3's thread, once it stalled
seen = []     # the thread of every device of every call
unblock = threading.Event()


def stall(i) -> None:
    seen.append(threading.current_thread())
    if int(i) != 3 or stalled:
        return
    stalled.append(threading.current_thread())
    world = spmdsim.runtime._runtime.current_lane().world
    while sum(lane.state == "waiting" for lane in world.lanes) < 7:
        time.sleep(0.001)
    os.write(1, b"stalling\n")
    if STALL == "sleep":
        time.sleep(30)
    elif STALL == "loop":
        while True:
            pass
    elif STALL == "blocked":
        unblock.wait()
    os.write(1, b"user code ran after the interrupt\n")


if FRONT == "numpy":
    from spmdsim import lax

    def step(x):
        stall(lax.axis_index("i"))
        return lax.psum(x, "i")

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


def until(condition, seconds: float = 60.0) -> None:
    """Poll ``condition``; the deadline is only there to end instead of hanging (the test then fails)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def after_interrupt(interrupted: BaseException) -> dict:
    """After the Ctrl-C: later calls work on other threads than the abandoned one (device 3's, still blocked in
    C), which never runs user code again and ends when its wait returns; then no parked thread remains after the
    idle time. Threads are compared as objects (the OS reuses the id of a thread that ended)."""
    abandoned = [t for t in threading.enumerate() if t.name.startswith("spmdsim device")]
    seen.clear()
    results = [mapped(np.ones(8, dtype)) for _ in range(5)]
    ok = all(np.array_equal(np.asarray(r), np.full(8, 8.0)) for r in results)
    reused = [t.name for t in seen if t in abandoned]
    unblock.set()  # device 3's wait returns: the exception raised in it ends the thread before any user code
    until(lambda: not any(t.is_alive() for t in abandoned))
    until(lambda: not any(t.name.startswith("spmdsim") for t in threading.enumerate()))
    return {"abandoned": [t is stalled[0] for t in abandoned], "later_calls_ok": ok, "reused_abandoned": reused,
            "later_calls_threads": len(set(seen)),
            "abandoned_alive": [t.name for t in abandoned if t.is_alive()],
            "spmdsim_threads_left": [t.name for t in threading.enumerate() if t.name.startswith("spmdsim")],
            "notes": interrupted.__notes__}


with spmdsim.reuse_threads() if SCOPE == "reuse" else contextlib.nullcontext():
    try:
        mapped(x)
    except KeyboardInterrupt as e:
        os.write(1, f"interrupted at {time.monotonic()}\n".encode())  # one clock for every process on Linux
        if STALL == "loop":
            until(lambda: not stalled[0].is_alive())
            os.write(1, f"device 3 stopped: {not stalled[0].is_alive()}\n".encode())
        if not AFTER:
            raise
        print(json.dumps(after_interrupt(e)), flush=True)
