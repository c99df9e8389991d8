"""``python -m mla_fuse``: the commands live in the conformance suite, not in the product."""

import sys

sys.exit("mla_fuse is the product (kernels, ops, layers, passes); the commands verify, repro and bench belong to "
         "the conformance suite: run `mla-fuse verify` or `python -m mla_fuse_conformance verify` "
         "(installed with mla_fuse[test]).")
