"""The ``mla-fuse`` commands, one room each, ``cli.py`` the entry of each (lowest first; a room imports
only rooms below it, ``tests/test_layering.py``):

* ``conformance_map/``: after the properties, each failing property's cells (diagnosis, refinement),
  the declared limits' checks, the baseline and known failures, cell identity;
* ``repro/``: ``mla-fuse repro`` and the standalone reproducer written per failing cell;
* ``report/``: report.json, report.html, summary.md, and ``mla-fuse report`` that rewrites them;
* ``progress.py``: the progress lines of the console (a pytest plugin in verify's child too);
* ``compare/``, ``adapter/``, ``fuzz/``: ``mla-fuse compare``, ``adapter --template``, ``fuzz`` and ``db``;
* ``verify/``: ``mla-fuse verify``, which runs the properties then the rooms above;
* ``cli.py``: the ``mla-fuse`` parser, one subcommand per room.
"""
