"""The tooling around the product: the sandbox provider, the fault drills, the benchmarks and the demo agent's
scenarios, with the management commands that run them. Clients of the domain (over HTTP or through its services);
nothing in the domain imports them (tests/test_layout.py checks the direction)."""
