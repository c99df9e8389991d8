"""Re-check the engine sources the suite's declarations cite against unpacked engine wheels.

Every ``path:line`` of ``declarations/engine_layouts.py`` (LMDeploy's from ``declarations/lmdeploy_layouts.py``)
and ``declarations/deployments.py`` must name an existing line of the pinned version (``ci/engine_pins.sh``;
LMDeploy's, ``ci/third_party_wheels.sh``), and every call site
must still call the function it names (its name within 3 lines). Prints each cited line, so a
reader can see that a view or a setting is still where the entry says; exits 1 on a problem.

Usage, after unpacking the pinned wheels (Python files are enough) into DIR, one folder each:

    mkdir -p DIR && cd DIR
    pip download --no-deps vllm==0.33.0 sglang==0.5.23 flashinfer-python==0.7.2 lmdeploy==0.18.0
    for w in *.whl; do unzip -q -o "$w" '*.py' -d "${w%%-*}"; done
    python ci/check_engine_sources.py DIR

A path ``vllm/...`` is looked up as ``DIR/vllm/...`` or ``DIR/*/vllm/...``.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

from mla_fuse_conformance.declarations.deployments import DEPLOYMENTS
from mla_fuse_conformance.declarations.engine_layouts import LAYOUTS

WINDOW = 3  # lines either side of a call site where its function's name must appear


def find(root: pathlib.Path, path: str) -> pathlib.Path | None:
    candidates = [root / path, *sorted(root.glob(f"*/{path}"))]
    return next((candidate for candidate in candidates if candidate.is_file()), None)


def called_name(function: str) -> str:
    """The name a call site must show: the last dotted part of the function's first name."""
    return re.match(r"[\w.]+", function).group(0).split(".")[-1]


def check(root: pathlib.Path, source: str, name: str = "") -> tuple[str, str]:
    """(problem or "", the cited line) for one ``path:line``; ``name`` must appear near the line."""
    path, line = source.rsplit(":", 1)
    found = find(root, path)
    if found is None:
        return f"{source}: no such file under {root}", ""
    lines = found.read_text(encoding="utf-8", errors="replace").splitlines()
    number = int(line)
    if not 1 <= number <= len(lines):
        return f"{source}: the file has {len(lines)} lines", ""
    text = lines[number - 1].strip()
    nearby = lines[max(number - 1 - WINDOW, 0):number + WINDOW]
    if name and not any(name in candidate for candidate in nearby):
        return f"{source}: {name!r} is not within {WINDOW} lines ({text!r})", text
    return "", text


def citations() -> list[tuple[str, str, str]]:
    """(who cites it, path:line, the name that must appear there or "")."""
    cited = []
    for layout in LAYOUTS.values():
        cited += [(f"{layout.name} {call.operation}", call.source, called_name(call.function))
                  for call in layout.calls]
        cited += [(f"{layout.name} {view.argument}", view.source, "") for view in layout.views]
        cited += [(f"{layout.name} cache", layout.cache.source, "")]
        cited += [(layout.name, source, "") for source in layout.sources]
    for deployment in DEPLOYMENTS:
        cited += [(deployment.name, source, "") for source in deployment.sources]
    return cited


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=pathlib.Path, help="folder holding the unpacked engine sources")
    root = parser.parse_args(argv).root
    if not root.is_dir():
        parser.error(f"root: {root} is not a folder")
    problems = []
    for who, source, name in citations():
        problem, text = check(root, source, name)
        print(f"{'FAIL' if problem else 'ok  '} {who}: {source}: {text}")
        if problem:
            problems.append(f"{who}: {problem}")
    print(f"\n{len(citations())} citations, {len(problems)} problems")
    print("\n".join(problems), file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
