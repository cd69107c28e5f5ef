"""The JAX transformation rules of :data:`spmdsim.jax.integration._map.spmdsim_map_p` (see :mod:`._map`): JVP,
partial evaluation (``linearize``/``vjp``, and remat's policy-driven form), transpose, batching (``vmap`` outside
the map), type checking (``jax_enable_checks``) and printing (``make_jaxpr``), each rewriting the map's *body*
jaxpr the way JAX's own shard_map rules do. Registered with JAX when this module is imported."""
from __future__ import annotations

import math

import jax
from spmdsim.jax._internals import core, source_info_util
from spmdsim.jax._internals import pp
from spmdsim.jax._internals import weakref_lru_cache
from spmdsim.jax._internals import ad, batching
from spmdsim.jax._internals import pe

from spmdsim.runtime import _runtime
from spmdsim.primitives import _sharding
from spmdsim.jax.evaluation import _unreduced
from spmdsim.jax.integration._placement import PMAP_AXIS, local_mesh
from spmdsim.jax.integration._map import _axis_env, _trace, global_avals, spmdsim_map_p


def _stacked_spec(axes, ndim: int, spmd: tuple = ()) -> tuple:
    """The spec of a per-device value carried out of a map: a new leading axis split over every mesh axis, less
    those of an enclosing ``vmap(..., spmd_axis_name=...)`` (which splits the batch axis it adds: JAX's
    ``_all_mesh_names_except_spmd``)."""
    return (tuple(name for name, _ in axes if name not in spmd),) + ((),) * ndim


def _spmd_names() -> tuple:
    """The mesh axes that enclosing ``vmap(..., spmd_axis_name=...)``s split their batch axes over."""
    return tuple(getattr(core.get_axis_env(), "spmd_axis_names", ()) or ())


# -- JVP ---------------------------------------------------------------------------------------------------

def _jvp(primals, tangents, *, jaxpr, in_specs, out_specs, axes, **params):
    nonzeros = [type(t) is not ad.Zero for t in tangents]
    with _axis_env(axes, params.get("mesh"), params["check_vma"]):
        jvp_jaxpr, out_nonzeros = ad.jvp_jaxpr(jaxpr, nonzeros, instantiate=False)
    nz_tangents = [t for t, nz in zip(tangents, nonzeros, strict=True) if nz]
    n_out = len(out_specs)
    outs = spmdsim_map_p.bind(
        *primals, *nz_tangents, jaxpr=jvp_jaxpr, axes=axes,
        in_specs=(*in_specs, *(s for s, nz in zip(in_specs, nonzeros, strict=True) if nz)),
        out_specs=(*out_specs, *(s for s, nz in zip(out_specs, out_nonzeros, strict=True) if nz)), **params)
    primals_out, nz_tangents_out = outs[:n_out], iter(outs[n_out:])
    tangents_out = [next(nz_tangents_out) if nz else ad.Zero(core.typeof(p).to_tangent_aval())
                    for p, nz in zip(primals_out, out_nonzeros, strict=True)]
    return primals_out, tangents_out


ad.primitive_jvps[spmdsim_map_p] = _jvp


# -- partial evaluation ------------------------------------------------------------------------------------

def _with_stacked_residuals(known: core.ClosedJaxpr, n_res: int, axes, mesh=None, check_vma=False):
    """``known`` with each of its last ``n_res`` outputs (residuals) given a leading unit axis, so that they
    leave the map stacked per device."""
    def fun(*args):
        outs = core.eval_jaxpr(known.jaxpr, known.consts, *args)
        split = len(outs) - n_res
        return [*outs[:split], *(jax.lax.expand_dims(r, (0,)) for r in outs[split:])]
    return _trace(fun, known.in_avals, axes, mesh=mesh, check_vma=check_vma)


