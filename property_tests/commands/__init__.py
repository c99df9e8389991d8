"""The mla-fuse commands: verify (with its conformance map), repro, fuzz, db."""
