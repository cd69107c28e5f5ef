"""Bad arguments and unbound axis names raise JAX's exception class, with spmdsim's messages (issue 25, points 8
and 5).

Point 8: a table of bad arguments to ``pmap``, one or more per kind, each run against ``jax.pmap`` and against
``spmdsim.pmap`` (the NumPy front end) and ``spmdsim.jax.pmap`` with ``executor="threads"`` and
``"vectorized"``. Each front end's error must be an instance of the class JAX raised (spmdsim's class is a
subclass of it: ``NotAnArrayError`` is a TypeError and a ValueError, NumPy's ``AxisError`` a ValueError and an
IndexError, ``spmdsim.jax.pmap``'s ``MappedSizeError`` JAX's ``IndivisibleError``), or the case is one of
``DIFFERENCES``, each listed in the README's table of differences.

Point 5: a collective over a misspelled axis name inside a body that JAX traces (``spmdsim.jax.pmap``,
``spmdsim.jax.shard_map`` with ``check_vma`` True and False, both executors) raises ``UnboundAxisError`` (a
NameError and an AssertionError: whichever of the two JAX raises), with "did you mean" and the line of the call.
"""
from __future__ import annotations

import dataclasses
import re
import traceback
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import spmdsim
import spmdsim.jax as sjax
from spmdsim.errors import AxisNameError, MappedSizeError, NotAnArrayError, UnboundAxisError

N = max(8, jax.device_count())  # the devices JAX has and spmdsim's virtual ones (conftest.py)
X = np.arange(N, dtype=np.float32)
X2 = np.ones((N, 2), np.float32)


def ident(x):
    return x


def first(a, b):
    return a


def first_kw(a, k):
    return a


@dataclasses.dataclass(frozen=True)
class Bad:
    """``pmap(fun, **options)(*args, **kwargs)`` with one bad argument (made and called in one step: JAX checks some
    options when called, spmdsim when the map is made)."""

    id: str
    kind: str
    fun: Callable
    options: dict
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)

    def run(self, pmap):
        return pmap(self.fun, **self.options)(*self.args, **self.kwargs)


