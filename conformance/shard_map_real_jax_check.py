"""Run every shard_map case against real JAX (jax.shard_map on 8 forced CPU devices) and print a table:
case id -> the result's shapes/dtypes, or the exception class. A case passes when JAX behaves as the case
says: it returns a result (``raises is None``), equal to ``expected(*args)`` where the case has one (the
NumPy reference model of conformance/shard_map_reference.py), or raises exactly the class named in
``raises`` with ``phrase`` in its message. Exits with status 1 if any case does not.

    python conformance/shard_map_real_jax_check.py             # all cases, the table and a summary
    python conformance/shard_map_real_jax_check.py -k psum     # ids containing "psum"
    python conformance/shard_map_real_jax_check.py --quiet     # only the failures and the summary
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np

from conformance.shard_map_cases import CASES, areas
from conformance.shard_map_harness import call, jax_api


def describe(result) -> str:
    leaves = jax.tree_util.tree_leaves(result)
    parts = [f"{np.asarray(leaf).dtype}{list(np.shape(leaf))}" for leaf in leaves]
    text = ", ".join(parts) if len(parts) <= 3 else ", ".join(parts[:3]) + f", ... ({len(parts)} leaves)"
    return text or "(no leaves)"


def differs_from(result, expected) -> str:
    """'' when JAX's ``result`` equals the reference ``expected`` (same structure, shapes and dtypes; equal
    values: exact for integers and bools, 1e-6 relative for floats), else what differs."""
    r_leaves, r_tree = jax.tree_util.tree_flatten(result)
    e_leaves, e_tree = jax.tree_util.tree_flatten(expected)
    if r_tree != e_tree:
        return f"structure {r_tree} != reference {e_tree}"
    for r, e in zip(r_leaves, e_leaves):
        r, e = np.asarray(r), np.asarray(e)
        if r.shape != e.shape or r.dtype != e.dtype:
            return f"{r.dtype}{list(r.shape)} != reference {e.dtype}{list(e.shape)}"
        if r.dtype.kind in "biu":
            same = np.array_equal(r, e)
        else:
            wide = np.complex128 if r.dtype.kind == "c" else np.float64
            same = np.allclose(r.astype(wide), e.astype(wide), rtol=1e-6, atol=0, equal_nan=True)
        if not same:
            return f"values differ from the reference (first: {r.ravel()[:6]} vs {e.ravel()[:6]})"
    return ""


def check(case, api) -> tuple[bool, str]:
    result, error = call(api, case)
    if error is None:
        if case.raises is not None:
            return False, f"returned {describe(result)}; expected {case.raises}"
        if case.expected is not None:
            problem = differs_from(result, case.expected(*case.args))
            if problem:
                return False, f"returned {describe(result)}, but {problem}"
            return True, describe(result) + "  (= reference)"
        return True, describe(result)
    name = type(error).__name__
    first_line = (str(error).strip().splitlines() or [""])[0][:90]
    if case.raises is None:
        return False, f"raised {name}: {first_line}"
    if name != case.raises:
        return False, f"raised {name} (expected {case.raises}): {first_line}"
    if case.phrase and case.phrase not in str(error):
        return False, f"raised {name} without the phrase {case.phrase!r}: {first_line}"
    return True, f"raises {name}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="only case ids containing this text")
    parser.add_argument("--quiet", action="store_true", help="print only failures and the summary")
    args = parser.parse_args(argv)
    assert jax.device_count() == 8, jax.devices()
    api = jax_api()
    selected = {cid: c for cid, c in CASES.items() if args.k in cid}
    failures, start = [], time.perf_counter()
    width = max(len(cid) for cid in selected) if selected else 10
    print(f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} devices, "
          f"{len(selected)} of {len(CASES)} cases")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for cid, case in selected.items():
            ok, text = check(case, api)
            if not ok:
                failures.append(cid)
            if not args.quiet or not ok:
                print(f"{'ok  ' if ok else 'FAIL'} {cid:<{width}}  {text}")
    print(f"\n{len(selected) - len(failures)} of {len(selected)} cases as intended, {len(failures)} not "
          f"({time.perf_counter() - start:.1f} s)")
    counts = areas()
    print("cases per area: " + ", ".join(f"{a} {n}" for a, n in sorted(counts.items())))
    jax_only = sum("numpy" not in c.front_ends for c in CASES.values())
    print(f"total {len(CASES)}: {len(CASES) - jax_only} for every front end, {jax_only} for the JAX front ends "
          f"only, {sum(c.raises is not None for c in CASES.values())} expected errors, "
          f"{sum(c.expected is not None and c.raises is None for c in CASES.values())} checked against the "
          f"NumPy reference, {sum(c.expected is not None and c.raises is not None for c in CASES.values())} "
          f"with a documented result XLA:CPU cannot compute")
    for cid in failures:
        print(f"  not as intended: {cid}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