def _with_unstacked_residuals(unknown: core.ClosedJaxpr, n_res: int, axes, mesh=None, check_vma=False):
    """``unknown`` taking its first ``n_res`` inputs (residuals) with the leading unit axis added above."""
    def fun(*args):
        res = [jax.lax.squeeze(r, (0,)) for r in args[:n_res]]
        return core.eval_jaxpr(unknown.jaxpr, unknown.consts, *res, *args[n_res:])
    avals = [a.update(shape=(1, *a.shape)) for a in unknown.in_avals[:n_res]] + list(unknown.in_avals[n_res:])
    return _trace(fun, avals, axes, mesh=mesh, check_vma=check_vma)


@weakref_lru_cache
def _split_known(jaxpr, unknowns: tuple, axes: tuple, mesh, check_vma: bool, spmd: tuple = ()):
    """The known and unknown halves of a body (residuals stacked per device), once per body and mask."""
    with _axis_env(axes, mesh, check_vma):
        known, unknown, out_unknowns, res_avals = pe.partial_eval_jaxpr_nounits(jaxpr, unknowns, instantiate=False)
    n_res = len(res_avals)
    return (_with_stacked_residuals(known, n_res, axes, mesh, check_vma),
            _with_unstacked_residuals(unknown, n_res, axes, mesh, check_vma),
            tuple(out_unknowns), tuple(_stacked_spec(axes, len(a.shape), spmd) for a in res_avals))


def _partial_eval(trace, *tracers, jaxpr, in_specs, out_specs, axes, **params):
    unknowns = tuple(not t.pval.is_known() for t in tracers)
    known, unknown, out_unknowns, res_specs = _split_known(jaxpr, unknowns, axes, params.get("mesh"),
                                                           params["check_vma"], _spmd_names())
    known_out_specs = tuple(s for s, u in zip(out_specs, out_unknowns, strict=True) if not u)
    known_outs = spmdsim_map_p.bind(
        *(t.pval.get_known() for t, u in zip(tracers, unknowns, strict=True) if not u), jaxpr=known, axes=axes,
        in_specs=tuple(s for s, u in zip(in_specs, unknowns, strict=True) if not u),
        out_specs=(*known_out_specs, *res_specs), **params)
    known_values, residuals = known_outs[:len(known_out_specs)], known_outs[len(known_out_specs):]
    unknown_params = dict(params, jaxpr=unknown, axes=axes,
                          in_specs=(*res_specs, *(s for s, u in zip(in_specs, unknowns, strict=True) if u)),
                          out_specs=tuple(s for s, u in zip(out_specs, out_unknowns, strict=True) if u))
    in_tracers = [*map(trace.new_instantiated_const, residuals),
                  *(trace.instantiate_const(t) for t, u in zip(tracers, unknowns, strict=True) if u)]
    out_tracers = [pe.JaxprTracer(trace, pe.PartialVal.unknown(a), None) for a in global_avals(unknown_params)]
    effects = core.filter_named_axis_effects(unknown.effects, [name for name, _ in axes])
    eqn = pe.new_eqn_recipe(trace, in_tracers, out_tracers, spmdsim_map_p, unknown_params, effects,
                            source_info_util.current())
    for t in out_tracers:
        t.recipe = eqn
    known_iter, unknown_iter = iter(known_values), iter(out_tracers)
    return [next(unknown_iter) if u else next(known_iter) for u in out_unknowns]


pe.custom_partial_eval_rules[spmdsim_map_p] = _partial_eval


