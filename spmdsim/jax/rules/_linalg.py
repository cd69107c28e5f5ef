"""Linear algebra, FFT and ``custom_linear_solve``, in both rule tables.

XLA:CPU computes ``jax.lax.linalg``'s decompositions with LAPACK — the LAPACK that SciPy ships: jaxlib takes
its routines from ``scipy.linalg.cython_lapack`` — one matrix at a time, with the optimal workspace. The rules
here call the same routines through ``scipy.linalg.lapack`` the same way (same routine, job and uplo options,
optimal workspace, column-major copies), so results equal XLA:CPU's bit for bit in the cases measured, and
follow its conventions: eigenvector and Q/R signs are LAPACK's, LU pivots are 0-based, a failed factorization
(``info != 0``) is NaN, ``qr`` is ``geqrf`` then ``orgqr``/``ungqr`` as JAX lowers it. The ``geqrf`` and
``geqp3`` primitives (``jnp.linalg.qr(mode="raw")``, ``slogdet(method="qr")``, ``jax.scipy.linalg.qr_multiply``)
are those LAPACK calls alone; ``geqp3`` takes the caller's column pivots, so it calls the routine of
``scipy.linalg.cython_lapack`` itself, as jaxlib does (SciPy's wrapper has no ``jpvt`` argument).

``ragged_dot_general`` is JAX's CPU lowering of it: the ragged operand made dense per group, then one
``dot_general`` (computed by dot_general's own rules, so within dot_general's tolerance of XLA:CPU).

A batch of matrices is a loop of LAPACK calls on its leading axes; the vectorized twins make the device axis
one more leading batch axis of the same loop (the same calls, so the same bits). float16 and bfloat16 are
computed in float32 and rounded.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from spmdsim.jax.evaluation._interpreter import eval_jaxpr
from spmdsim.jax.evaluation._registry import PER_DEVICE, VECTORIZED, per_device, vectorized
from spmdsim.jax.rules._dot import matmul_slices
from spmdsim.jax.rules._elementwise import LOW_FLOATS
from spmdsim.jax.rules._scipy import blas as _blas, lapack as _lapack


def _both(name: str):
    """Register a rule that works on any leading batch axes as its own vectorized twin."""
    def register(rule):
        per_device(name)(rule)
        vectorized(name)(rule)
        return rule
    return register


def _prefix(dtype) -> str:
    return {np.dtype(np.float32): "s", np.dtype(np.float64): "d", np.dtype(np.complex64): "c",
            np.dtype(np.complex128): "z"}[np.dtype(dtype)]


def _routine(name: str, dtype):
    prefix = _prefix(dtype)
    if name.startswith("or") and prefix in "cz":
        name = "un" + name[2:]
    if name.startswith("sy") and prefix in "cz":
        name = "he" + name[2:]
    return getattr(_lapack, prefix + name)


def _compute_dtype(dtype) -> np.dtype:
    return np.dtype(np.float32) if np.dtype(dtype) in LOW_FLOATS else np.dtype(dtype)


def _lapack_dtype(dtype, primitive: str) -> np.dtype:
    """The dtype a primitive that XLA:CPU computes with LAPACK is computed in here: its own.

    Raises:
        NotImplementedError: for float16 and bfloat16, as JAX does when it compiles the program for CPU (LAPACK
        has no routine for them; ``jnp.linalg.qr(x.astype(jnp.float16))`` raises there, linalg_test's
        ``testQrInvalidDtypeCPU``).
    """
    dtype = np.dtype(dtype)
    if dtype in LOW_FLOATS:
        raise NotImplementedError(f"Unsupported dtype {dtype}: XLA:CPU computes {primitive} with LAPACK, which has "
                                  f"no {dtype} routine (JAX raises this when it compiles the program for CPU). "
                                  f"Cast the operand to float32 first.")
    return dtype


def _lwork(value) -> int:
    return max(1, int(np.real(np.asarray(value).reshape(-1)[0])))


def _per_matrix(fn, arrays, core_ndims, out_dtypes):
    """Apply ``fn`` (NumPy arrays of one problem -> tuple of arrays) to every problem of a batch: the leading
    axes of ``arrays`` beyond their ``core_ndims`` trailing axes. Returns the stacked results."""
    batch = arrays[0].shape[:arrays[0].ndim - core_ndims[0]]
    count = math.prod(batch)
    flat = [np.reshape(a, (count, *a.shape[a.ndim - k:])) for a, k in zip(arrays, core_ndims, strict=True)]
    results = [fn(*(f[i] for f in flat)) for i in range(count)]
    if count == 0:
        shapes = fn.empty_shapes(*(f.shape[1:] for f in flat))
        return [np.zeros((*batch, *s), d) for s, d in zip(shapes, out_dtypes, strict=True)]
    return [np.stack([np.asarray(r[k]) for r in results]).reshape((*batch, *np.shape(results[0][k]))).astype(d)
            for k, d in enumerate(out_dtypes)]


def _nan_if(failed: bool, *arrays):
    return tuple(np.full_like(a, np.nan) if failed else a for a in arrays)


# -- Cholesky --------------------------------------------------------------------------------------------------

@_both("cholesky")
def _cholesky(x):
    compute = _lapack_dtype(x.dtype, "cholesky")

    def one(a):
        potrf = _routine("potrf", compute)
        c, info = potrf(np.asfortranarray(a, compute), lower=1, clean=0)
        return _nan_if(info != 0, c)
    one.empty_shapes = lambda s: [s]
    return _per_matrix(one, [x], [2], [x.dtype])[0]


@_both("cholesky_update")
def _cholesky_update(r, w):
    """JAX's rank-one update of an upper Cholesky factor by Givens rotations (its CPU lowering), vectorized
    over any leading batch axes."""
    r, z = np.array(r, copy=True), np.array(w, copy=True)
    n = z.shape[-1]
    one, zero = np.asarray(1, r.dtype), np.asarray(0, r.dtype)
    for k in range(n):
        x, y = r[..., k, k], z[..., k]
        with np.errstate(all="ignore"):
            ax, ay = np.abs(x), np.abs(y)
            denominator = np.where(ax > ay, ax, ay)
            xs, ys = x / denominator, y / denominator
            rh = one / np.sqrt(xs ** 2 + ys ** 2)
        c = np.where(y == 0, one, xs * rh).astype(r.dtype)
        s = np.where(y == 0, zero, -ys * rh).astype(r.dtype)
        row = r[..., k, :]
        new_row = c[..., None] * row - s[..., None] * z
        z = c[..., None] * z + s[..., None] * row
        r[..., k, :] = new_row
    return r


# -- eigendecompositions ---------------------------------------------------------------------------------------

def _eigh(x, *, lower, sort_eigenvalues=True, subset_by_index=None, algorithm=None):
    n = x.shape[-1]
    if subset_by_index is not None and tuple(subset_by_index) != (0, n):
        raise NotImplementedError("eigh with subset_by_index: XLA:CPU does not support it either")
    compute = _lapack_dtype(x.dtype, "eigh")

    def one(a):
        w, v, info = _routine("syevd", compute)(np.asfortranarray(a, compute), compute_v=1, lower=int(bool(lower)))
        return _nan_if(info != 0, v, w)
    one.empty_shapes = lambda s: [s, s[:-1]]
    return _per_matrix(one, [x], [2], [x.dtype, np.dtype(x.dtype).type(0).real.dtype if x.dtype.kind == "c"
                                       else x.dtype])


_both("eigh")(_eigh)


def _unpack_eigenvectors(wi, packed, dtype):
    """LAPACK's real-geev packing (a conjugate pair in two columns) as complex eigenvectors, as jaxlib does."""
    out = packed.astype(dtype)
    j = 0
    n = len(wi)
    while j < n:
        if wi[j] == 0 or np.isnan(wi[j]):
            j += 1
            continue
        re, im = packed[:, j], packed[:, j + 1] if j + 1 < n else np.zeros_like(packed[:, j])
        out[:, j].real, out[:, j].imag = re, im
        if j + 1 < n:
            out[:, j + 1].real, out[:, j + 1].imag = re, -im
        j += 2
    return out


