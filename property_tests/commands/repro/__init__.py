"""``mla-fuse repro`` and the standalone reproducer written per failing cell (``script.py``)."""
