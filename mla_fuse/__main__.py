"""Command line: ``python -m mla_fuse {verify,repro,bench}`` (also installed as ``mla-fuse``)."""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys

from mla_fuse.verify import REPO_ROOT, run_verify


def _default_profile() -> str:
    return "ci" if os.environ.get("CI") == "true" else "dev"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mla_fuse", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    verify = commands.add_parser("verify", help="run the conformance suite and print a per-operation report")
    verify.add_argument("--impl", default=None, help="SPEC: registered name or module.path:attr (default: "
                                                     "$MLA_FUSE_IMPL, then triton)")
    verify.add_argument("--profile", default=None, help="hypothesis profile: dev, ci, gpu, nightly "
                                                        "(default: ci under CI=true, else dev)")
    verify.add_argument("--report-dir", type=pathlib.Path, default=REPO_ROOT / ".mla_fuse_reports",
                        help="where report.json, junit.xml and the metric lines go")
    verify.add_argument("-n", "--workers", default=None, help="pytest-xdist workers (e.g. auto)")
    verify.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")

    repro = commands.add_parser("repro", help="replay a saved failing case without hypothesis")
    repro.add_argument("file", type=pathlib.Path)
    repro.add_argument("--impl", default=None, help="override the implementation recorded in the file")

    bench = commands.add_parser("bench", help="time the fused op against the unfused pair and the reference")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for benchmarks/bench_mla.py")

    args = parser.parse_args(argv)
    if args.command == "verify":
        return run_verify(args.impl, args.profile or _default_profile(), args.report_dir, args.workers,
                          args.pytest_args)
    if args.command == "repro":
        # The replay lives in the suite, which mla_fuse never imports: run it as a module.
        command = [sys.executable, "-m", "property_tests.repro", str(args.file.resolve()),
                   *(["--impl", args.impl] if args.impl else [])]
        return subprocess.call(command, cwd=REPO_ROOT)
    command = [sys.executable, str(REPO_ROOT / "benchmarks" / "bench_mla.py"), *args.bench_args]
    return subprocess.call(command, cwd=REPO_ROOT)


if __name__ == "__main__":
    sys.exit(main())
