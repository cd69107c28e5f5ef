"""The pytest plugin loaded (``-p jax_suite_plugin``) into each run of JAX's own test files.

The harness copies this file into its work folder and configures it through the environment:

- ``SPMDSIM_JAX_SUITE_MODE``: ``jax`` (JAX as installed) or an spmdsim executor (``threads``,
  ``vectorized``): then :func:`spmdsim.jax.integration._patch.patched_jax` is entered in ``pytest_configure``, *before*
  the test modules are imported, so ``from jax import pmap, jit`` at a test module's top gets spmdsim's (as in
  ``spmdsim run``), and stays entered for the whole session.
- ``SPMDSIM_JAX_SUITE_KIND``: ``maps`` (the default: pmap_test/shard_map_test, spmdsim's maps as above, 8 CPU
  devices) or ``ops`` (JAX's op test files: every program JAX would run on XLA, i.e. every ``jit``/``pjit``
  execution and every eagerly applied primitive, which JAX runs as a jitted one-primitive program, is traced by
  JAX as usual and its jaxpr evaluated by spmdsim on one virtual device with the executor ``MODE`` names, see
  :func:`route_execution`; JAX's default device count) or ``injit`` (issue 39: only JAX's shard_map is spmdsim's;
  ``jax.jit`` and ``jax.pmap`` stay JAX's, so a map inside a jit reaches spmdsim through its lowering).
- ``SPMDSIM_JAX_SUITE_RECORDS``: a JSON-lines file this plugin appends to as the run goes (one line per
  collected test, per test start and per setup/call/teardown report), so a run that is killed (too slow, a
  hang) keeps what it had done and can be resumed.
- ``SPMDSIM_JAX_SUITE_DESELECT``: a file of node ids (one a line) not to run (done in an earlier attempt).
- ``SPMDSIM_JAX_SUITE_CONFIG``: JSON object, empty but for a diagnostic run (``--jax-config``): JAX options
  to set instead of JaxTestCase's defaults.
- ``SPMDSIM_JAX_SUITE_TEST_TIMEOUT``: seconds; a test running longer has every thread's stack written to
  ``SPMDSIM_JAX_SUITE_HANG`` and the process exits (:func:`faulthandler.dump_traceback_later`), which the
  harness records as a timeout and then runs the rest.

Nothing else is changed: JAX's test defaults (``jtu.JaxTestCase``'s ``jax_enable_checks=True`` etc., the
``filterwarnings = error`` of JAX's pyproject.toml) apply as in JAX's own runs.
"""
from __future__ import annotations

import faulthandler
import json
import os

import pytest

N_DEVICES = 8  # what the map test modules ask for (jtu.request_cpu_devices(8))
MODE = os.environ.get("SPMDSIM_JAX_SUITE_MODE", "jax")
KIND = os.environ.get("SPMDSIM_JAX_SUITE_KIND", "maps")
_RECORDS = os.environ.get("SPMDSIM_JAX_SUITE_RECORDS")
_DESELECT = os.environ.get("SPMDSIM_JAX_SUITE_DESELECT")
_TIMEOUT = float(os.environ.get("SPMDSIM_JAX_SUITE_TEST_TIMEOUT") or 0)
_HANG = os.environ.get("SPMDSIM_JAX_SUITE_HANG")
REPO = os.environ.get("SPMDSIM_JAX_SUITE_REPO", "/")  # spmdsim's checkout: its paths are shown from there

_patch = None
_records = None
_hang_file = None


def _write(**record) -> None:
    if _records is not None:
        _records.write(json.dumps(record) + "\n")
        _records.flush()


