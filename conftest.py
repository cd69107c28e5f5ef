"""The whole suite's one set-up shared by tests/ and conformance/: JAX's persistent compilation cache, in a
directory of each pytest process's own (each xdist worker's), so that a program XLA:CPU has compiled once is read
back, not compiled again: eager shard_map compiles the same small programs case after case
(conformance/test_shard_map.py and test_collectives.py on 2 workers: 262 s without, 173 s with). A hit is the
executable XLA compiled in this process on this CPU, so no result depends on the cache; JAX writes no program with
host callbacks into it. One directory per process: no process reads an entry another is still writing. The processes
that tests start compile without it (one directory for the whole run would need JAX's file-locked mode, the only
one safe across processes, which lists the directory at each write: slower, measured in docs/getting_started.md).
A run with its own JAX_COMPILATION_CACHE_DIR keeps that."""
import shutil
import sys
import tempfile


def pytest_configure(config):
    jax = sys.modules.get("jax")  # imported by the conftest files (conformance/ sets its devices first)
    if jax is None or jax.config.jax_compilation_cache_dir:
        return
    directory = tempfile.mkdtemp(prefix="spmdsim-test-jax-cache-")
    config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