BAD = [
    # A value that is not an array: jax.pmap's ValueError ("requires at least one argument with a mapped
    # axis") when no mapped argument is an array, its TypeError ("not a valid JAX type") when one is.
    Bad("str", "not an array", ident, {}, ("abc",)),
    Bad("bytes", "not an array", ident, {}, (b"abc",)),
    Bad("set", "not an array", ident, {}, ({1, 2},)),
    Bad("object", "not an array", ident, {}, (object(),)),
    Bad("str-after-array", "not an array", first, {}, (X, "abc")),
    Bad("str-before-array", "not an array", first, {}, ("abc", X)),
    Bad("bytes-after-array", "not an array", first, {}, (X, b"abc")),
    Bad("set-after-array", "not an array", first, {}, (X, {1})),
    Bad("object-after-array", "not an array", first, {}, (X, object())),
    Bad("str-broadcast", "not an array", first, dict(in_axes=(0, None)), (X, "abc")),
    Bad("object-broadcast", "not an array", first, dict(in_axes=(0, None)), (X, object())),
    Bad("str-keyword", "not an array", first_kw, {}, (X,), dict(k="abc")),
    Bad("str-in-a-dict", "not an array", ident, {}, ({"a": X, "b": "abc"},)),
    Bad("string-array", "not an array", first, {}, (X, np.array(["a"] * N))),
    Bad("object-array", "not an array", first, {}, (X, np.array([object()] * N))),
    # None, an empty container or only Python scalars where an array must be mapped.
    Bad("none-argument", "no mapped argument", ident, {}, (None,)),
    Bad("empty-dict", "no mapped argument", ident, {}, ({},)),
    Bad("list-of-floats", "no mapped argument", ident, {}, ([1.0, 2.0],)),
    Bad("python-float", "no mapped argument", ident, {}, (1.0,)),
    Bad("in_axes-none", "no mapped argument", ident, dict(in_axes=None), (X,)),
    Bad("in_axes-none-axis_size", "no mapped argument", ident, dict(in_axes=None, axis_size=N), (X,)),
    # in_axes out of range: JAX's IndexError ("tuple index out of range"), a sharding ValueError for an
    # argument after the first mapped one.
    Bad("in_axes-1-rank-1", "in_axes out of range", ident, dict(in_axes=1), (X,)),
    Bad("in_axes-5-rank-2", "in_axes out of range", ident, dict(in_axes=5), (X2,)),
    Bad("in_axes-minus-3-rank-2", "negative in_axes out of range", ident, dict(in_axes=-3), (X2,)),
    Bad("in_axes-minus-2-rank-1", "negative in_axes out of range", ident, dict(in_axes=-2), (X,)),
    Bad("in_axes-out-of-range-second", "in_axes out of range", first, dict(in_axes=(0, 1)), (X, X)),
    Bad("in_axes-out-of-range-in-a-tuple", "in_axes out of range", first, dict(in_axes=((1, 0), 0)), ((X, X2), X)),
    Bad("numpy-scalar-mapped", "in_axes out of range", ident, {}, (np.float32(1),)),
    Bad("numpy-scalar-mapped-second", "in_axes out of range", first, {}, (X, np.float32(1))),
    Bad("python-float-mapped-second", "in_axes out of range", first, {}, (X, 1.0)),
    # Mapped sizes: JAX's IndivisibleError when they do not divide, a squeeze ValueError when they do.
    Bad("sizes-2-3", "mismatched sizes", first, {}, (X[:2], X[:3])),
    Bad("sizes-4-8", "mismatched sizes", first, {}, (X[:4], X[:8])),
    Bad("sizes-keyword", "mismatched sizes", first_kw, {}, (X[:4],), dict(k=X[:2])),
    Bad("sizes-on-axis-1", "mismatched sizes", first, dict(in_axes=(0, 1)), (X[:2], np.ones((3, 3), np.float32))),
    Bad("too-large-2n", "too large N", ident, {}, (np.ones(2 * N, np.float32),)),
    Bad("too-large-n-plus-1", "too large N", ident, {}, (np.ones(N + 1, np.float32),)),
    Bad("size-0", "too large N", ident, {}, (np.ones(0, np.float32),)),
    Bad("axis_size-mismatch", "mismatched sizes", ident, dict(axis_size=3), (X,)),
    # in_axes / out_axes that are not ints, None or a tree prefix.
    Bad("in_axes-float", "non-int in_axes", ident, dict(in_axes=0.0), (X,)),
    Bad("in_axes-str", "non-int in_axes", ident, dict(in_axes="0"), (X,)),
    Bad("in_axes-numpy-int", "non-int in_axes", ident, dict(in_axes=np.int64(0)), (X,)),
    Bad("in_axes-bool", "non-int in_axes", ident, dict(in_axes=False), (X,)),
    Bad("out_axes-float", "non-int out_axes", ident, dict(out_axes=0.0), (X,)),
    Bad("in_axes-not-a-prefix", "in_axes structure", first, dict(in_axes=(0,)), (X, X)),
    Bad("in_axes-list", "in_axes structure", first, dict(in_axes=[0, 0]), (X, X)),
    Bad("in_axes-too-deep", "in_axes structure", first, dict(in_axes=((0, 0, 0), 0)), ((X, X), X)),
    Bad("out_axes-out-of-range", "out_axes out of range", ident, dict(out_axes=5), (X,)),
    Bad("out_axes-not-a-prefix", "out_axes structure", lambda x: (x, x), dict(out_axes=(0, 0, 0)), (X,)),
    # static_broadcasted_argnums.
    Bad("static-out-of-range", "static argnums out of range", first, dict(static_broadcasted_argnums=(5,)), (X, 1)),
    Bad("static-negative-out-of-range", "static argnums out of range", first,
        dict(static_broadcasted_argnums=(-5,)), (X, 1)),
    Bad("static-float", "non-int static argnums", first, dict(static_broadcasted_argnums=(1.0,)), (X, 1)),
    Bad("static-str", "non-int static argnums", first, dict(static_broadcasted_argnums="a"), (X, 1)),
    Bad("static-unhashable", "unhashable static argument", first, dict(static_broadcasted_argnums=(1,)), (X, [1])),
    Bad("static-by-keyword", "static argument by keyword", first_kw, dict(static_broadcasted_argnums=(1,)), (X,),
        dict(k=1)),
    # axis_name, devices.
    Bad("axis_name-int", "axis_name", ident, dict(axis_name=1), (X,)),
    Bad("axis_name-tuple", "axis_name", ident, dict(axis_name=("a", "b")), (X,)),
    Bad("axis_name-list", "axis_name", ident, dict(axis_name=["a"]), (X,)),
    Bad("devices-empty", "devices", ident, dict(devices=[]), (X,)),
    # Outputs that are not arrays.
    Bad("output-str", "output not an array", lambda x: "s", {}, (X,)),
    Bad("output-object", "output not an array", lambda x: object(), {}, (X,)),
]

