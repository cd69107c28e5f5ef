"""JAX 0.10's own pmap and shard_map tests run on JAX and on spmdsim (issue 25). See README.md; run with
``python -m conformance.jax_suite``."""
