"""``mla-fuse fuzz`` (a HypoFuzz campaign) and ``mla-fuse db``."""