# Where a front end raises another class than JAX, by design; each is a row of the README's table of
# differences. (case id, front end) -> (the class raised, the reason).
DIFFERENCES: dict[tuple[str, str], tuple[type, str]] = {
    **{(case, "numpy"): (MappedSizeError, "the NumPy front end does not import jax, so its MappedSizeError (a "
                                          "ValueError) cannot be JAX's IndivisibleError")
       for case in ("sizes-2-3", "sizes-keyword", "sizes-on-axis-1", "too-large-n-plus-1")},
}

FRONT_ENDS: dict[str, Callable] = {
    "numpy": spmdsim.pmap,
    "threads": lambda f, **o: sjax.pmap(f, executor="threads", **o),
    "vectorized": lambda f, **o: sjax.pmap(f, executor="vectorized", **o),
}


def _error(run: Callable[[], Any]) -> BaseException | None:
    try:
        run()
    except Exception as e:  # noqa: BLE001 - compared by the caller
        return e
    return None


def test_every_kind_of_bad_argument_is_in_the_table():
    kinds = {b.kind for b in BAD}
    assert {"not an array", "no mapped argument", "in_axes out of range", "negative in_axes out of range",
            "mismatched sizes", "too large N", "non-int in_axes", "static argnums out of range"} <= kinds
    assert len({b.id for b in BAD}) == len(BAD)


@pytest.mark.parametrize("front_end", list(FRONT_ENDS))
@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_bad_argument_raises_jax_class(bad: Bad, front_end: str):
    jax_error = _error(lambda: bad.run(jax.pmap))
    assert jax_error is not None, f"jax.pmap accepts {bad.id}: not a bad argument"
    error = _error(lambda: bad.run(FRONT_ENDS[front_end]))
    assert error is not None, f"jax.pmap raised {type(jax_error).__name__}: {jax_error}\nbut {front_end} returned"
    difference = DIFFERENCES.get((bad.id, front_end))
    if difference is not None:
        cls, reason = difference
        assert not isinstance(error, type(jax_error)), f"listed difference no longer needed: {reason}"
        assert isinstance(error, cls), (type(error), error)
        return
    assert isinstance(error, type(jax_error)), (
        f"jax.pmap raised {type(jax_error).__module__}.{type(jax_error).__qualname__}: {str(jax_error)[:300]}\n"
        f"but the {front_end} front end raised {type(error).__module__}.{type(error).__qualname__}: {error}")


# -- spmdsim's messages with JAX's classes ---------------------------------------------------------------