@_both("eig")
def _eig(x, *, compute_left_eigenvectors, compute_right_eigenvectors, enable_eigvec_derivs=False,
         implementation=None):
    compute = _lapack_dtype(x.dtype, "eig")
    complex_dtype = np.result_type(compute, np.complex64)
    out_complex = np.result_type(x.dtype if x.dtype not in LOW_FLOATS else np.float32, np.complex64)
    left, right = int(bool(compute_left_eigenvectors)), int(bool(compute_right_eigenvectors))

    def one(a):
        a = np.asfortranarray(a, compute)
        n = a.shape[0]
        if not np.isfinite(a).all():  # jaxlib: info = -4, everything NaN
            nan = np.full((n, n), np.nan, complex_dtype)
            return (np.full(n, np.nan, complex_dtype), nan, nan)
        geev = _routine("geev", compute)
        lwork = _lwork(getattr(_lapack, _prefix(compute) + "geev_lwork")(n, compute_vl=left, compute_vr=right)[0])
        if compute.kind == "c":
            w, vl, vr, info = geev(a, compute_vl=left, compute_vr=right, lwork=lwork)
        else:
            wr, wi, vl, vr, info = geev(a, compute_vl=left, compute_vr=right, lwork=lwork)
            w = wr + 1j * wi
            vl = _unpack_eigenvectors(wi, vl, complex_dtype) if left else vl
            vr = _unpack_eigenvectors(wi, vr, complex_dtype) if right else vr
        return _nan_if(info != 0, np.asarray(w, complex_dtype), np.asarray(vl, complex_dtype),
                       np.asarray(vr, complex_dtype))
    one.empty_shapes = lambda s: [s[:-1], s, s]
    w, vl, vr = _per_matrix(one, [x], [2], [out_complex] * 3)
    return [w] + ([vl] if left else []) + ([vr] if right else [])