def _partial_eval_custom(saveable, unks_in, inst_in, eqn):
    """Remat's policy-driven partial evaluation (``jax.checkpoint`` around a map): the same split, on
    equations."""
    params = dict(eqn.params)
    jaxpr, axes, mesh, check_vma = params.pop("jaxpr"), params["axes"], params.get("mesh"), params["check_vma"]
    in_specs, out_specs = params.pop("in_specs"), params.pop("out_specs")
    with _axis_env(axes, mesh, check_vma):
        known, staged, unks_out, inst_out, n_res = pe.partial_eval_jaxpr_custom(
            jaxpr.jaxpr, unks_in, inst_in, False, False, saveable)
    known, staged = pe.close_jaxpr(known), pe.close_jaxpr(staged)
    res_avals = staged.in_avals[:n_res]
    known = _with_stacked_residuals(known, n_res, axes, mesh, check_vma)
    staged = _with_unstacked_residuals(staged, n_res, axes, mesh, check_vma)
    res_specs = tuple(_stacked_spec(axes, len(a.shape), _spmd_names()) for a in res_avals)
    ins_known = [v for v, u in zip(eqn.invars, unks_in, strict=True) if not u]
    outs_known = [v for v, u in zip(eqn.outvars, unks_out, strict=True) if not u]
    ins_staged = [v for v, inst in zip(eqn.invars, inst_in, strict=True) if inst]
    outs_staged = [v for v, inst in zip(eqn.outvars, inst_out, strict=True) if inst]
    known_params = dict(params, jaxpr=known, out_specs=(*(s for s, u in zip(out_specs, unks_out, strict=True)
                                                             if not u), *res_specs),
                        in_specs=tuple(s for s, u in zip(in_specs, unks_in, strict=True) if not u))
    residuals = [core.Var(a) for a in global_avals(known_params)[len(outs_known):]]
    staged_params = dict(params, jaxpr=staged, out_specs=tuple(s for s, i in zip(out_specs, inst_out, strict=True)
                                                               if i),
                         in_specs=(*res_specs, *(s for s, i in zip(in_specs, inst_in, strict=True) if i)))
    names = [name for name, _ in axes]
    eqn_known = pe.new_jaxpr_eqn(ins_known, [*outs_known, *residuals], spmdsim_map_p, known_params,
                                 core.filter_named_axis_effects(known.effects, names), eqn.source_info, eqn.ctx)
    eqn_staged = pe.new_jaxpr_eqn([*residuals, *ins_staged], outs_staged, spmdsim_map_p, staged_params,
                                  core.filter_named_axis_effects(staged.effects, names), eqn.source_info, eqn.ctx)
    new_inst = [x for x, inst in zip(eqn.invars, inst_in, strict=True) if type(x) is core.Var and not inst]
    return eqn_known, eqn_staged, unks_out, inst_out, new_inst + residuals


pe.partial_eval_jaxpr_custom_rules[spmdsim_map_p] = _partial_eval_custom


# -- transpose ---------------------------------------------------------------------------------------------

def _unmentioned(spec, axes, spmd: tuple = ()) -> tuple:
    """The mesh axes a spec replicates a value over (its unreduced axes are not, nor those an enclosing
    ``vmap(..., spmd_axis_name=...)`` splits its batch over: JAX's ``_unmentioned2``)."""
    mentioned = {name for names in spec for name in names} | _unreduced.spec_unreduced(spec) | set(spmd)
    return tuple((name, size) for name, size in axes if name not in mentioned)


