"""XLA:CPU's arithmetic in NumPy: which instruction set XLA:CPU compiles for (``_xla_cpu_isa``, ``_xla_cpu_probe``),
and the math library its kernels call, written to give its bits (``_xla_cpu_math``, ``_libm``). The bottom of the
JAX front end: imports the runtime's NumPy plumbing and :mod:`spmdsim.jax._internals` only."""