@_both("schur")
def _schur(x, *, compute_schur_vectors, sort_eig_vals=False, select_callable=None):
    if sort_eig_vals or select_callable is not None:
        raise NotImplementedError("schur with sorted eigenvalues (select_callable)")
    compute = _lapack_dtype(x.dtype, "schur")
    jobvs = int(bool(compute_schur_vectors))

    def one(a):
        gees = _routine("gees", compute)
        a = np.asfortranarray(a, compute)
        query = gees(lambda *args: 0, a, compute_v=jobvs, sort_t=0, lwork=-1)
        lwork = _lwork(query[-2])
        result = gees(lambda *args: 0, a, compute_v=jobvs, sort_t=0, lwork=lwork)
        t, vs, info = result[0], result[-3], result[-1]
        return _nan_if(info != 0, t, vs if jobvs else np.zeros_like(t))
    one.empty_shapes = lambda s: [s, s]
    t, vs = _per_matrix(one, [x], [2], [x.dtype, x.dtype])
    return [t, vs] if compute_schur_vectors else [t]


@_both("hessenberg")
def _hessenberg(x):
    compute = _lapack_dtype(x.dtype, "hessenberg")

    def one(a):
        n = a.shape[0]
        gehrd = _routine("gehrd", compute)
        lwork = _lwork(getattr(_lapack, _prefix(compute) + "gehrd_lwork")(n)[0])
        h, tau, info = gehrd(np.asfortranarray(a, compute), lwork=lwork)
        return _nan_if(info != 0, h, np.asarray(tau)[:max(n - 1, 0)])
    one.empty_shapes = lambda s: [s, (max(s[-1] - 1, 0),)]
    return _per_matrix(one, [x], [2], [x.dtype, x.dtype])


@_both("tridiagonal")
def _tridiagonal(x, *, lower):
    compute = _lapack_dtype(x.dtype, "tridiagonal")
    real = np.dtype(x.dtype).type(0).real.dtype if x.dtype.kind == "c" else x.dtype

    def one(a):
        n = a.shape[0]
        sytrd = _routine("sytrd", compute)
        name = _prefix(compute) + ("hetrd" if compute.kind == "c" else "sytrd") + "_lwork"
        lwork = _lwork(getattr(_lapack, name)(n, lower=int(bool(lower)))[0])
        c, d, e, tau, info = sytrd(np.asfortranarray(a, compute), lower=int(bool(lower)), lwork=lwork)
        return _nan_if(info != 0, c, d, e, tau)
    one.empty_shapes = lambda s: [s, s[:-1], (s[-1] - 1,), (s[-1] - 1,)]
    return _per_matrix(one, [x], [2], [x.dtype, real, real, x.dtype])


# -- LU, QR, SVD --------------------------------------------------------------------------------------------------

@_both("lu")
def _lu(x):
    compute = _lapack_dtype(x.dtype, "lu")
    m, n = x.shape[-2:]

    def one(a):
        if a.size == 0:  # LAPACK rejects an empty matrix (lda < 1); XLA: no pivots, the identity permutation
            return a, np.zeros(0, np.int32), np.arange(m, dtype=np.int32)
        lu, piv, info = _routine("getrf", compute)(np.asfortranarray(a, compute))
        piv = np.asarray(piv, np.int32)[:min(m, n)]
        return lu, piv, _pivots_to_permutation(piv, m)
    one.empty_shapes = lambda s: [s, (min(s),), (s[0],)]
    return _per_matrix(one, [x], [2], [x.dtype, np.int32, np.int32])


def _pivots_to_permutation(pivots: np.ndarray, size: int) -> np.ndarray:
    """Row swaps (0-based, applied in order) as a permutation, over any leading batch axes."""
    batch = pivots.shape[:-1]
    perm = np.broadcast_to(np.arange(size, dtype=np.int32), (*batch, size)).copy()
    flat, piv = perm.reshape(-1, size), pivots.reshape(-1, pivots.shape[-1])
    rows = np.arange(flat.shape[0])
    for i in range(pivots.shape[-1]):  # JAX's loop: read perm[j] clamped, write perm[j] only in bounds
        j = piv[:, i]
        inside = (j >= 0) & (j < size)
        a, b = flat[rows, i].copy(), flat[rows, np.clip(j, 0, size - 1)].copy()
        flat[rows, i] = b
        flat[rows[inside], j[inside]] = a[inside]
    return flat.reshape(perm.shape)


@_both("lu_pivots_to_permutation")
def _lu_pivots_to_permutation(pivots, *, permutation_size):
    return _pivots_to_permutation(np.asarray(pivots, np.int32), int(permutation_size))


def _geqrf(a, compute):
    geqrf = _routine("geqrf", compute)
    m, n = a.shape
    lwork = _lwork(getattr(_lapack, _prefix(compute) + "geqrf_lwork")(m, n)[0])
    r, tau, _, info = geqrf(np.asfortranarray(a, compute), lwork=lwork)
    return r, tau


