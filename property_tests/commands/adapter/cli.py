"""``mla-fuse adapter --template``: write the skeleton (``adapter/template.py``) to a file or stdout."""

from __future__ import annotations

import pathlib
import sys

from mla_fuse_conformance.commands.adapter.template import template
from mla_fuse_conformance.declarations.operations import OPERATIONS


def write(text: str, out: pathlib.Path | None) -> int:
    """``text`` to ``out`` (never over an existing file), or to stdout."""
    if out is None:
        sys.stdout.write(text)
        return 0
    try:
        with open(out, "x", encoding="utf-8") as file:
            file.write(text)
    except FileExistsError:
        print(f"mla-fuse adapter: --out {out} exists; not overwritten (remove it or choose another file)",
              file=sys.stderr)
        return 2
    print(f"mla-fuse adapter: wrote {out}", file=sys.stderr)
    return 0


def add_adapter(commands) -> None:
    adapter = commands.add_parser("adapter", help="write an adapter skeleton with the contract's signatures")
    adapter.add_argument("--template", action="store_true", required=True,
                         help="write the skeleton: the declarations and one method per operation")
    adapter.add_argument("--op", action="append", choices=OPERATIONS, metavar="OP", dest="operations",
                         help=f"an operation to include (repeatable; default all five: {', '.join(OPERATIONS)})")
    adapter.add_argument("--out", type=pathlib.Path, default=None,
                         help="the file to write (default: stdout); an existing file is not overwritten")
    adapter.add_argument("--name", default="my-kernels", help="the implementation's name; the class is named "
                                                              "after it (default: my-kernels -> MyKernels)")

    def run(args) -> int:
        operations = tuple(op for op in OPERATIONS if op in (args.operations or OPERATIONS))
        module = args.out.stem if args.out is not None else "my_adapter"
        return write(template(operations, args.name, module), args.out)

    adapter.set_defaults(run=run)
