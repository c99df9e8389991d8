"""``mla-fuse adapter --template``: the skeleton of an adapter (``template.py``) and its command."""
