"""The NumPy front end's machinery: ``spmdsim.pmap`` (``_pmap``) and ``spmdsim.shard_map`` (``_shard_map``), which
split the arguments over the virtual devices, run the function on each and put the results together. Their
public faces are :mod:`spmdsim` and :mod:`spmdsim.lax` (the collectives a mapped function calls) and
:mod:`spmdsim.multihost`, beside this package. Imports the runtime and the primitives, never JAX, the hosts or
the tools."""
