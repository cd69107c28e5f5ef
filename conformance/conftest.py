"""Conformance against real jax.pmap. JAX's devices are fixed before jax is first used: here, 8 CPU devices
(or, with SPMDSIM_CONFORMANCE_PLATFORM=gpu/tpu, the accelerators present)."""
import os
import signal

import pytest

PLATFORM = os.environ.get("SPMDSIM_CONFORMANCE_PLATFORM", "cpu")
if PLATFORM == "cpu":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

jax = pytest.importorskip("jax")
if PLATFORM == "cpu":
    jax.config.update("jax_num_cpu_devices", 8)

import spmdsim  # noqa: E402
from spmdsim.testing import pmap_matches_jax  # noqa: E402,F401  (the plugin's fixture, also in a source tree)


# A run started in the background (`pytest &` in a script, nohup) inherits SIGINT ignored, and the processes
# that the Ctrl-C tests interrupt would inherit that too (Python keeps an ignored SIGINT): give them SIGINT as
# from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def virtual_devices():
    with spmdsim.set_device_count(max(8, jax.device_count())):
        yield