@pytest.mark.parametrize("front_end", list(FRONT_ENDS))
def test_classes_are_what_they_were_and_what_jax_raises(front_end):
    pmap = FRONT_ENDS[front_end]
    with pytest.raises(NotAnArrayError, match=r"argument args\[0\] of type str is not an array") as info:
        pmap(ident)("abc")
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    with pytest.raises(np.exceptions.AxisError, match=r"in_axes=1 is out of bounds for args\[0\] of shape") as info:
        pmap(ident, in_axes=1)(X)
    assert isinstance(info.value, ValueError) and isinstance(info.value, IndexError)
    with pytest.raises(MappedSizeError, match=r"args\[1\] has size 3 on axis 0") as info:
        pmap(first)(X[:2], X[:3])
    assert isinstance(info.value, ValueError)
    with pytest.raises(MappedSizeError, match=r"virtual devices are available"):
        pmap(ident)(np.ones(N + 1, np.float32))
    with pytest.raises(AxisNameError, match="axis_name must be a hashable name"):
        pmap(ident, axis_name=("a", "b"))


def test_the_jax_front_ends_size_error_is_jaxs_indivisible_error():
    from jax._src.sharding import IndivisibleError
    for args in ((X[:2], X[:3]), (X[:4], X[:8])):
        for executor in ("threads", "vectorized"):
            with pytest.raises(IndivisibleError, match="inconsistent sizes for the mapped axis") as info:
                sjax.pmap(first, executor=executor)(*args)
            assert isinstance(info.value, MappedSizeError)
    with pytest.raises(IndivisibleError, match="reshape the input"):
        sjax.pmap(ident)(np.ones(2 * N, np.float32))
    f = sjax.pmap(ident)
    f(X)  # a call seen before takes the fast path, which checks the device count again
    with spmdsim.set_device_count(2), pytest.raises(IndivisibleError, match="only 2 virtual devices"):
        f(X)


# -- point 5: unbound axis names in JAX programs ---------------------------------------------------------

def _pmean(g):
    return lax.pmean(g, "bacth")


def _psum(g):
    return lax.psum(g, "bacth")


def _pmax(g):
    return lax.pmax(g, "bacth")


def _pmin(g):
    return lax.pmin(g, "bacth")


def _ppermute(g):
    return lax.ppermute(g, "bacth", [(0, 1)])


def _all_gather(g):
    return lax.all_gather(g, "bacth").sum(0)


def _axis_index(g):
    return g + lax.axis_index("bacth")


def _psum_two_names(g):
    return lax.psum(g, ("batch", "bacth"))


BODIES = [_pmean, _psum, _pmax, _pmin, _ppermute, _all_gather, _axis_index, _psum_two_names]
MESH = jax.sharding.Mesh(np.array(jax.devices()[:N]), ("batch",))
XS = np.arange(N * 4, dtype=np.float32).reshape(N, 4)


def _line(fun) -> str:
    """``test_bad_arguments.py:<line>``: where ``fun`` calls the collective (its last line)."""
    code = fun.__code__
    last = max(line for _, _, line in code.co_lines() if line is not None)
    return f"test_bad_arguments.py:{last}"


MAPS: dict[str, Callable] = {
    "pmap": lambda body, executor: sjax.pmap(body, axis_name="batch", executor=executor),
    "shard_map-check_vma": lambda body, executor: sjax.shard_map(body, mesh=MESH, in_specs=P("batch"),
                                                                 out_specs=P("batch"), executor=executor),
    "shard_map-no-check_vma": lambda body, executor: sjax.shard_map(body, mesh=MESH, in_specs=P("batch"),
                                                                    out_specs=P("batch"), check_vma=False,
                                                                    executor=executor),
}
JAX_MAPS: dict[str, Callable] = {
    "pmap": lambda body: jax.pmap(body, axis_name="batch"),
    "shard_map-check_vma": lambda body: jax.shard_map(body, mesh=MESH, in_specs=P("batch"), out_specs=P("batch")),
    "shard_map-no-check_vma": lambda body: jax.shard_map(body, mesh=MESH, in_specs=P("batch"), out_specs=P("batch"),
                                                         check_vma=False),
}


