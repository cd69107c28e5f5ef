from conformance.jax_suite.suite import main

raise SystemExit(main())
