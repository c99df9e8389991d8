"""docs/GPU.md's table of the GPU runner's targets, regenerated from the reports of `ci/gpu.sh` runs.

    python3 ci/gpu_tables.py [RUN ...] [--write docs/GPU.md]

Each RUN is a directory laid out as `ci/gpu.sh` leaves `reports/`: `gpu/versions.txt` (the machine and
versions), `gpu/steps.tsv` (each step's verdict and seconds; a step run again: its last line),
`gpu/<step>.log` (what the step printed)
and `bench/bench_mla.json` (`benchmarks/bench_ops.py --out reports/bench`); any part may be missing.
Keep a run's reports as `benchmarks/results/gpu-<date>/` (`cp -r reports/gpu reports/bench DIR`) and
name the runs oldest first: each target's row takes the newest run that measured it and names that
run, so a job that ran only some steps updates only their rows. A target no run measured reads "not
yet measured on a GPU"; a log that is there but holds no figure this script can read says so (a
changed output format shows, it is not taken for a missing measurement). Runs whose versions say
"device none" (a CPU) are refused: the table is of GPU figures.

The targets are issue 32's (docs/GPU.md): host microseconds of an eager call at T=1, H=128 (dispatch
step), the fused op against the unfused pair under CUDA-graph replay for T <= 256 and against a copy
of the same bytes for T >= 16384 (bench step), the whole `gpu` profile on an empty Triton cache and a
same-seed rerun on that cache (verify and keys steps), the compile path on CUDA (compile step) and the
reproducers' CUDA path (repro step). The launch configurations the tiles step found follow the table.

`--write FILE` replaces what lies between the two marker lines in FILE (`BEGIN` and `END` below) and
writes nothing when FILE lacks them; without it the table is printed. Standard library only: it runs
where the reports were fetched to, with or without torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

BEGIN = "<!-- ci/gpu_tables.py: begin (generated; edit the script, not this part) -->"
END = "<!-- ci/gpu_tables.py: end -->"
NOT_MEASURED = "not yet measured on a GPU"
OP = "concat_and_cache_mla_rope_fused"


class Run:
    """One run's reports (a directory laid out as ``ci/gpu.sh``'s ``reports/``)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.name = os.path.basename(os.path.normpath(directory))
        self.versions = self._read("gpu", "versions.txt").strip()
        self.bench = None
        text = self._read("bench", "bench_mla.json")
        if text:
            self.bench = json.loads(text)
        self.steps = {}  # a step's last line: the run its log is of (ci/gpu.sh appends, and rewrites the log)
        for line in self._read("gpu", "steps.tsv").splitlines():
            step, verdict, seconds, limit = line.split("\t")
            self.steps[step] = (verdict, int(seconds), int(limit))
        if re.search(r"\bdevice none\b", self.versions) or (self.bench and self.bench.get("device", "").startswith("cpu")):
            raise SystemExit(f"{directory}: its reports are of a run without a GPU ({self.versions or 'bench: cpu'})")

    def _read(self, *parts: str) -> str:
        path = os.path.join(self.directory, *parts)
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return f.read()

    def log(self, step: str) -> str | None:
        """What the step printed, or None when the run has no log of it."""
        path = os.path.join(self.directory, "gpu", f"{step}.log")
        return self._read("gpu", f"{step}.log") if os.path.exists(path) else None

    def label(self) -> str:
        """The run's name, machine and versions (``versions.txt``: ``torch X triton Y ... device NAME``;
        without it, the bench JSON's)."""
        if self.versions:
            device = re.search(r"\bdevice (.+)$", self.versions)
            found = {name: re.search(rf"\b{name} (\S+)", self.versions) for name in ("torch", "triton")}
            parts = [device.group(1) if device else "device unknown"]
            parts += [f"{name} {match.group(1)}" for name, match in found.items() if match]
        elif self.bench:
            versions = self.bench.get("versions", {})
            parts = [self.bench.get("device", "device unknown")]
            parts += [f"{name} {versions[name]}" for name in ("torch", "triton") if name in versions]
        else:
            parts = ["device unknown"]
        return f"{self.name} ({', '.join(parts)})"


# ---------------------------------------------------------------- one reader per target: (figure, met) or None


