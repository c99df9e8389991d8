"""Property-based verification of mla_fuse implementations against the float64 reference.

See README.md. The test modules hold the properties; ``strategies`` draws cases, ``cases``
rebuilds their tensors from a seed, ``oracle`` predicts the memory after each operation,
``comparisons`` holds the CONTRACT §5 rules and ``repro`` replays saved failures.
"""