@weakref_lru_cache
def _transposed_body(jaxpr, undefined: tuple, nonzero_cts: tuple, in_specs: tuple, out_specs: tuple, axes: tuple,
                     check_vma: bool, mesh, spmd: tuple = ()):
    """The body of the transposed map: residual blocks and cotangent blocks in, the cotangent blocks of the
    linear inputs out (psummed over the axes they are replicated along, under pmap's convention), and which
    linear inputs those are: a cotangent that is a symbolic zero is no output (JAX's transpose makes it outside
    the map, in the global type). Once per body and mask."""
    res_avals = [a for a, u in zip(jaxpr.in_avals, undefined, strict=True) if not u]
    ct_avals = [_ct_aval(a) for a, nz in zip(jaxpr.out_avals, nonzero_cts, strict=True) if nz]
    linear_avals = [_ct_type(a) for a, u in zip(jaxpr.in_avals, undefined, strict=True) if u]
    computed: list[bool] = []  # per linear input, set when the body is traced

    def transposed(*res_and_cts):
        res, ct_blocks = iter(res_and_cts[:len(res_avals)]), iter(res_and_cts[len(res_avals):])
        linear = iter(linear_avals)
        primals = [ad.UndefinedPrimal(next(linear)) if u else next(res) for u in undefined]
        ct_in = [next(ct_blocks) if nz else ad.Zero(_ct_aval(a))
                 for a, nz in zip(jaxpr.out_avals, nonzero_cts, strict=True)]
        ct_out = ad.backward_pass(jaxpr.jaxpr, False, jaxpr.consts, primals, ct_in)
        out = []
        computed.clear()
        for ct, spec, u in zip(ct_out, in_specs, undefined, strict=True):
            if not u:
                continue
            computed.append(type(ct) is not ad.Zero)
            if not computed[-1]:
                continue
            replicated = [name for name, _ in _unmentioned(_unreduced.ct_spec(spec), axes, spmd)]  # pmap's axis too
            if not check_vma and replicated and ct.dtype != jax.dtypes.float0:
                ct = jax.lax.psum(ct, tuple(replicated))
            out.append(ct)
        return out

    body = _trace(transposed, [*res_avals, *ct_avals], axes, "the transpose of spmdsim_map", mesh, check_vma)
    return body, tuple(computed)


def _ct_aval(aval):
    """A cotangent's type: the tangent's, reduced and unreduced axes swapped (JAX's ``to_ct_aval``)."""
    return aval.to_ct_aval() if hasattr(aval, "to_ct_aval") else aval.to_tangent_aval()


def _ct_type(aval):
    """``aval`` with its reduced and unreduced axes swapped (the type of a linear input's cotangent)."""
    mat = getattr(aval, "mat", None)
    if mat is None or not (getattr(mat, "unreduced", None) or getattr(mat, "reduced", None)):
        return aval
    return aval.update(manual_axis_type=mat.to_ct_mat())


def _transpose(cts, *args, jaxpr, in_specs, out_specs, axes, check_vma, **params):
    undefined = tuple(ad.is_undefined_primal(x) for x in args)
    ct_specs = tuple(map(_unreduced.ct_spec, out_specs))  # a cotangent's spec: unreduced and reduced swapped
    spmd = _spmd_names()
    if not check_vma:  # pmap's convention: an output replicated along some axes got their devices' cotangents
        cts = [ct if type(ct) is ad.Zero or ct.dtype == jax.dtypes.float0 or not _unmentioned(spec, axes, spmd)
               else ct / math.prod(size for _, size in _unmentioned(spec, axes, spmd))
               for ct, spec in zip(cts, ct_specs, strict=True)]
    nonzero_cts = tuple(type(ct) is not ad.Zero for ct in cts)
    body, computed = _transposed_body(jaxpr, undefined, nonzero_cts, in_specs, out_specs, axes, check_vma,
                                      params.get("mesh"), spmd)
    linear_specs = [s for s, u in zip(in_specs, undefined, strict=True) if u]
    outs = spmdsim_map_p.bind(
        *(x for x, u in zip(args, undefined, strict=True) if not u),
        *(ct for ct, nz in zip(cts, nonzero_cts, strict=True) if nz), jaxpr=body, axes=axes,
        in_specs=(*(s for s, u in zip(in_specs, undefined, strict=True) if not u),
                  *(s for s, nz in zip(ct_specs, nonzero_cts, strict=True) if nz)),
        out_specs=tuple(_unreduced.ct_spec(s) for s, c in zip(linear_specs, computed, strict=True) if c),
        check_vma=check_vma, **params)
    outs, computed = iter(outs), iter(computed)
    return [None if not u else next(outs) if next(computed) else ad.Zero(x.aval)  # (already the cotangent type)
            for x, u in zip(args, undefined, strict=True)]


ad.primitive_transposes[spmdsim_map_p] = _transpose


# -- batching (vmap outside the map) -------------------------------------------------------------------------