def _orgqr(a, tau, compute):
    orgqr = _routine("orgqr", compute)
    if a.shape[1] == 0:
        return np.asfortranarray(a, compute)
    a = np.asfortranarray(a, compute)
    lwork = _lwork(orgqr(a, tau, lwork=-1)[1])
    q, _, info = orgqr(a, tau, lwork=lwork)
    return q


@_both("householder_product")
def _householder_product(a, taus):
    compute = _lapack_dtype(a.dtype, "householder_product")

    def one(x, t):
        return (_orgqr(x, np.asarray(t, compute), compute),)
    one.empty_shapes = lambda s, t: [s]
    return _per_matrix(one, [a, taus], [2, 1], [a.dtype])[0]


@_both("ormqr")
def _ormqr(a, taus, c, *, left, transpose):
    compute = _lapack_dtype(a.dtype, "ormqr")
    side = "L" if left else "R"
    trans = ("C" if compute.kind == "c" else "T") if transpose else "N"

    def one(x, t, y):
        ormqr = _routine("ormqr", compute)
        t = np.asarray(t, compute)
        x, y = np.asfortranarray(x[:, :len(t)], compute), np.asfortranarray(y, compute)  # the k reflectors
        lwork = _lwork(ormqr(side, trans, x, t, y, lwork=-1)[1])
        cq, _, info = ormqr(side, trans, x, t, y, lwork=lwork)
        return (cq,)
    one.empty_shapes = lambda s, t, u: [u]
    return _per_matrix(one, [a, taus, c], [2, 1, 2], [c.dtype])[0]


@_both("qr")
def _qr(x, *, pivoting=False, full_matrices=True, use_magma=None):
    """JAX's QR lowering: geqrf (geqp3 with pivoting), then orgqr on R (padded to m x m for full matrices
    with m > n), then the upper triangle of R."""
    compute = _lapack_dtype(x.dtype, "qr")
    m, n = x.shape[-2:]
    k = m if full_matrices else min(m, n)

    def one(a):
        if m == 0 or n == 0:
            q = np.eye(m, k, dtype=compute)
            return q, np.zeros((k, n), compute), np.zeros(n, np.int32)
        p = np.zeros(n, np.int32)
        if pivoting:
            geqp3 = _routine("geqp3", compute)
            af = np.asfortranarray(a, compute)
            lwork = _lwork(geqp3(af, lwork=-1)[3])
            r, jpvt, tau, _, info = geqp3(af, lwork=lwork)
            p = np.asarray(jpvt, np.int32) - 1
        else:
            r, tau = _geqrf(a, compute)
        if m < n:
            q = _orgqr(r[:m, :m], tau, compute)
        elif full_matrices:
            q = _orgqr(np.concatenate([r, np.zeros((m, m - n), compute)], axis=1), tau, compute)
        else:
            q = _orgqr(r, tau, compute)
            r = r[:n, :n]
        return q, np.triu(r), p
    one.empty_shapes = lambda s: [(m, k), (k, n), (n,)]
    q, r, p = _per_matrix(one, [x], [2], [x.dtype, x.dtype, np.int32])
    return [q, r, p] if pivoting else [q, r]


@_both("svd")
def _svd(x, *, full_matrices, compute_uv, subset_by_index=None, algorithm=None):
    compute = _lapack_dtype(x.dtype, "svd")
    real = np.dtype(x.dtype).type(0).real.dtype if x.dtype.kind == "c" else x.dtype
    m, n = x.shape[-2:]
    if subset_by_index is not None and tuple(subset_by_index) != (0, min(m, n)):
        raise NotImplementedError("svd with subset_by_index: XLA:CPU does not support it either")
    algo = getattr(algorithm, "name", str(algorithm)).upper() if algorithm is not None else "DEFAULT"
    routine = "gesvd" if algo == "QR" else "gesdd"
    uv, full = int(bool(compute_uv)), int(bool(full_matrices))
    ku, kv = (m, n) if full else (min(m, n), min(m, n))

    def one(a):
        if m == 0 or n == 0:
            return np.zeros(0, real), np.eye(m, ku, dtype=compute), np.eye(kv, n, dtype=compute)
        fn = _routine(routine, compute)
        lwork_fn = getattr(_lapack, _prefix(compute) + routine + "_lwork")
        lwork = _lwork(lwork_fn(m, n, compute_uv=uv, full_matrices=full)[0])
        u, s, vt, info = fn(np.asfortranarray(a, compute), compute_uv=uv, full_matrices=full, lwork=lwork)
        if not uv:
            u, vt = np.zeros((m, ku), compute), np.zeros((kv, n), compute)
        return _nan_if(info != 0, s, u, vt)
    one.empty_shapes = lambda sh: [(min(m, n),), (m, ku), (kv, n)]
    s, u, vt = _per_matrix(one, [x], [2], [real, x.dtype, x.dtype])
    return [s, u, vt] if compute_uv else [s]


