"""``python -m mla_fuse``: the commands live in the conformance suite, not in the product."""

import sys

sys.exit("mla_fuse is the product (kernels, ops, layers, passes); the commands (verify, repro, adapter, fuzz, db) "
         "belong to the conformance suite: run `mla-fuse verify` or `python -m mla_fuse_conformance verify` "
         "(installed with mla_fuse[test]); the benchmarks are the scripts in the repository's benchmarks/.")
