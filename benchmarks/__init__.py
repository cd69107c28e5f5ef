"""spmdsim benchmarks, side by side with jax.pmap: ``python -m benchmarks`` (not collected by pytest)."""