def _dispatch(run: Run, call: str, wanted: float):
    log = run.log("dispatch")
    if log is None:
        return None
    found = re.search(rf"^summary: {re.escape(call)}: ([\d.]+) us host CPU, ([\d.]+) us wall", log, re.M)
    if not found:
        return f"no figure in {run.name}/gpu/dispatch.log", None
    host = float(found.group(1))
    return f"{host:.1f} us host CPU ({float(found.group(2)):.1f} us wall)", host <= wanted


def _graph_rows(run: Run) -> dict | None:
    if not run.bench:
        return None
    return {(r["impl"], r["heads"], r["kv_cache_dtype"], r["tokens"]): r for r in run.bench["rows"]
            if r.get("graph_us")}


def _fused_rows(run: Run, which: str, tokens, value, spec: str, unit: str, wanted: float):
    """Over the bench's graph-timed rows of the fused op whose T passes ``tokens`` (``which`` says so):
    ``value(rows, (H, cache, T), row)`` of each (None: the row has no such figure); the lowest and
    highest, the lowest row, and whether the lowest reaches ``wanted``."""
    rows = _graph_rows(run)
    if rows is None:
        return None
    values = {}
    for (impl, h, cache, t), row in rows.items():
        found = value(rows, (h, cache, t), row) if impl == "fused" and tokens(t) else None
        if found is not None:
            values[h, cache, t] = found
    if not values:
        return f"no graph rows for {which} in {run.name}/bench/bench_mla.json", None
    (h, cache, t), low = min(values.items(), key=lambda item: item[1])
    return (f"{low:{spec}}-{max(values.values()):{spec}}{unit} over {len(values)} rows; lowest H={h} {cache} T={t}",
            low >= wanted)


def _fused_over_unfused(run: Run):
    def ratio(rows, key, fused):
        unfused = rows.get(("unfused", *key))
        return None if unfused is None else unfused["graph_us"] / fused["graph_us"]

    return _fused_rows(run, "T <= 256", lambda t: t <= 256, ratio, ".2f", "x", 1.3)


def _share_of_copy(run: Run):
    return _fused_rows(run, "T >= 16384", lambda t: t >= 16384,
                       lambda rows, key, fused: fused["copy_us"] / fused["graph_us"] if fused.get("copy_us") else None,
                       ".0%", "", 0.85)


def _cold_verify(run: Run, wanted_seconds: int = 480):
    log = run.log("verify")
    if log is None:
        return None
    found = re.search(r"^summary: verify --profile gpu exit (\d+); (\d+) kernels compiled \((\d+) in ", log, re.M)
    verdict, seconds, limit = run.steps.get("verify", (None, None, None))
    if seconds is None:
        return f"no steps.tsv in {run.name}/gpu (the step's time)", None
    if not found:  # stopped by its limit before its summary line (on whatever cache it had)
        return f"not finished: {verdict} after {seconds} s (limit {limit} s)", False
    status, compiled, cached = map(int, found.groups())
    if compiled != cached:  # kernels were cached before it: not a cold run, so not this target's figure
        return None
    figure = (f"{seconds} s, exit {status} ({'conforms' if status == 0 else 'a property failed'}), "
              f"{compiled} kernels compiled")
    return figure, seconds <= wanted_seconds and status in (0, 1)


def _same_seed_rerun(run: Run):
    log = run.log("keys")
    if log is None:
        return None
    counts = dict(re.findall(r"^summary: .*, (first|again) run: (\d+) kernels in the cache", log, re.M))
    if "again" not in counts:
        return f"no rerun in {run.name}/gpu/keys.log", None
    first, again = int(counts["first"]), int(counts["again"])
    return f"{first} kernels on the empty cache, {again - first} more on the rerun", again == first


def _compile_path(run: Run):
    log = run.log("compile")
    if log is None:
        return None
    checks = re.findall(r"^  (\S.*?)\s+(ok|FAILED|skipped)\s+[\d.]+s", log, re.M)
    if not checks:
        return f"no check table in {run.name}/gpu/compile.log", None
    failed = [name for name, status in checks if status == "FAILED"]
    tests = re.findall(r"^=* ?(\d+ (?:passed|failed).*?) in [\d.]+s", log, re.M)
    figure = (f"{len(checks) - len(failed)} of {len(checks)} checks ok"
              + (f" (failed: {', '.join(failed)})" if failed else "")
              + (f"; pass tests: {tests[-1]}" if tests else ""))
    return figure, not failed and not (tests and re.search(r"\b\d+ failed", tests[-1]))


