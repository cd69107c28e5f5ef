"""The per-device rules: what each JAX primitive computes on one device's block (and on every device's blocks at
once), in NumPy, by family: the helpers every rule uses and the elementwise conversions (``_elementwise``),
arithmetic (``_arithmetic``), shapes, gather and scatter (``_structural``), reductions and sorting
(``_reductions``), ``dot_general`` (``_dot``), linear algebra (``_linalg``), special functions (``_special``),
random bits (``_prng``), windowed reductions and convolutions (``_windows``), control flow (``_control_flow``),
callbacks and ``jax.debug.print`` (``_callbacks``) and collectives (``_collective_rules``). Each registers into
:mod:`spmdsim.jax.evaluation._registry`; they import the evaluation layer and below, never the compiled form,
the integration or the tools."""