def _batch(axis_data, args, dims, *, jaxpr, in_specs, out_specs, axes, **params):
    """JAX's shard_map batching rule (``_shard_map_batch``): the batch axis first and not split, or, under
    ``vmap(..., spmd_axis_name=...)`` naming axes of this map, split over those mesh axes (each device batches
    its block of it)."""
    batched = [d is not None for d in dims]
    args = [batching.moveaxis(x, d, 0) if b else x for x, d, b in zip(args, dims, batched, strict=True)]
    spmd = getattr(axis_data, "spmd_name", None)
    spmd = tuple(spmd) if spmd is not None else None
    sizes = dict(axes)
    if spmd is not None and all(name in sizes for name in spmd):
        used = {name for spec in in_specs for names in spec for name in names}
        if set(spmd) & used:
            raise ValueError("vmap spmd_axis_name cannot appear in shard_map in_specs")
        inner_data = batching.AxisData(axis_data.name, axis_data.size // math.prod(sizes[n] for n in spmd),
                                       axis_data.spmd_name, axis_data.explicit_mesh_axis)
        with _axis_env(axes, params.get("mesh"), params["check_vma"]):  # batched inputs vary along spmd's axes
            batched_jaxpr, out_dims = batching.batch_jaxpr2(jaxpr, inner_data, tuple(0 if b else None
                                                                                     for b in batched))
        used = {name for spec, d in zip(out_specs, out_dims, strict=True) for names in spec for name in names}
        if set(spmd) & used:
            raise ValueError("vmap spmd_axis_name cannot appear in shard_map out_specs")
        out_specs = tuple(s if d is None else _inserted(s, d, spmd) for s, d in zip(out_specs, out_dims, strict=True))
        outs = spmdsim_map_p.bind(
            *args, jaxpr=batched_jaxpr, axes=axes,
            in_specs=tuple((spmd,) + s if b else s for s, b in zip(in_specs, batched, strict=True)),
            out_specs=out_specs, **params)
        return outs, list(out_dims)
    lead = ((),)
    with _axis_env(axes, params.get("mesh"), params["check_vma"]):
        batched_jaxpr, out_batched = batching.batch_jaxpr(jaxpr, axis_data, batched, instantiate=False)
    outs = spmdsim_map_p.bind(
        *args, jaxpr=batched_jaxpr, axes=axes,
        in_specs=tuple(lead + s if b else s for s, b in zip(in_specs, batched, strict=True)),
        out_specs=tuple(lead + s if b else s for s, b in zip(out_specs, out_batched, strict=True)), **params)
    explicit = getattr(axis_data, "explicit_mesh_axis", None)
    if explicit is not None:  # vmap over an Explicit mesh axis: the batch dimension stays split over it
        outs = [_split_batch(o, explicit) if b else o for o, b in zip(outs, out_batched, strict=True)]
    return outs, [0 if b else None for b in out_batched]


def _split_batch(out, explicit: tuple):
    """An eager result (a traced one's type says it already) with its batch dimension, the first, split over the
    vmapped-away Explicit mesh axes, as JAX's result is."""
    if isinstance(out, core.Tracer):
        return out
    spec = tuple(getattr(out.sharding, "spec", ()))
    spec += (None,) * (out.ndim - len(spec))
    return jax.sharding.reshard(out, jax.sharding.PartitionSpec(explicit if len(explicit) > 1 else explicit[0],
                                                                *spec[1:]))


def _inserted(spec, d: int, names: tuple):
    """``spec`` with a dimension split over ``names`` inserted at ``d`` (JAX's ``pxla.batch_spec``)."""
    dims = tuple(spec)
    out = dims[:d] + (names,) + dims[d:]
    return _unreduced.make_spec(out, _unreduced.spec_unreduced(spec), _unreduced.spec_reduced(spec))


batching.fancy_primitive_batchers[spmdsim_map_p] = _batch


# -- type checking (jax_enable_checks) ---------------------------------------------------------------------

