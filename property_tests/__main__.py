"""``python -m mla_fuse_conformance`` is ``mla-fuse``."""

import sys

from mla_fuse_conformance.commands.cli import main

sys.exit(main())
