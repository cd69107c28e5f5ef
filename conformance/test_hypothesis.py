"""Property-based conformance: hypothesis draws the collective, dtype, axis size, block shape and options;
every failure carries a runnable repro with the drawn values."""
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from conformance.cases import DTYPES, array
from conformance.harness import Case, run_case

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _repro(op, kwargs, x) -> str:
    return (f"import numpy as np, ml_dtypes\nfrom conformance.harness import Case, run_case\n"
            f"x = np.array({x.astype(np.float64).tolist() if x.dtype.kind not in 'bc' else x.tolist()!r})"
            f".astype({str(x.dtype)!r})\n"
            f"run_case(Case('repro', 'repro', lambda api: api.pmap(lambda v: getattr(api.lax, {op!r})(v, 'i', "
            f"**{kwargs!r}), axis_name='i'), (x,)))")


def check(op, kwargs, x):
    try:
        run_case(Case(f"hypothesis-{op}", op, lambda api: api.pmap(
            lambda v: getattr(api.lax, op)(v, "i", **kwargs), axis_name="i"), (x,)))
    except BaseException as e:
        e.add_note("Repro:\n" + _repro(op, kwargs, x))
        raise


@SETTINGS
@given(data=st.data())
def test_reductions(data):
    op = data.draw(st.sampled_from(["psum", "pmean", "pmax", "pmin"]), label="op")
    dtype = data.draw(st.sampled_from([d for d in DTYPES if d != "complex64" or op in ("psum", "pmean")]),
                      label="dtype")
    n = data.draw(st.integers(1, 8), label="axis size")
    shape = data.draw(st.lists(st.integers(1, 4), max_size=3).map(tuple), label="block shape")
    seed = data.draw(st.integers(0, 2 ** 16), label="seed")
    check(op, {}, array(dtype, (n, *shape), seed))


@SETTINGS
@given(data=st.data())
def test_all_gather(data):
    n = data.draw(st.integers(1, 8), label="axis size")
    shape = data.draw(st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple), label="block shape")
    tiled = data.draw(st.booleans(), label="tiled") and len(shape) > 0
    rank_out = len(shape) if tiled else len(shape) + 1
    axis = data.draw(st.integers(-rank_out, rank_out - 1), label="axis")
    dtype = data.draw(st.sampled_from(["int32", "float32", "bool"]), label="dtype")
    check("all_gather", {"axis": axis, "tiled": tiled}, array(dtype, (n, *shape), 3))


@SETTINGS
@given(data=st.data())
def test_psum_scatter(data):
    n = data.draw(st.integers(1, 8), label="axis size")
    rank = data.draw(st.integers(1, 3), label="rank")
    dim = data.draw(st.integers(0, rank - 1), label="scatter_dimension")  # non-negative: JAX 0.10 crashes otherwise
    tiled = data.draw(st.booleans(), label="tiled")
    shape = [data.draw(st.integers(1, 3), label=f"dim {d}") for d in range(rank)]
    shape[dim] = n * data.draw(st.integers(1, 2), label="chunks") if tiled else n
    check("psum_scatter", {"scatter_dimension": dim, "tiled": tiled}, array("float32", (n, *shape), 5))


@SETTINGS
@given(data=st.data())
def test_all_to_all(data):
    n = data.draw(st.integers(1, 8), label="axis size")
    rank = data.draw(st.integers(1, 3), label="rank")
    split = data.draw(st.integers(0, rank - 1), label="split_axis")
    concat = data.draw(st.integers(0, rank - 1), label="concat_axis")
    tiled = data.draw(st.booleans(), label="tiled")
    shape = [data.draw(st.integers(1, 3), label=f"dim {d}") for d in range(rank)]
    shape[split] = n * (data.draw(st.integers(1, 2), label="chunks") if tiled else 1)
    check("all_to_all", {"split_axis": split, "concat_axis": concat, "tiled": tiled}, array("int32", (n, *shape), 7))


@SETTINGS
@given(data=st.data())
def test_ppermute(data):
    n = data.draw(st.integers(1, 8), label="axis size")
    dst = data.draw(st.permutations(range(n)), label="destinations")
    keep = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="which sources send")
    perm = [(s, d) for s, d, k in zip(range(n), dst, keep) if k]
    check("ppermute", {"perm": perm}, array("float32", (n, 2), 11))