def _effects(jaxpr, axes) -> set:
    """A map's effects: its body's, less the named-axis effects of the map's own axes (which it binds)."""
    return core.filter_named_axis_effects(jaxpr.effects, [name for name, _ in axes])


def _typecheck(_ctx_factory, *in_atoms, jaxpr, axes, in_specs, out_specs, check_vma, mesh=None, api="pmap",
               **_params):
    """``core.check_jaxpr``'s rule for a map equation (what ``jax_enable_checks`` runs on every jaxpr made): the
    operands have the global shapes and dtypes that the body's inputs and the in_specs give, the body is
    well typed with the map's named axes bound (for a shard_map's body also its mesh, those axes manual, and
    ``check_vma``: the context it was traced and transformed in), under ``check_vma`` no output varies along
    an axis its out_spec replicates it over; the result is the map's output avals and effects, as the
    abstract evaluation gives them."""
    if not len(in_atoms) == len(in_specs) == len(jaxpr.in_avals):
        raise core.JaxprTypeError(f"spmdsim_map has {len(in_atoms)} operands and {len(in_specs)} in_specs for a "
                                  f"body of {len(jaxpr.in_avals)} inputs")
    if len(out_specs) != len(jaxpr.out_avals):
        raise core.JaxprTypeError(f"spmdsim_map has {len(out_specs)} out_specs for a body of "
                                  f"{len(jaxpr.out_avals)} outputs")
    layout = axes if api == "shard_map" else local_mesh(axes)
    for k, (x, aval, spec) in enumerate(zip(in_atoms, jaxpr.in_avals, in_specs)):
        got = x.aval
        if len(spec) != len(aval.shape) or got.dtype != aval.dtype \
                or tuple(got.shape) != _sharding.global_shape(aval.shape, spec, layout):
            raise core.JaxprTypeError(f"spmdsim_map operand {k} of type {got.str_short(short_dtypes=True)} does not "
                                      f"match its body input {aval.str_short(short_dtypes=True)} split by the "
                                      f"in_spec {spec} over the axes {axes}")
    with _axis_env(axes, mesh, check_vma):
        core.check_jaxpr(jaxpr.jaxpr)
    if check_vma:
        for k, (aval, spec) in enumerate(zip(jaxpr.out_avals, out_specs)):
            varying = getattr(getattr(aval, "mat", None), "vur", frozenset())
            replicated = [name for name, _ in _unmentioned(spec, axes) if name in varying
                          and name not in _unreduced.spec_reduced(spec)]
            if replicated:
                raise core.JaxprTypeError(f"spmdsim_map output {k} of type {aval.str_short(short_dtypes=True)} "
                                          f"varies along {replicated}, which its out_spec {spec} replicates it over")
    return global_avals({"jaxpr": jaxpr, "axes": axes, "out_specs": out_specs, "api": api}), _effects(jaxpr, axes)


core.custom_typechecks[spmdsim_map_p] = _typecheck


# -- printing (make_jaxpr) ---------------------------------------------------------------------------------

def _shown_name(name):
    return PMAP_AXIS if isinstance(name, _runtime.Unnamed) else name


def _shown_spec(dims: tuple) -> jax.sharding.PartitionSpec:
    """A spec (a tuple of mesh axis names per dimension) as a PartitionSpec, without trailing unsplit
    dimensions (as jax.pmap writes its specs: ``P()``, ``P('i',)``, ``P(None, 'i')``)."""
    return _unreduced.partition_spec(dims, _shown_name)


def _shown_mesh(axes) -> str:
    """A pmap's mesh as jax.pmap's is printed: ``Mesh('i': 8, axis_types=(Auto,))``."""
    types = ", ".join("Auto" for _ in axes) + ("," if len(axes) == 1 else "")
    return "Mesh(" + "".join(f"'{_shown_name(name)}': {size}, " for name, size in axes) + f"axis_types=({types}))"


