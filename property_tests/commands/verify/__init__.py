"""``mla-fuse verify``: the properties, then the map and the report (``run.py``)."""
