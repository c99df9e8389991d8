"""``mla-fuse compare``: one set of cases on several implementations, side by side."""