def pytest_configure(config):
    global _patch, _records, _hang_file
    if _RECORDS:
        _records = open(_RECORDS, "a", buffering=1)
    if _HANG and _TIMEOUT:
        _hang_file = open(_HANG, "w")
    import jax

    if KIND in ("maps", "injit"):
        jax.config.update("jax_num_cpu_devices", N_DEVICES)
    config = json.loads(os.environ.get("SPMDSIM_JAX_SUITE_CONFIG") or "{}")
    if config:  # a diagnostic run (--jax-config): JaxTestCase enters its defaults in every setUp
        from jax._src import test_util as jtu

        for name, value in config.items():
            if name in jtu.JaxTestCase._default_thread_local_config:
                jtu.JaxTestCase._default_thread_local_config[name] = value
            else:
                jax.config.update(name, value)
    if MODE != "jax" and KIND == "ops":
        _patch = route_execution(MODE)
        _patch.__enter__()
    elif MODE != "jax":
        from spmdsim.jax.integration._patch import patched_jax

        _patch = patched_jax(N_DEVICES, MODE, replace=("shard_map",) if KIND == "injit" else None)
        _patch.__enter__()


class route_execution:
    """For the block, every program that JAX would compile and run with XLA runs on spmdsim instead: JAX's
    ``_pjit_call_impl_python`` (where both ``jit(f)(...)`` at the top level and the ``jit`` primitive's impl
    compile and execute; JAX's eager primitive dispatch, ``dispatch.apply_primitive``, runs each primitive as a
    jitted one-primitive function and so ends there too) is replaced by spmdsim's evaluation of the closed jaxpr
    JAX traced, on one virtual device: ``threads`` with the per-device executor (the one each device thread of a
    map runs), ``vectorized`` with a one-device :class:`Vectorized` batch (the values carry a device axis of
    length 1). Returning no executable keeps JAX's C++ dispatch from caching one: every call comes back here.
    Results are handed back as JAX arrays of the jaxpr's avals (weak types, keys), placed on the sharding the
    ``jit`` names, else on the device of a committed argument, else JAX's default device; the transfers to and
    from NumPy are the simulator's, allowed whatever ``jax.transfer_guard`` the test sets. While spmdsim
    evaluates (a rule that calls JAX itself), JAX's own path is used."""

    def __init__(self, executor: str):
        import threading

        self.executor = executor
        self.local = threading.local()

    def evaluate(self, closed, args: list) -> list:
        from spmdsim.primitives import _batch
        from spmdsim.jax.evaluation import _dtypes, _interpreter

        consts = [self.physical(c) if _dtypes.is_extended(v.aval.dtype) and not _dtypes.is_key(v.aval.dtype) else c
                  for v, c in zip(closed.jaxpr.constvars, closed.consts, strict=True)]  # a closed-over FooArray
        if self.executor == "threads":
            return _interpreter.PER_DEVICE.eval_jaxpr(closed.jaxpr, consts, args)
        ex = _interpreter.Vectorized(_batch.Batch((("device", 1),)))
        outs = ex.eval_jaxpr(closed.jaxpr, consts, [a[None] for a in args])
        return [o[0] for o in outs]

    def call(self, *args, jaxpr, out_shardings, **params):
        import jax
        import numpy as np
        from jax._src import dispatch
        from jax._src.lax import lax as lax_internal
        from spmdsim.jax.evaluation import _dtypes
        from spmdsim.jax.integration import _map
        from spmdsim.jax.integration._map import to_jax, to_numpy

        if getattr(self.local, "inside", False):
            return self.original(*args, jaxpr=jaxpr, out_shardings=out_shardings, **params)
        self.local.inside = True
        try:
            with jax.transfer_guard("allow"):  # the simulator's own transfers, not the program's
                values = [to_numpy(a) if _dtypes.is_key(aval.dtype) else self.physical(a) if
                          _dtypes.is_extended(aval.dtype) else np.asarray(a, aval.dtype)
                          for a, aval in zip(args, jaxpr.in_avals, strict=True)]  # int64 kept if the jaxpr says so
                outs = self.evaluate(jaxpr, values)
                committed = [a.sharding for a in args if isinstance(a, jax.Array) and a._committed]
                results = []
                for o, aval, s in zip(outs, jaxpr.out_avals, out_shardings, strict=True):
                    if not isinstance(s, jax.sharding.Sharding):
                        s = self.placement(aval, committed)
                    else:
                        s = self.typed_as(s, aval)
                    o = np.asarray(o)
                    if any(np.may_share_memory(o, v) for v in values):  # a result is a new buffer, as XLA's
                        o = o.copy()
                    if _dtypes.is_extended(aval.dtype) and not _dtypes.is_key(aval.dtype):
                        out = self.logical(o, aval, s)
                    elif not _dtypes.is_key(aval.dtype) and o.dtype != jax.dtypes.canonicalize_dtype(o.dtype):
                        out = self.put_as_is(o, aval, s)  # an int64 with x64 off (jnp.array(1, dtype=int64))
                    else:
                        out = to_jax(o, aval, s)
                    if getattr(out, "weak_type", aval.weak_type) != aval.weak_type:  # to_jax's fallback path
                        out = lax_internal._convert_element_type(out, weak_type=aval.weak_type)
                    results.append(out)
                if dispatch.needs_check_special():  # jax_debug_nans/infs: as XLA's executable checks its results
                    for out in results:
                        dispatch.check_special_array(params["name"], out)
            return results, None, None, []
        finally:
            self.local.inside = False
            if _map._fast_put is None:  # to_jax gave up its fast put after a failure: its fallback (jnp.asarray)
                _map._fast_put = ...    # would dispatch a jitted conversion from inside this call: learn it again

    @staticmethod
    def physical(x):
        """A value of a user's extended dtype (lax_test's ``FooArray``) in physical form, as JAX hands it to XLA
        (the ``pxla.shard_arg_handlers`` entry of its type, on the default device)."""
        import jax
        import numpy as np
        from jax._src.interpreters import pxla

        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return np.asarray(pxla.shard_args([sharding], [None], [None], [x])[0])

    @staticmethod
    def logical(arr, aval, sharding):
        """A result of a user's extended dtype from its physical form, built by the dtype's own result handler
        (``dtype._rules.global_sharded_result_handler``), as JAX builds it from XLA's buffer."""
        import jax

        sharding = sharding if sharding is not None else jax.sharding.SingleDeviceSharding(jax.devices()[0])
        physical = jax.device_put(arr, sharding)
        handler = aval.dtype._rules.global_sharded_result_handler(aval, sharding, True)
        return handler([shard.data for shard in physical.addressable_shards])

    @staticmethod
    def put_as_is(arr, aval, sharding):
        """``arr`` as a JAX array of its own dtype, which JAX would canonicalise (x64 off)."""
        from spmdsim.jax.integration import _map

        return _map._fast_put_like()(arr, aval.weak_type, sharding)

    @staticmethod
    def typed_as(sharding, aval):
        """``sharding`` with the mesh axis types of ``aval``'s type, as JAX's result carries them (a jit's
        ``out_shardings`` may name the mesh with other axis types than the type the program gives its result)."""
        import jax
        from jax._src import mesh as mesh_lib

        typed = getattr(aval, "sharding", None)
        if not isinstance(sharding, jax.sharding.NamedSharding) or typed is None or typed.mesh.empty \
                or sharding.mesh.axis_types == typed.mesh.axis_types \
                or sharding.mesh.shape_tuple != typed.mesh.shape_tuple:
            return sharding
        mesh = mesh_lib.Mesh(sharding.mesh.devices, sharding.mesh.axis_names, axis_types=typed.mesh.axis_types)
        return jax.sharding.NamedSharding(mesh, sharding.spec, memory_kind=sharding.memory_kind)

    @staticmethod
    def placement(aval, committed: list):
        """Where JAX puts a result the ``jit`` names no sharding for: split as its type says under an explicit
        mesh (``out_sharding=P('x')``), else with the committed arguments, else (None) JAX's default place."""
        import jax
        from jax._src import mesh as mesh_lib

        typed = getattr(aval, "sharding", None)
        if typed is not None and not typed.mesh.empty:  # a type with a mesh: its devices, axis types and spec
            mesh = mesh_lib.get_concrete_mesh()
            if mesh is None or mesh.empty or mesh.shape_tuple != typed.mesh.shape_tuple:
                mesh = next((c.mesh for c in committed if isinstance(c, jax.sharding.NamedSharding) and
                             c.mesh.shape_tuple == typed.mesh.shape_tuple), None)
            if mesh is not None:
                mesh = mesh_lib.Mesh(mesh.devices, mesh.axis_names, axis_types=typed.mesh.axis_types)
                return jax.sharding.NamedSharding(mesh, typed.spec)
        return committed[0] if committed else None

    def __enter__(self):
        from jax._src import pjit

        self.original = pjit._pjit_call_impl_python
        pjit._pjit_call_impl_python = self.call
        return self

    def __exit__(self, *exc):
        from jax._src import pjit

        pjit._pjit_call_impl_python = self.original


