"""Saved examples across hypothesis versions: an example database written by another version is
reported, never silently empty; failure files replay whatever the version (issue 17, item 2)."""

from __future__ import annotations

import warnings

import hypothesis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, choices_to_bytes

from mla_fuse_conformance.settings import database


def test_entries_of_this_version_are_replayed_without_a_word(tmp_path):
    stamped = database.VersionStampedDatabase(DirectoryBasedExampleDatabase(tmp_path))
    stamped.save(b"key", choices_to_bytes((3,)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(stamped.fetch(b"key")) == [choices_to_bytes((3,))]


def test_entries_of_another_version_are_reported_with_what_still_replays(tmp_path):
    raw = DirectoryBasedExampleDatabase(tmp_path)
    raw.save(b"key", choices_to_bytes((3,)))
    raw.save(b"key", b"\xff\x00 a sequence of another format")
    raw.save(b"key" + database.VERSION_SUFFIX, b"6.0.0")
    stamped = database.VersionStampedDatabase(raw)
    with pytest.warns(database.StaleExamplesWarning) as caught:
        values = list(stamped.fetch(b"key"))
    assert len(values) == 2  # still handed to hypothesis: what parses is replayed
    message = str(caught[0].message)
    assert "hypothesis 6.0.0" in message and f"this is hypothesis {hypothesis.__version__}" in message
    assert "1 are replayed" in message and "1 cannot be read" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per key and process
        list(stamped.fetch(b"key"))


def test_a_save_restamps_the_key_with_this_version(tmp_path):
    raw = DirectoryBasedExampleDatabase(tmp_path)
    raw.save(b"key" + database.VERSION_SUFFIX, b"6.0.0")
    database.VersionStampedDatabase(raw).save(b"key", choices_to_bytes((1,)))
    assert set(raw.fetch(b"key" + database.VERSION_SUFFIX)) == {hypothesis.__version__.encode()}


def test_a_failure_saved_by_a_test_is_found_again_through_the_stamped_database(tmp_path):
    """The wrapper is transparent to hypothesis: a failing example is saved and replayed first."""
    db = database.VersionStampedDatabase(DirectoryBasedExampleDatabase(tmp_path))
    seen = []

    @settings(database=db, max_examples=200, derandomize=False)
    @given(st.integers(0, 10_000))
    def fails_above_5000(number):
        seen.append(number)
        assert number <= 5000

    with pytest.raises(AssertionError):
        fails_above_5000()
    seen.clear()
    with pytest.raises(AssertionError):
        fails_above_5000()
    assert seen[0] > 5000  # the saved failure came back first