def _reproducers(run: Run):
    log = run.log("repro")
    if log is None:
        return None
    found = re.search(r"^summary: (\d+) reproducers, (\d+) reproduced and passed with --reference, (\d+) with "
                      r"DEVICE='cuda'", log, re.M)
    if not found:
        return f"no summary in {run.name}/gpu/repro.log", None
    made, reproduced, cuda = map(int, found.groups())
    return f"{made} reproducers, {reproduced} reproduced, {cuda} on CUDA", made > 0 and made == reproduced == cuda


TARGETS = [
    ("eager `torch.ops` call, T=1, H=128", "<= 15 us host", lambda run: _dispatch(run, f"torch.ops.mla_fuse.{OP}", 15)),
    ("eager `mla_fuse.ops` call, T=1, H=128", "<= 20 us host", lambda run: _dispatch(run, f"mla_fuse.ops.{OP}", 20)),
    ("fused over the unfused pair, CUDA graphs, T <= 256", ">= 1.3x every row", _fused_over_unfused),
    ("fused, share of a same-byte copy, CUDA graphs, T >= 16384", ">= 85% every row", _share_of_copy),
    ("`mla-fuse verify --profile gpu`, whole, empty Triton cache", "<= 8 min", _cold_verify),
    ("the same seed again on that cache (keys step)", "no new kernel", _same_seed_rerun),
    ("compile path on CUDA Inductor (`ci/gpu_compile_check.py`, pass tests)", "every check ok", _compile_path),
    ("reproducers' CUDA path (a planted bug)", "each reproduces on CUDA", _reproducers),
]


def table(runs: list[Run]) -> str:
    """The markdown of the targets' table (newest run first for each row) and the tiles step's lines."""
    lines = ["| target | wanted | measured | verdict | run |", "|---|---|---|---|---|"]
    for target, wanted, read in TARGETS:
        for run in reversed(runs):
            found = read(run)
            if found is not None:
                figure, met = found
                verdict = {True: "met", False: "**not met**", None: "-"}[met]
                lines.append(f"| {target} | {wanted} | {figure} | {verdict} | {run.label()} |")
                break
        else:
            lines.append(f"| {target} | {wanted} | {NOT_MEASURED} | - | - |")
    tiles = next(((run, log) for run in reversed(runs) if (log := run.log("tiles")) is not None), None)
    if tiles is None:
        lines += ["", f"Launch configurations (tiles step): {NOT_MEASURED}."]
    else:
        run, log = tiles
        found = re.findall(r"^summary: (.*)$", log, re.M)
        lines += ["", f"Launch configurations (tiles step, {run.label()}; the configuration `config` picks, then the "
                      f"best of the grid):", ""]
        lines += [f"- {line}" for line in found] or [f"- no summary line in {run.name}/gpu/tiles.log"]
    return "\n".join(lines)


def write(path: str, text: str) -> None:
    with open(path) as f:
        document = f.read()
    if document.count(BEGIN) != 1 or document.count(END) != 1 or document.index(BEGIN) > document.index(END):
        raise SystemExit(f"{path}: needs one line {BEGIN!r} and, after it, one line {END!r}; nothing written")
    head, _, rest = document.partition(BEGIN)
    _, _, tail = rest.partition(END)
    with open(path, "w") as f:
        f.write(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", default=["reports"],
                        help="reports directories of ci/gpu.sh runs, oldest first (default: reports)")
    parser.add_argument("--write", metavar="FILE", help="replace the generated part of FILE (docs/GPU.md)")
    options = parser.parse_args(argv)
    missing = [run for run in options.runs if not os.path.isdir(run)]
    if missing:
        parser.error(f"runs: no such directory: {', '.join(missing)}")
    text = table([Run(run) for run in options.runs])
    if options.write:
        write(options.write, text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
