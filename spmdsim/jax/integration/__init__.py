"""Placing spmdsim inside JAX: ``spmdsim.jax.pmap`` and ``shard_map`` as JAX primitives (``_api``, ``_map``: the
primitive and its simulation, ``_map_rules``: its transformation rules, ``_map_lowering``: its lowering under jit,
``_shard_map``, ``_specs``), eager shard_map (``_eager``), putting results back as JAX arrays on JAX's devices
(``_placement``), and ``patched_jax``, which swaps them into an unmodified program (``_patch``). Imports every
layer below (the front end, evaluation, compiled form, rules); only the tools import it."""
