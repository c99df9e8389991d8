"""What `mla-fuse verify` costs per profile: wall time, CPU time, and the seconds of the property
modules that run explicit examples in every profile (deployments, interactions, real sizes), read
from the run's ``outcomes.jsonl`` (not a test, not in CI; nothing here is asserted).

Each repeat is one fresh ``mla-fuse verify --impl IMPL --profile P -n auto`` in a new report
directory; the row records the 1-minute load average before it starts (a figure taken at a load
above 1 is not an idle figure: say so where it is quoted), wall seconds, the CPU seconds of the
command and its children (``resource.getrusage(RUSAGE_CHILDREN)``), verify's exit status, the
tests run, and per property module the summed test durations (pytest's ``call`` phase, summed
over the xdist workers, so it is CPU-bound time of the module, not wall).

    python benchmarks/bench_verify.py --profile dev ci --repeat 3          # rows to results/verify.jsonl
    python benchmarks/bench_verify.py --report                              # medians per profile
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

RESULTS = pathlib.Path(__file__).parent / "results" / "verify.jsonl"
MODULES = ("test_deployments", "test_interactions", "test_real_sizes")


def module_seconds(outcomes: pathlib.Path) -> dict[str, float]:
    """Summed test durations per property module (``properties/test_<name>.py`` -> ``test_<name>``)."""
    seconds: dict[str, float] = collections.defaultdict(float)
    for line in outcomes.read_text().splitlines():
        record = json.loads(line)
        module = pathlib.PurePath(record["nodeid"].partition("::")[0]).stem
        seconds[module] += float(record.get("duration") or 0.0)
    return {name: round(value, 1) for name, value in sorted(seconds.items())}


def run_once(impl: str, profile: str) -> dict:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as directory:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "mla_fuse_conformance", "verify", "--impl", impl,
                                 "--profile", profile, "--report-dir", directory, "-n", "auto"],
                                cwd=directory, capture_output=True, text=True,
                                env={k: v for k, v in os.environ.items() if k != "CI"})
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        outcomes = pathlib.Path(directory) / "outcomes.jsonl"
        per_module = module_seconds(outcomes) if outcomes.exists() else {}
        tests = len(outcomes.read_text().splitlines()) if outcomes.exists() else 0
    return dict(impl=impl, profile=profile, load_before=round(load, 2), wall_s=round(wall, 1),
                cpu_s=round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
                exit_code=result.returncode, tests=tests, modules=per_module, cpus=os.cpu_count(),
                machine=platform.processor() or platform.machine(), time=time.time())


def report() -> None:
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines()] if RESULTS.exists() else []
    groups = collections.defaultdict(list)
    for row in rows:
        groups[(row["impl"], row["profile"])].append(row)
    for (impl, profile), runs in sorted(groups.items()):
        walls = [r["wall_s"] for r in runs]
        modules = {m: statistics.median(r["modules"].get(m, 0.0) for r in runs) for m in MODULES}
        print(f"{impl} {profile}: median wall {statistics.median(walls):.0f} s of {len(runs)} "
              f"(each {', '.join(f'{w:.0f}' for w in walls)}; load before {', '.join(str(r['load_before']) for r in runs)}), "
              f"median CPU {statistics.median(r['cpu_s'] for r in runs):.0f} s, tests {runs[-1]['tests']}, "
              + ", ".join(f"{m} {s:.0f} s" for m, s in modules.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="triton")
    parser.add_argument("--profile", nargs="+", default=["dev", "ci"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--report", action="store_true", help="print the medians of the recorded rows")
    args = parser.parse_args()
    if args.report:
        report()
        return
    RESULTS.parent.mkdir(exist_ok=True)
    for _ in range(args.repeat):
        for profile in args.profile:  # alternated, so load from other users falls on each alike
            row = run_once(args.impl, profile)
            print(json.dumps(row), flush=True)
            with RESULTS.open("a") as out:
                out.write(json.dumps(row) + "\n")
    report()


if __name__ == "__main__":
    main()