def pytest_unconfigure(config):
    global _patch
    if _patch is not None:
        _patch.__exit__(None, None, None)
        _patch = None
    if _records is not None:
        _records.flush()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    if not (_DESELECT and os.path.exists(_DESELECT)):
        return
    with open(_DESELECT) as f:
        skip = {line.strip() for line in f if line.strip()}
    dropped = [item for item in items if item.nodeid in skip]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.nodeid not in skip]


def pytest_collection_finish(session):
    for item in session.items:  # what will run, after -k and the deselection above
        _write(event="collect", nodeid=item.nodeid)


def pytest_runtest_logstart(nodeid, location):
    _write(event="start", nodeid=nodeid)
    if _hang_file is not None:
        _hang_file.seek(0)
        _hang_file.truncate()
        _hang_file.write(f"TIMEOUT {nodeid}\n")
        _hang_file.flush()
        faulthandler.dump_traceback_later(_TIMEOUT, exit=True, file=_hang_file)


def pytest_runtest_logfinish(nodeid, location):
    if _hang_file is not None:
        faulthandler.cancel_dump_traceback_later()
    _write(event="finish", nodeid=nodeid)


def _first_lines(text: str, n: int = 4) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()][:n]


_ASSERTION_HELPERS = ("/unittest/", "/numpy/testing/", "/jax/_src/test_util.py", "/absl/testing/")


