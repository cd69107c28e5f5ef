"""The per-device rules: what each JAX primitive computes on one device's block (and on every device's blocks at
once), in NumPy, by family: the ``_numpy_rules`` modules (arithmetic, reductions, structure and indexing,
conversions), linear algebra (``_linalg``), special functions (``_special``), random bits (``_prng``),
windowed reductions and convolutions (``_windows``), control flow (``_control_flow``), callbacks (``_callbacks``)
and collectives (``_collective_rules``). Each registers into :mod:`spmdsim.jax.evaluation._registry`; they import
the evaluation layer and below, never the compiled form, the integration or the tools."""