# -- solves and products -----------------------------------------------------------------------------------------

@_both("triangular_solve")
def _triangular_solve(a, b, *, left_side, lower, transpose_a, conjugate_a, unit_diagonal):
    """BLAS trsm with alpha = 1, as XLA:CPU calls it (a conjugated first when not transposed)."""
    compute = _compute_dtype(b.dtype)
    if conjugate_a and not transpose_a:
        a, conjugate_a = np.conj(a), False
    trans = (2 if conjugate_a else 1) if transpose_a else 0
    prefix = {"f": "s", "d": "d", "F": "c", "D": "z"}[np.dtype(compute).char]
    trsm = getattr(_blas, prefix + "trsm")
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = np.broadcast_to(a, (*batch, *a.shape[-2:]))
    b = np.broadcast_to(b, (*batch, *b.shape[-2:]))

    def one(x, y):
        if y.size == 0:
            return (np.asarray(y, compute),)
        return (trsm(1.0, np.asfortranarray(x, compute), np.asfortranarray(y, compute), side=0 if left_side else 1,
                     lower=int(bool(lower)), trans_a=trans, diag=int(bool(unit_diagonal))),)
    one.empty_shapes = lambda s, t: [t]
    return _per_matrix(one, [a, b], [2, 2], [b.dtype])[0]


@_both("tridiagonal_solve")
def _tridiagonal_solve(dl, d, du, b, *, perturb_singular=False):
    """LAPACK gtsv (jaxlib passes dl from its second element: JAX's dl[0] and du[-1] are padding)."""
    compute = _lapack_dtype(b.dtype, "tridiagonal_solve")
    if perturb_singular:
        one = _tridiagonal_solve_perturbed
        one.empty_shapes = lambda a, m, u, r: [r]
        return _per_matrix(one, [dl.astype(compute), d.astype(compute), du.astype(compute), b.astype(compute)],
                           [1, 1, 1, 2], [b.dtype])[0]

    def one(lo, mid, up, rhs):
        n = mid.shape[0]
        if n == 0 or rhs.size == 0:
            return (np.asarray(rhs, compute),)
        gtsv = _routine("gtsv", compute)
        _, _, _, x, info = gtsv(np.asarray(lo[1:], compute), np.asarray(mid, compute), np.asarray(up[:n - 1], compute),
                                np.asfortranarray(rhs, compute))
        return _nan_if(info != 0, x)
    one.empty_shapes = lambda a, m, u, r: [r]
    return _per_matrix(one, [dl, d, du, b], [1, 1, 1, 2], [b.dtype])[0]


def _perturb_pivot(perturb, pivot, row):
    """jaxlib's MaybePerturbPivot (from LAPACK's xLAGTS): ``pivot`` moved away from zero in steps of ``perturb``
    (doubling) until neither ``row / pivot`` nor ``1 / pivot`` overflows; returns the pivot and the row."""
    real = np.finfo(np.asarray(pivot).dtype).dtype
    one, tiny, eps = real.type(1), np.finfo(real).tiny, np.finfo(real).eps
    small = one / np.finfo(real).max
    safemin = tiny if small < tiny else small * (one + eps)
    bignum = one / safemin
    size = abs(pivot)
    if size >= one:
        return pivot, row
    perturb = np.copysign(max(abs(perturb), safemin), np.real(pivot)).astype(real)
    biggest = np.max(np.abs(row), initial=real.type(0))
    while size < one:
        if size < safemin:
            if size == 0 or biggest * safemin > size:
                pivot, perturb = pivot + perturb, perturb * real.type(2)
            else:
                return pivot * bignum, row * bignum
        elif biggest > size * bignum:
            pivot, perturb = pivot + perturb, perturb * real.type(2)
        else:
            break
        size = abs(pivot)
    return pivot, row


