"""Property-based verification of mla_fuse implementations against the float64 reference.

See README.md. Laid out by role, lowest layer first: ``declarations`` (operations, dtypes, property
modules), ``settings``, ``cases`` (what an example is), ``contract`` (what an implementation
declares), ``judging`` (what is right), ``running`` (running examples), then ``properties``,
``mutants``, ``adapters``, and ``commands``; ``plugin`` is the pytest plugin.
"""
