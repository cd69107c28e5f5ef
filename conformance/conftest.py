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
else:
    jax.devices()  # an accelerator's device count is the hardware's: start the backend now, as every check sees it

import spmdsim  # noqa: E402
from spmdsim.testing import TooFewJaxDevices  # noqa: E402
from spmdsim.testing import pmap_matches_jax  # noqa: E402,F401  (the plugin's fixture, also in a source tree)


# A run started in the background (`pytest &` in a script, nohup) inherits SIGINT ignored, and the processes
# that the Ctrl-C tests interrupt would inherit that too (Python keeps an ignored SIGINT): give them SIGINT as
# from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The files made for an accelerator: their checks skip themselves where jax has fewer devices than they map
# over, and compare with its arithmetic by size (test_lax_ops). The other files compare with XLA:CPU's numerics
# on 8 CPU devices throughout: skipped under --platform gpu/tpu.
ACCELERATOR_FILES = frozenset({"test_collectives.py", "test_jax_frontend.py", "test_lax_ops.py", "test_shard_map.py"})


def pytest_collection_modifyitems(config, items):
    if PLATFORM == "cpu":
        return
    skip = pytest.mark.skip(reason="compares with XLA:CPU on 8 CPU devices (run it without --platform)")
    for item in items:
        if item.path.parent.name == "conformance" and item.path.name not in ACCELERATOR_FILES:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Where jax has fewer devices than a check maps over (one GPU), the check is skipped, naming the count."""
    outcome = yield
    error = outcome.excinfo[1] if outcome.excinfo is not None else None
    if isinstance(error, TooFewJaxDevices) and PLATFORM != "cpu":
        outcome.force_exception(pytest.skip.Exception(str(error).split(". ")[0]))


@pytest.fixture(autouse=True)
def virtual_devices():
    with spmdsim.set_device_count(max(8, jax.device_count())):
        yield


# jax_enable_checks: JAX type-checks every jaxpr it makes (a spmdsim_map equation by its own rule: the body
# with the map's axes bound). On by default for the JAX front end's conformance files below (together they
# take 6-8% more CPU time with it); SPMDSIM_JAX_CHECKS=1 turns it on for every conformance test, =0 off for all.
_JAX_CHECKS = os.environ.get("SPMDSIM_JAX_CHECKS", "")
JAX_CHECKED_FILES = frozenset({"test_jax_frontend.py", "test_transformations.py", "test_shard_map.py"})


_CHECKED_BY_DEFAULT = frozenset() if _JAX_CHECKS else JAX_CHECKED_FILES


def pytest_report_header(config):
    if _JAX_CHECKS:
        return f"jax_enable_checks: {'off' if _JAX_CHECKS == '0' else 'on'} (SPMDSIM_JAX_CHECKS={_JAX_CHECKS})"
    return f"jax_enable_checks: on in {', '.join(sorted(_CHECKED_BY_DEFAULT))}"


@pytest.fixture(autouse=True)
def jax_checks(request):
    on = _JAX_CHECKS not in ("", "0") or request.path.name in _CHECKED_BY_DEFAULT
    if not on or jax.config.jax_enable_checks:
        yield
        return
    jax.config.update("jax_enable_checks", True)  # the global value: device threads trace too (nested maps)
    try:
        yield
    finally:
        jax.config.update("jax_enable_checks", False)