def _tridiagonal_solve_perturbed(dl, d, du, b):
    """jaxlib's tridiagonal_solve_perturbed kernel (jaxlib/tridiagonal_solve_perturbed.h, after LAPACK's xLAGTF and
    xLAGTS): Gaussian elimination with row pivoting, the forward solve fused in, then back substitution with tiny
    pivots perturbed by about eps * max |U| so that a singular system has a finite solution."""
    n = d.shape[0]
    x = np.array(b, copy=True)
    if n == 0:
        return (x,)
    real = np.finfo(d.dtype).dtype.type
    if n == 1:
        p, row = _perturb_pivot(np.finfo(real).eps * abs(d[0]), d[0], x[0])
        x[0] = row / p
        return (x,)
    u = np.zeros((n, 3), d.dtype)
    u[0, 0], u[0, 1] = d[0], du[0]
    max_u = max(abs(u[0, 0]), abs(u[0, 1]))
    scale1 = abs(u[0, 0]) + abs(u[0, 1])
    for k in range(n - 1):
        u[k + 1, 0] = d[k + 1]
        scale2 = abs(dl[k + 1]) + abs(u[k + 1, 0]) + (abs(du[k + 1]) if k < n - 2 else 0)
        if dl[k + 1] == 0:
            scale1, u[k + 1, 1], u[k, 2] = scale2, du[k + 1], 0
            x[k + 1] = b[k + 1]
        else:
            piv1 = real(0) if u[k, 0] == 0 else abs(u[k, 0]) / scale1
            piv2 = abs(dl[k + 1]) / scale2
            if piv2 <= piv1:
                scale1 = scale2
                factor = dl[k + 1] / u[k, 0]
                u[k + 1, 0] -= factor * u[k, 1]
                u[k + 1, 1], u[k, 2] = du[k + 1], 0
                x[k + 1] = b[k + 1] - factor * x[k]
            else:
                factor = u[k, 0] / dl[k + 1]
                previous = u[k, 1]
                u[k, 0] = dl[k + 1]
                u[k + 1, 0] = previous - factor * d[k + 1]
                u[k, 1] = d[k + 1]
                if k < n - 2:
                    u[k, 2] = du[k + 1]
                    u[k + 1, 1] = -factor * du[k + 1]
                x[k + 1] = x[k] - factor * b[k + 1]
                x[k] = b[k + 1]
                scale1 = abs(u[k + 1, 0]) + abs(u[k + 1, 1])
        if k < n - 2:
            max_u = max(max_u, *np.abs(u[k]))
    max_u = max(max_u, abs(u[n - 1, 0]))
    perturb = np.finfo(real).eps * max_u
    one = d.dtype.type(1)
    for k in range(n - 1, -1, -1):
        row = x[k] - (u[k, 1] * x[k + 1] if k < n - 1 else 0) - (u[k, 2] * x[k + 2] if k < n - 2 else 0)
        p, row = _perturb_pivot(perturb, u[k, 0], np.asarray(row, x.dtype))
        x[k] = row * (one / p)
    return (x,)


@_both("symmetric_product")
def _symmetric_product(a, c, *, alpha, beta):
    """alpha A A^T + beta C, as JAX lowers it on CPU (a batched matmul at HIGHEST precision)."""
    compute = _compute_dtype(a.dtype)
    at = np.swapaxes(a, -1, -2)
    product = matmul_slices(a.astype(compute), at.astype(compute))
    return (np.asarray(alpha, compute) * product + np.asarray(beta, compute) * c.astype(compute)).astype(c.dtype)


# -- FFT ----------------------------------------------------------------------------------------------------------

@_both("fft")
def _fft(x, *, fft_type, fft_lengths):
    """numpy.fft (pocketfft, in the operand's precision) over the trailing len(fft_lengths) axes."""
    kind = getattr(fft_type, "name", str(fft_type)).upper().rsplit(".", 1)[-1]
    axes = tuple(range(x.ndim - len(fft_lengths), x.ndim))
    lengths = tuple(int(n) for n in fft_lengths)
    if x.size == 0 or 0 in lengths:  # pocketfft rejects 0 points; XLA: an empty (or all-zero) result
        return _empty_fft(x, kind, lengths)
    if kind == "FFT":
        out = np.fft.fftn(x, axes=axes)
        dtype = x.dtype
    elif kind == "IFFT":
        out = np.fft.ifftn(x, axes=axes)
        dtype = x.dtype
    elif kind == "RFFT":
        out = np.fft.rfftn(x, axes=axes)
        dtype = np.result_type(x.dtype, np.complex64)
    else:  # IRFFT
        out = np.fft.irfftn(x, s=lengths, axes=axes)
        dtype = np.dtype(x.dtype).type(0).real.dtype
    return np.asarray(out).astype(dtype, copy=False)


def _empty_fft(x, kind: str, lengths: tuple):
    """The FFT of an empty operand (or of 0 points): zeros of the result's shape and dtype."""
    shape = list(x.shape)
    if kind == "RFFT":
        shape[-1] = lengths[-1] // 2 + 1
        dtype = np.result_type(x.dtype, np.complex64)
    elif kind == "IRFFT":
        shape[x.ndim - len(lengths):] = lengths
        dtype = np.dtype(x.dtype).type(0).real.dtype
    else:
        dtype = x.dtype
    return np.zeros(shape, dtype)


# -- custom_linear_solve --------------------------------------------------------------------------------------------

def _solve_parts(args, const_lengths):
    counts = [const_lengths.matvec, const_lengths.vecmat, const_lengths.solve, const_lengths.transpose_solve]
    starts = np.cumsum([0] + counts)
    solve_consts = args[starts[2]:starts[3]]
    return solve_consts, args[starts[4]:]


@per_device("custom_linear_solve")
def _custom_linear_solve(*args, const_lengths, jaxprs):
    """The forward value of a custom linear solve is its ``solve`` jaxpr applied to b (matvec and the
    transposes only matter to autodiff, which JAX has already done)."""
    solve_consts, b = _solve_parts(args, const_lengths)
    return eval_jaxpr(jaxprs.solve.jaxpr, jaxprs.solve.consts, *solve_consts, *b)