@pytest.mark.parametrize("executor", ["threads", "vectorized"])
@pytest.mark.parametrize("kind", list(MAPS))
@pytest.mark.parametrize("body", BODIES, ids=[b.__name__.lstrip("_") for b in BODIES])
def test_misspelled_axis_in_a_jax_program_says_did_you_mean_and_the_line(body, kind, executor):
    jax_error = _error(lambda: JAX_MAPS[kind](body)(XS))
    if body is _psum_two_names and kind == "shard_map-check_vma":
        # JAX's varying-axes check comes first here: its ValueError ("psum can only accept axis_name which
        # corresponds to one of varying ... axes: ('batch', 'bacth')"), which spmdsim leaves as it is.
        assert type(jax_error) is ValueError and "'bacth'" in str(jax_error), jax_error
        with pytest.raises(ValueError, match="'bacth'") as info:
            MAPS[kind](body, executor)(XS)
        assert type(info.value) is ValueError
        return
    assert isinstance(jax_error, (NameError, AssertionError)), jax_error
    with pytest.raises(UnboundAxisError) as info:
        MAPS[kind](body, executor)(XS)
    error = info.value
    assert isinstance(error, type(jax_error))  # JAX's class: NameError, or AssertionError under check_vma
    text = str(error)
    assert "Found an unbound axis name: bacth. Did you mean 'batch'?" in text, text
    assert _line(body) in text and "bacth" in text.split(_line(body))[1], text
    frames = traceback.extract_tb(error.__traceback__)
    assert any(f.name == body.__name__ for f in frames), frames  # the user's frame is in the traceback


