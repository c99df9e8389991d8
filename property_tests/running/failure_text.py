"""Which failing case a report shows, and how much of its error text.

One case. A failing property runs many failing examples: hypothesis reports some of them (the
simplest failing explicit example of each kind of error, or its shrunk example), the recorder sees
every one. ``Recorder.failed`` ties each error to the failure record of its example
(``RECORD_ATTRIBUTE``), so ``reported`` finds, from the exception hypothesis raised, the records of
the examples it printed, in its order. The plugin saves the first of them for replay and prints it
labelled (``recording.describe_failure``): the case of the "Falsifying example" above it, not the
last example that happened to fail.

The error text. A failure's error is kept whole in its failure file (4,000 characters); a cell
of report.json keeps ``excerpt`` of it: the headline and the worst elements of each failed check
(``judging/comparisons.py``), bounded.
"""

from __future__ import annotations

RECORD_ATTRIBUTE = "mla_fuse_failure_record"  # set on an example's error by Recorder.failed
EXCERPT_LINES, EXCERPT_CHARS = 12, 2000
# how hypothesis found an example, from the note it attached to its error
FOUND_AS = (("Falsifying explicit example", "hypothesis' explicit example"),
            ("Falsifying example", "hypothesis' shrunk example"))


def attach(error: BaseException, record: dict) -> None:
    """Tie ``record`` (the failure record of the example that raised ``error``) to ``error``."""
    try:
        setattr(error, RECORD_ATTRIBUTE, record)
    except (AttributeError, TypeError):  # an exception type without a __dict__: the last failure stands
        pass


def found_as(error: BaseException) -> str:
    """How hypothesis found the example of ``error``: its explicit or its shrunk example, from its notes."""
    notes = getattr(error, "__notes__", None) or ()
    for prefix, name in FOUND_AS:
        if any(str(note).startswith(prefix) for note in notes):
            return name
    return "a failing example"


def reported(error: BaseException | None) -> list[dict]:
    """The failure records of the examples hypothesis reported with ``error`` (one, or each of an
    exception group's, in its order), each with ``found_as``; empty where none is tied to it."""
    found: list[dict] = []

    def walk(each: BaseException) -> None:
        record = getattr(each, RECORD_ATTRIBUTE, None)
        if record is not None:
            found.append(dict(record, found_as=found_as(each)))
        elif isinstance(each, BaseExceptionGroup):
            for inner in each.exceptions:
                walk(inner)

    if error is not None:
        walk(error)
    return found


def case_note(failure: dict) -> list[str]:
    """The lines under a printed case saying which case it is (``describe_failure``)."""
    how = failure.get("found_as")
    lines = ["(the one case of this failure, run by the commands below and the reproducer"
             + (f": {how} above, as run inside the declared limits, its `case = ...` line)" if how and
                how.startswith("hypothesis") else ")")]
    others = failure.get("reported_failures", 1) - 1
    if others > 0:
        lines.append(f"(hypothesis reported {others + 1} distinct failures; this is the first of them, "
                     f"the pytest command below shows the other{'s' if others > 1 else ''})")
    return lines


def excerpt(text: str | None, lines: int = EXCERPT_LINES, chars: int = EXCERPT_CHARS) -> str:
    """``text``'s first ``lines`` lines, at most ``chars`` characters, with a mark where it was cut."""
    if not text:
        return ""
    kept = text.strip().splitlines()
    cut = "\n".join(kept[:lines])
    if len(cut) > chars:
        cut = cut[:chars].rstrip()
    return cut + (" [...]" if cut != text.strip() else "")


def worst_lines(text: str | None, limit: int = 3) -> list[str]:
    """The worst element of each failed check in an error text (its lines after the headline that start
    with ``- ``), at most ``limit``: what a console line under a cell shows."""
    found = [line.strip()[2:] for line in (text or "").splitlines()[1:] if line.strip().startswith("- ")]
    return found[:limit]