def _where(excinfo) -> dict:
    """Where the error was raised: the innermost frame, the innermost frame in spmdsim and the innermost in the
    test file, each as 'path:line in function' (paths from the package or test folder down)."""
    where = {"frame": None, "spmdsim_frame": None, "test_frame": None}
    for entry in excinfo.traceback:
        path = str(entry.path)
        short = path
        for marker in ("/site-packages/", "/lib/python3", "/tests/", REPO + "/"):
            if marker in path:
                short = path[path.rindex(marker) + 1:] if marker in ("/lib/python3", "/tests/") else \
                    path[path.rindex(marker) + len(marker):]
                break
        loc = f"{short}:{entry.lineno + 1} in {entry.name}"
        if not any(helper in path for helper in _ASSERTION_HELPERS):
            where["frame"] = loc  # an assertEqual's own frames say nothing: the test's line then
        if "/spmdsim/" in path:
            where["spmdsim_frame"] = loc
        elif path.endswith("_test.py"):
            where["test_frame"] = f"{os.path.basename(path)}:{entry.lineno + 1} in {entry.name}"
    return where


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    record = dict(event="report", nodeid=item.nodeid, when=rep.when, outcome=rep.outcome,
                  duration=round(rep.duration, 3))
    if hasattr(rep, "wasxfail"):
        record["xfail"] = True
    if rep.skipped and isinstance(rep.longrepr, tuple):
        record["message"] = [str(rep.longrepr[2])]
    elif rep.failed and call.excinfo is not None:
        try:
            record["message"] = _first_lines(call.excinfo.exconly())
            record.update(_where(call.excinfo))
        except Exception as e:  # noqa: BLE001 - a record must still be written
            record["message"] = [f"(harness could not format the error: {e!r})"]
    elif rep.failed:
        record["message"] = _first_lines(str(rep.longrepr))
    _write(**record)
