"""The conformance map: failing cells per failing property, declared limits checked, known failures."""
