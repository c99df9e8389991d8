"""What an example tells hypothesis (notes, events, targets), callable in a replay too, where
no hypothesis test is running (the call is then dropped)."""

from __future__ import annotations

import contextlib

from hypothesis import event as hypothesis_event
from hypothesis import note as hypothesis_note
from hypothesis import target as hypothesis_target
from hypothesis.errors import InvalidArgument


def note(text: str) -> None:
    with contextlib.suppress(InvalidArgument):
        hypothesis_note(text)


def event(text: str) -> None:
    with contextlib.suppress(InvalidArgument):
        hypothesis_event(text)


def target(value: float, label: str) -> None:
    with contextlib.suppress(InvalidArgument):
        hypothesis_target(value, label=label)
