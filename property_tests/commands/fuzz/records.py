"""What HypoFuzz recorded of an ``mla-fuse fuzz`` campaign: one ``PropertySummary`` per property
this campaign's workers ran (inputs, behaviours and fingerprints covered, when each worker first
failed, the failures stored), read from the reports, worker identities and failures HypoFuzz keeps
in the example database. HypoFuzz is imported inside the functions: ``mla-fuse`` starts without it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class PropertySummary:
    nodeid: str
    database_key: str  # hex: hypothesis keeps the property's failures under it (and HypoFuzz under key + suffixes)
    inputs: int = 0  # inputs run by this campaign's workers, all together
    behaviors: int = 0  # HypoFuzz behaviours covered (branches + events), best worker
    fingerprints: int = 0  # distinct sets of behaviours, best worker
    first_failure_at: list[int] = dataclasses.field(default_factory=list)  # per failing worker
    shrunk: bool = False  # a worker has finished shrinking its failure (HypoFuzz's "failed" phase)
    failures: list[str] = dataclasses.field(default_factory=list)  # stored in the database
    skipped: str | None = None
    replay: str | None = None  # outcome of the replay pass: passed, failed, skipped, "not run", or None (not replayed)
    replay_files: list[str] = dataclasses.field(default_factory=list)

    @property
    def verdict(self) -> str:
        """``FAIL``: the replay pass reproduced a failure; ``did not replay``: a worker failed on it but
        the replay of what it stored passed (or nothing was stored to replay); else ``skipped``,
        ``pass`` or ``not run``."""
        if self.replay == "failed":
            return "FAIL"
        if self.first_failure_at or self.failures:
            return "did not replay"
        if self.skipped:
            return "skipped"
        return "pass" if self.inputs else "not run"


def total_inputs(report) -> int:
    return sum(report.status_counts.values())


def inputs_to_first_failure(reports) -> int | None:
    """The inputs one worker had run when it first failed (HypoFuzz reports at the failure)."""
    from hypothesis.internal.conjecture.data import Status

    for report in sorted(reports, key=lambda r: r.elapsed_time):
        if report.status_counts[Status.INTERESTING]:
            return total_inputs(report)
    return None


def failure_message(observation, lines: int = 2) -> str:
    """The error's first lines (pytest's ``E`` lines of the traceback), else the exception line of a
    plain traceback, else HypoFuzz's reason; never empty."""
    traceback = (observation.metadata.traceback or "").splitlines()
    error = [line[1:].strip() for line in traceback if line.startswith("E ")]
    if not error:
        error = [line.strip() for line in traceback if line.strip() and not line.startswith((" ", "Traceback"))][-1:]
    return " ".join(error[:lines]) or observation.status_reason or "(HypoFuzz stored no error text)"


def is_skip(observation) -> bool:
    return observation.status_reason.startswith("Skipped ")


def stored_failures(fuzz_db, key: bytes) -> list:
    """Observations of the failures stored for ``key``: shrunk ones, else those still unshrunk."""
    from hypofuzz.database import FailureState

    for state in (FailureState.SHRUNK, FailureState.UNSHRUNK):
        found = [fuzz_db.failure_observations(state=state).fetch(key, choices)
                 for choices in fuzz_db.failures(state=state).fetch(key)]
        found = [observation for observation in found if observation is not None]
        if found:
            return found
    return []


@dataclasses.dataclass(frozen=True)
class CampaignWindow:
    started: float  # time.time()
    finished: float
    host: str
    pids: frozenset[int]


def campaign_workers(fuzz_db, uuids: set[str], window: CampaignWindow) -> set[str]:
    """The HypoFuzz worker uuids that ran on this host in one of this campaign's processes."""
    ours = set()
    for uuid in uuids:
        identity = fuzz_db.worker_identities.fetch(uuid.encode("ascii"))
        if identity is not None and identity.hostname == window.host and (
                not window.pids or identity.pid in window.pids):
            ours.add(uuid)
    return ours


def summarize_key(fuzz_db, key: bytes, reports: list, ours: set[str]) -> PropertySummary:
    from hypofuzz.database import Phase

    by_worker: dict[str, list] = {}
    for report in reports:
        if report.worker_uuid in ours:
            by_worker.setdefault(report.worker_uuid, []).append(report)
    summary = PropertySummary(reports[0].nodeid, key.hex())
    for worker_reports in by_worker.values():
        latest = max(worker_reports, key=lambda r: r.elapsed_time)
        summary.inputs += total_inputs(latest)
        summary.behaviors = max(summary.behaviors, latest.behaviors)
        summary.fingerprints = max(summary.fingerprints, latest.fingerprints)
        first = inputs_to_first_failure(worker_reports)
        if first is not None:
            summary.first_failure_at.append(first)
        summary.shrunk |= any(report.phase is Phase.FAILED for report in worker_reports)
    for observation in stored_failures(fuzz_db, key):
        if is_skip(observation):
            summary.skipped = failure_message(observation)
        else:
            summary.failures.append(failure_message(observation))
    if summary.skipped and not summary.failures:  # HypoFuzz stores a skip as a failure; it is not one
        summary.first_failure_at.clear()
        summary.shrunk = False
    return summary


def read_campaign(db, window: CampaignWindow) -> dict[str, PropertySummary]:
    """One summary per property this campaign's workers ran, from HypoFuzz's database entries."""
    from hypofuzz.database import HypofuzzDatabase
    from hypofuzz.database.database import test_keys_key

    fuzz_db = HypofuzzDatabase(db)
    recent = {}
    for key in fuzz_db.fetch(test_keys_key):
        reports = [r for r in fuzz_db.reports.fetch(key) if window.started <= r.timestamp <= window.finished]
        if reports:
            recent[key] = reports
    ours = campaign_workers(fuzz_db, {r.worker_uuid for reports in recent.values() for r in reports}, window)
    summaries = {}
    for key, reports in recent.items():
        if any(report.worker_uuid in ours for report in reports):
            summary = summarize_key(fuzz_db, key, reports, ours)
            summaries[summary.nodeid] = summary
    return summaries