@vectorized("custom_linear_solve")
def _custom_linear_solve_v(*args, const_lengths, jaxprs):
    """For now, the solve jaxpr once per device with the per-device evaluator (a higher-order primitive: its
    batched form belongs with the vectorized executor's own evaluation of sub-jaxprs)."""
    n = max(np.shape(a)[0] for a in args)
    outs = [_custom_linear_solve(*(np.broadcast_to(a, (n, *np.shape(a)[1:]))[d] for a in args),
                                 const_lengths=const_lengths, jaxprs=jaxprs) for d in range(n)]
    return [np.stack([np.asarray(o[k]) for o in outs]) for k in range(len(outs[0]))]


# -- geqrf and geqp3: the LAPACK steps of QR that jnp.linalg.qr(mode="raw"), slogdet(method="qr") and
# jax.scipy.linalg.qr_multiply bind themselves --------------------------------------------------------------------

@_both("geqrf")
def _geqrf_rule(x):
    """LAPACK ?geqrf with the optimal workspace, as jaxlib's geqrf_ffi calls it: R above the diagonal, the
    Householder reflectors below it and in ``taus``."""
    compute = _lapack_dtype(x.dtype, "geqrf")

    def one(a):
        if a.size == 0:
            return np.asarray(a, compute), np.zeros(min(a.shape), compute)
        return _geqrf(a, compute)
    one.empty_shapes = lambda s: [s, (min(s),)]
    return _per_matrix(one, [x], [2], [x.dtype, x.dtype])


def _cython_lapack(name: str):
    """The LAPACK routine ``name`` of scipy.linalg.cython_lapack (the functions jaxlib calls), callable with
    pointers (Fortran's calling convention)."""
    import ctypes

    import scipy.linalg.cython_lapack as cython_lapack

    capsule = cython_lapack.__pyx_capi__[name]
    get_name, get_pointer = ctypes.pythonapi.PyCapsule_GetName, ctypes.pythonapi.PyCapsule_GetPointer
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    pointer = get_pointer(capsule, get_name(capsule))
    count = 10 if name[0] in "cz" else 9
    return ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * count))(pointer)


_GEQP3: dict = {}


def _geqp3_one(a: np.ndarray, jpvt: np.ndarray, compute: np.dtype):
    """LAPACK ?geqp3 as jaxlib's geqp3_ffi calls it: on a column-major copy of ``a`` and of the caller's
    ``jpvt`` (1-based; a nonzero entry moves its column to the front), workspace from a query (lwork = -1), a
    real workspace of 2n for complex types."""
    name = _prefix(compute) + "geqp3"
    routine = _GEQP3.get(name)
    if routine is None:
        routine = _GEQP3[name] = _cython_lapack(name)
    m, n = a.shape
    a = np.array(a, dtype=compute, order="F", copy=True)
    jpvt = np.array(jpvt, dtype=np.int32, copy=True)
    tau = np.zeros(min(m, n), compute)
    if m == 0:  # XLA:CPU dies of a SIGFPE here: LAPACK's column order for no rows, without its xerbla message
        fixed = 0
        for j in range(n):  # ?geqp3's first loop: columns marked in jpvt moved to the front
            if jpvt[j] != 0:
                if j != fixed:
                    jpvt[j], jpvt[fixed] = jpvt[fixed], j + 1
                else:
                    jpvt[j] = j + 1
                fixed += 1
            else:
                jpvt[j] = j + 1
        return a, jpvt, tau
    ints = [np.array([v], np.int32) for v in (m, n, max(1, m))]
    info, lwork = np.zeros(1, np.int32), np.array([-1], np.int32)
    real = np.zeros(1, np.float32 if compute in (np.float32, np.complex64) else np.float64)
    rwork = np.zeros(max(1, 2 * n), real.dtype)
    query = np.zeros(1, compute)

    def call(work):
        args = [ints[0], ints[1], a, ints[2], jpvt, tau, work, lwork] + ([rwork] if compute.kind == "c" else [])
        routine(*(x.ctypes.data for x in args), info.ctypes.data)
    call(query)
    lwork[0] = _lwork(query[0])
    call(np.zeros(lwork[0], compute))
    return a, jpvt, tau


@_both("geqp3")
def _geqp3_rule(x, jpvt, *, use_magma=None):
    compute = _lapack_dtype(x.dtype, "geqp3")

    def one(a, p):
        r, p_out, tau = _geqp3_one(a, p, compute)
        return r, p_out, tau
    one.empty_shapes = lambda s, t: [s, t, (min(s),)]
    return _per_matrix(one, [x, jpvt], [2, 1], [x.dtype, jpvt.dtype, x.dtype])