def test_unbound_axis_error_names_the_collective_the_bound_axes_and_a_partial_manual_mesh_axis():
    with pytest.raises(UnboundAxisError, match=r"psum was called at .* with axis_name='j', but the axis names "
                                               r"bound here are: 'batch'"):
        sjax.pmap(lambda x: lax.psum(x, "j"), axis_name="batch")(X)
    with pytest.raises(UnboundAxisError, match=r"bound here are: none \(the enclosing map has no axis_name\)"):
        sjax.pmap(lambda x: lax.psum(x, "batch"))(X)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:N]).reshape(N // 2, 2), ("batch", "model"))
    with pytest.raises(UnboundAxisError, match=r"'model' is an axis of the mesh, but not a manual axis of this "
                                               r"shard_map \(manual: 'batch'\)"):
        sjax.shard_map(lambda x: lax.psum(x, "model"), mesh=mesh, in_specs=P("batch"), out_specs=P("batch"),
                       axis_names={"batch"})(X)


def test_unbound_axis_in_nested_maps_and_under_transformations():
    inner = sjax.pmap(lambda b: lax.psum(b, "ii"), axis_name="j")
    with pytest.raises(UnboundAxisError, match=r"Did you mean 'i'\?.* bound here are: 'i', 'j'"):
        sjax.pmap(inner, axis_name="i")(np.ones((2, 4), np.float32))
    f = sjax.pmap(lambda g: lax.psum(g, "ii"), axis_name="i")
    with pytest.raises(UnboundAxisError, match=r"Did you mean 'i'\?"):
        jax.jit(f)(X)
    with pytest.raises(UnboundAxisError, match=r"Did you mean 'i'\?"):
        jax.grad(lambda x: f(x).sum())(X)
    # A name bound by a vmap inside the body is not reported; the misspelled one is.
    g = sjax.pmap(lambda g: jax.vmap(lambda y: lax.psum(y, ("v", "ii")), axis_name="v")(jnp.ones(2) * g),
                  axis_name="i")
    with pytest.raises(UnboundAxisError, match=r"unbound axis name: ii\. Did you mean 'i'\?"):
        g(X)


def test_the_users_own_name_and_assertion_errors_are_left_alone():
    def undefined(g):
        return g + not_defined_anywhere  # noqa: F821

    def asserts(g):
        assert g.shape == (99,)
        return g

    for fun, cls in ((undefined, NameError), (asserts, AssertionError)):
        for make in (lambda f: sjax.pmap(f, axis_name="batch"),
                     lambda f: sjax.shard_map(f, mesh=MESH, in_specs=P("batch"), out_specs=P("batch"))):
            with pytest.raises(cls) as info:
                make(fun)(X)
            assert not isinstance(info.value, UnboundAxisError)


# -- bad arguments to collectives (issue 39, point 3) ----------------------------------------------------

# (id, the body given the lax module: jax.lax under jax.pmap and spmdsim.jax.pmap, spmdsim.lax under spmdsim.pmap,
# the message spmdsim gives). Each front end raises an instance of the class jax.pmap raised.
_ALL = list(range(N))
BAD_COLLECTIVES = [
    ("ppermute-triple", lambda lx, v: lx.ppermute(v, "i", perm=[(0, 1, 2)]), r"got \(0, 1, 2\) \(3 values\)"),
    ("ppermute-single", lambda lx, v: lx.ppermute(v, "i", perm=[(0,)]), r"got \(0,\) \(1 value\)"),
    ("ppermute-float", lambda lx, v: lx.ppermute(v, "i", perm=[(0.0, 1)]), "int pairs"),
    ("psum-empty-group", lambda lx, v: lx.psum(v, "i", axis_index_groups=[_ALL, []]), "in non-empty groups"),
    ("pmax-empty-group", lambda lx, v: lx.pmax(v, "i", axis_index_groups=[_ALL[:N // 2], _ALL[N // 2:], []]),
     "in non-empty groups"),
    ("all_gather-empty-group", lambda lx, v: lx.all_gather(v, "i", axis_index_groups=[_ALL, []]),
     "in non-empty groups"),
]


@pytest.mark.parametrize("front_end", list(FRONT_ENDS))
@pytest.mark.parametrize("case", BAD_COLLECTIVES, ids=[c[0] for c in BAD_COLLECTIVES])
def test_bad_collective_argument_raises_jax_class(case, front_end):
    _, body, message = case
    jax_error = _error(lambda: jax.pmap(lambda v: body(lax, v), "i")(X))
    assert jax_error is not None, "jax.pmap accepts it: not a bad argument"
    lx = spmdsim.lax if front_end == "numpy" else lax
    error = _error(lambda: FRONT_ENDS[front_end](lambda v: body(lx, v), axis_name="i")(X))
    assert isinstance(error, type(jax_error)), (
        f"jax.pmap raised {type(jax_error).__module__}.{type(jax_error).__qualname__}: {str(jax_error)[:300]}\n"
        f"but the {front_end} front end raised {type(error).__module__}.{type(error).__qualname__}: {error}")
    assert re.search(message, str(error)), str(error)


def test_an_empty_group_is_both_classes_jax_raises():
    """The NumPy front end never imports JAX: its error for an empty group is both classes JAX raises (the
    ValueError of all_gather's lowering, the RuntimeError, JaxRuntimeError, of psum's HLO verifier)."""
    from spmdsim.primitives._primitives import EmptyGroupError
    with pytest.raises(EmptyGroupError, match=r"psum: axis_index_groups must cover all indices exactly once \(in "
                                              r"non-empty groups\)") as info:
        spmdsim.pmap(lambda v: spmdsim.lax.psum(v, "i", axis_index_groups=[_ALL, []]), axis_name="i")(X)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    assert isinstance(info.value, jax.errors.JaxRuntimeError)  # JAX is imported here
