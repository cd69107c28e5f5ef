import signal
import threading

import pytest

import spmdsim
from spmdsim.runtime import _threads


# A run started in the background (`pytest &` in a script, nohup) inherits SIGINT ignored, and the processes
# that the Ctrl-C tests interrupt would inherit that too (Python keeps an ignored SIGINT): give them SIGINT as
# from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def eight_devices():
    """Every test starts with 8 virtual devices. Afterwards every spmdsim thread must be parked (running no user
    code, holding no call); they are stopped so that the next test starts with none (and before it: a test
    file run after another directory's, or after a vectorized kernel's helpers, finds parked threads)."""
    _threads.stop_idle_threads()
    with spmdsim.set_device_count(8):
        yield
    busy = [t.name for t in threading.enumerate() if t.name.startswith("spmdsim") and t.name != "spmdsim idle thread"]
    assert not busy, f"device threads still busy after the call: {busy}"
    parked = [t for t in threading.enumerate() if t.name == "spmdsim idle thread"]
    assert len(parked) == _threads.idle_thread_count(), "a thread named idle is not in the pool's idle list"
    _threads.stop_idle_threads()
