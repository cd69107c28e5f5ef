"""Where spmdsim deliberately differs from JAX 0.10.2: case id (or fnmatch pattern) -> the one reason.

Every entry is used as a strict xfail (a case listed here that starts to agree fails the suite, so the list
stays true); nothing is skipped silently. The README's table of differences explains each decision.
"""

KNOWN_DIFFERENCES = {
    # JAX 0.10 divides every group's sum by len(axis_index_groups[0]); spmdsim by the device's own group.
    "groups-uneven-pmean-*": "pmean with uneven groups: JAX divides by len(groups[0])",
    # JAX's lowering silently skips all_to_all when the first group has one member; spmdsim rejects uneven
    # groups for all_to_all with a ValueError in the NumPy front end.
    "groups-uneven-all_to_all-n[34]": "all_to_all whose first group has one member: JAX returns the input "
                                      "unchanged; the NumPy front end rejects uneven groups (ValueError)",
    # XLA:CPU has no all-reduce for complex max/min (UNIMPLEMENTED at run time); spmdsim computes them with
    # lax.max's lexicographic order (real part, then imaginary part).
    "pmax-complex64-*": "pmax of complex: XLA:CPU UNIMPLEMENTED; spmdsim computes the lexicographic max",
    "pmin-complex64-*": "pmin of complex: XLA:CPU UNIMPLEMENTED; spmdsim computes the lexicographic min",
    # Negative axes: JAX 0.10 mis-shards negative in_axes / out_axes; spmdsim counts them from the end.
    "pmap-in_axes-negative": "negative in_axes: JAX 0.10 mis-shards; spmdsim counts from the end like vmap",
    "pmap-out_axes-negative": "negative out_axes: JAX 0.10 gives (8, 1) for -1; spmdsim counts from the end",
    # pbroadcast is GPU-only in JAX 0.10.
    "pbroadcast-cpu": "pbroadcast: JAX 0.10 has no CPU lowering; spmdsim implements it everywhere",
    # Nested pmap is rejected by JAX 0.10; spmdsim runs it with pmap(vmap) semantics.
    "nested-pmap": "nested pmap: unsupported in JAX 0.10 (mesh mismatch ValueError)",
    # JAX 0.10 fails all_gather over ('i', 'j') in pmap(vmap) with an AssertionError; spmdsim gathers.
    "two-axes-all_gather-both": "all_gather over ('i','j') in pmap(vmap): AssertionError in JAX 0.10",
    # Groups that do not cover the axis: JAX fails inside XLA (JaxRuntimeError); spmdsim raises ValueError.
    "error-groups-partial-cover": "groups covering part of the axis: JAX fails in XLA, spmdsim raises ValueError",
    # ppermute index >= axis size: JAX IndexError from a list lookup; same class, kept here for the message.
}

# Differences with one JAX release only (README's table says which): listed where that release is installed.
import jax  # noqa: E402

if jax.__version_info__ < (0, 11):
    # Negative scatter_dimension crashes JAX 0.10's lowering (fixed in 0.11: spmdsim agrees there).
    KNOWN_DIFFERENCES["psum_scatter-negative-dimension"] = ("negative scatter_dimension: JAX 0.10's lowering "
                                                            "raises; spmdsim computes it, as JAX 0.11 does")
