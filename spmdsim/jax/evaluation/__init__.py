"""Evaluating a jaxpr with NumPy, one equation at a time: the interpreter loop and its two executors, per device
and vectorized (``_interpreter``), the rule tables it looks primitives up in (``_registry``), JAX's dtypes as
NumPy's (``_dtypes``), a collective's user-facing name (``_names``), XLA:CPU's multiply-add contraction of a
jaxpr (``_contraction``), evaluating a primitive through its lowering (``_lowered``), values unreduced over
mesh axes (``_unreduced``), and what a jaxpr binds, sub-jaxprs included (``_jaxprs``). Imports the NumPy core,
:mod:`spmdsim.jax._internals` and the numerics; the rules register into it and call it for nested jaxprs."""