def _pp_params(pairs: list, context, settings) -> pp.Doc:
    """An equation's ``[key=value ...]``, laid out as JAX lays out parameters; a :class:`_Later` value is
    called for its Doc when its turn comes (variables are named in the order they are printed)."""
    docs = [pp.text(f"{key}=") + value.doc() if isinstance(value, _Later) else
            core.pp_kv_pair(key, value, context, settings) for key, value in pairs]
    return pp.group(pp.nest(2, pp.text("[") + pp.brk("") + pp.join(pp.brk(), docs)) + pp.brk("") + pp.text("]"))


def _pp_equation(outvars, name: str, params, invars, eqn, context, settings, name_stack=None) -> pp.Doc:
    """``outvars = name[params] invars``, with the annotations JAX's equations get (source line, name stack:
    the equation's unless given); ``params()`` gives the parameters' Doc, made after the results are named and
    before the operands are."""
    lhs = core.pp_vars(outvars, context, print_shapes=settings.print_shapes, is_binder=True)
    name_stack = eqn.source_info.name_stack if name_stack is None else name_stack
    rhs = [pp.text(name, annotation=f"[{name_stack}]" if settings.name_stack else None), params(),
           pp.text(" ") + core.pp_vars(invars, context)]
    if not outvars:
        return pp.concat(rhs)
    annotation = source_info_util.summarize(eqn.source_info) if settings.source_info else None
    return pp.concat([lhs, pp.text(" = ", annotation=annotation), *rhs])


class _Later:
    """A parameter's Doc, made when it is printed."""

    def __init__(self, doc):
        self.doc = doc


class _Skeleton:
    """What JAX's jaxpr printer reads of a jaxpr whose equations are printed separately."""

    def __init__(self, invars: list, outvars: list, effects):
        self.constvars, self.invars, self.outvars, self.effects = [], invars, outvars, effects


def _pp_rule(eqn, context, settings) -> pp.Doc:
    """A map equation printed as JAX 0.10 prints the program it stands for: a shard_map's as its ``shard_map``
    equation; a pmap's as jax.pmap's, a ``jit`` named ``_fun`` of a ``shard_map`` over a one-axis mesh (how
    JAX 0.10 builds pmap). The simulator's own parameters (``api``, ``executor``, ``axes``) are left out."""
    params = eqn.params
    axes = params["axes"]
    mesh = params.get("mesh")

    def shard_map():
        return _pp_params([("check_vma", params["check_vma"]),
                           ("in_specs", tuple(map(_shown_spec, params["in_specs"]))),
                           ("jaxpr", params["jaxpr"]),
                           ("mesh", mesh if mesh is not None else _shown_mesh(axes)),
                           ("newly_manual_axes", frozenset(_shown_name(name) for name, _ in axes)),
                           ("out_specs", tuple(map(_shown_spec, params["out_specs"])))], context, settings)

    if params.get("api") != "pmap":
        return _pp_equation(eqn.outvars, "shard_map", shard_map, eqn.invars, eqn, context, settings)
    # pmap: the jit's jaxpr has the equation's operands and results, named like them (as JAX names a jit's)
    inner_in, inner_out = [core.Var(x.aval) for x in eqn.invars], [core.Var(v.aval) for v in eqn.outvars]
    context.suggest_same_var_names(inner_in, eqn.invars)
    context.suggest_same_var_names(inner_out, eqn.outvars)

    def jit():
        def inner():
            return core.pp_jaxpr_skeleton(
                _Skeleton(inner_in, inner_out, eqn.effects),
                lambda: _pp_equation(inner_out, "shard_map", shard_map, inner_in, eqn, context, settings,
                                     name_stack=""),  # names inside a jit's jaxpr are relative to it
                context, settings)
        return _pp_params([("name", "_fun"), ("jaxpr", _Later(inner))], context, settings)

    return _pp_equation(eqn.outvars, "jit", jit, eqn.invars, eqn, context, settings)


core.pp_eqn_rules[spmdsim_map_p] = _pp_rule