# -- ragged_dot_general: as JAX lowers it on CPU (jax/_src/lax/lax.py's _ragged_dot_general_impl) -----------------
# The ragged operand is made dense, one copy per group with the rows (or contracted entries) outside the group
# zeroed, and one dot_general contracts the group axis too (ragged non-contracting dimension), or keeps it as
# the leading batch axis of the result (ragged contracting dimension); a ragged batch dimension is a plain
# dot_general. Both twins call dot_general's own rules, the device axis an outer batch axis of the same products.

def _ragged_mode(lhs_rank: int, dnums):
    (lc, _), (lb, _) = dnums.dot_dimension_numbers
    ragged = dnums.lhs_ragged_dimensions[0]
    if ragged in lc:
        return "contracting", ragged
    if ragged in lb:
        return "batch", ragged
    return "noncontracting", ragged


def _ragged_prefix(mode: str, rank: int, ragged: int, batch, contract) -> list:
    batch, contract = list(batch), list(contract)
    if mode == "noncontracting":
        free = [d for d in range(rank) if d not in batch and d not in contract]
        return batch + free[:free.index(ragged)]
    if mode == "contracting":
        return batch + contract[:contract.index(ragged)]
    return batch[:batch.index(ragged)]


def _ragged_to_dense(x: np.ndarray, sizes: np.ndarray, dim: int, axes: list, lead: int) -> np.ndarray:
    """``x`` (``lead`` device axes, then its own) as ``(lead..., g, x...)``: group ``j`` keeps the entries of
    ``dim`` in ``[start_j, end_j)`` (``sizes``' running sum in its own dtype), zero elsewhere; ``sizes`` has
    shape ``(lead..., [x.shape[a] for a in axes]..., g)``."""
    outer, shape = x.shape[:lead], x.shape[lead:]
    g = sizes.shape[-1]
    ends = np.cumsum(sizes, axis=-1, dtype=sizes.dtype).astype(np.int64)
    starts = np.concatenate([np.zeros_like(ends[..., :1]), ends[..., :-1]], axis=-1)
    order = np.argsort(axes).tolist()
    perm = (*range(lead), lead + len(axes), *(lead + o for o in order))
    bounds_shape = (*outer, g, *(shape[a] if a in axes else 1 for a in range(len(shape))))
    starts, ends = (b.transpose(perm).reshape(bounds_shape) for b in (starts, ends))
    iota = np.arange(shape[dim], dtype=np.int64).reshape(
        (1,) * (lead + 1) + tuple(shape[dim] if a == dim else 1 for a in range(len(shape))))
    mask = (starts <= iota) & (iota < ends)
    return np.where(mask, np.expand_dims(x, lead), np.zeros((), x.dtype))


def _ragged_dot(lead: int, lhs, rhs, group_sizes, *, ragged_dot_dimension_numbers, precision=None,
                preferred_element_type=None, group_offset=None, out_sharding=None):
    if group_offset is not None:
        raise NotImplementedError("ragged_dot_general with group_offset (JAX does not implement it either)")
    dnums = ragged_dot_dimension_numbers
    dot = (VECTORIZED if lead else PER_DEVICE)["dot_general"]
    rank = lhs.ndim - lead
    mode, ragged = _ragged_mode(rank, dnums)
    (lc, rc), (lb, rb) = dnums.dot_dimension_numbers
    params = dict(precision=precision, preferred_element_type=preferred_element_type)
    if mode == "batch":
        return dot(lhs, rhs, dimension_numbers=dnums.dot_dimension_numbers, **params)
    l_prefix = _ragged_prefix(mode, rank, ragged, lb, lc)
    sizes = np.asarray(group_sizes)
    if sizes.ndim - lead == 1:  # [g]: the same groups for every prefix index
        prefix_shape = tuple(lhs.shape[lead + d] for d in l_prefix)
        sizes = np.broadcast_to(sizes.reshape(sizes.shape[:lead] + (1,) * len(prefix_shape) + sizes.shape[-1:]),
                                sizes.shape[:lead] + prefix_shape + sizes.shape[-1:])
    up = lambda dims: [d + 1 for d in dims]  # noqa: E731
    dense_lhs = _ragged_to_dense(lhs, sizes, ragged, l_prefix, lead)
    if mode == "noncontracting":
        group_dim = dnums.rhs_group_dimensions[0]
        return dot(dense_lhs, rhs, dimension_numbers=((up(lc) + [0], list(rc) + [group_dim]), (up(lb), list(rb))),
                   **params)
    rhs_ragged = rc[list(lc).index(ragged)]
    r_prefix = _ragged_prefix(mode, rhs.ndim - lead, rhs_ragged, rb, rc)
    dense_rhs = _ragged_to_dense(rhs, sizes, rhs_ragged, r_prefix, lead)
    return dot(dense_lhs, dense_rhs, dimension_numbers=((up(lc), up(rc)), ([0] + up(lb), [0] + up(rb))), **params)


per_device("ragged_dot_general")(functools.partial(_ragged_dot, 0))
vectorized("ragged_dot_general")(functools.partial(_ragged_dot, 1))
