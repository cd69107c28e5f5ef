# This folder is a tool, not tests: the project's pytest run (testpaths = tests, conformance) collects nothing
# here, nor in results/ (the harness's records and logs). JAX's test files are extracted outside the
# repository (--workdir, default /tmp/spmdsim-jax-suite-UID-JAXVERSION).
collect_ignore_glob = ["*"]
