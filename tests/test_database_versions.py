"""Saved examples across hypothesis versions: an example database written by another version is
reported, never silently empty; failure files replay whatever the version."""

from __future__ import annotations

import pathlib
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


# Keys hypothesis gave these properties when each ran through harness.prop's wrapper (settings/legacy_keys.py;
# computed by that version of the suite).
WRAPPER_LAYOUT_KEYS = {
    ("test_rotary_embedding.py::test_rotary_embedding_matches_reference", False): "94b293c1fcf620a9f9bd58e60a6160c48fde912dad3258f010ec32882c102246316e5ff25deb8e90c10bd008f495afa9",
    ("test_mla.py::test_fused_mla_matches_reference", False): "650daee04cf6de5255a12bdb7b918213efa96b765c42593ebf7d58efa54fa27c02be5649fb1de19217559af58df84ea2",
    ("test_flash.py::test_flash_cache_write_rejects_bad_input[duplicate_valid_slots]", True): "4f36a0e2c31f13a75e49569f8ea32923f71f5046f980c5ea1d2df88a1aaa5e29a004eb023c8f3ef1d72964101db6e643",
}


@pytest.mark.parametrize("node, bad_input", list(WRAPPER_LAYOUT_KEYS), ids=[node for node, _ in WRAPPER_LAYOUT_KEYS])
def test_the_keys_before_0_2_are_computed_again(node, bad_input):
    from mla_fuse_conformance.settings.legacy_keys import legacy_key

    assert legacy_key(node, bad_input).hex() == WRAPPER_LAYOUT_KEYS[node, bad_input]


class Item:
    """What ``key_by_suite_node_id`` reads of a pytest item."""

    def __init__(self, test, nodeid):
        self.obj, self.nodeid = test, nodeid
        self.path = pathlib.Path("/anywhere") / nodeid.partition("::")[0]


def test_examples_saved_under_a_key_before_0_2_are_replayed(tmp_path):
    """Before 0.2 every kernel property ran through one wrapper, and hypothesis keyed its examples by
    that wrapper's source (``settings/legacy_keys.py``); the plugin makes the database read them for
    the property's own key too."""
    from hypothesis.internal.reflection import function_digest

    from mla_fuse_conformance.properties import test_rotary_embedding as module
    from mla_fuse_conformance.settings.legacy_keys import legacy_key

    node = "test_rotary_embedding.py::test_rotary_embedding_matches_reference"
    raw = DirectoryBasedExampleDatabase(tmp_path)
    raw.save(legacy_key(node, False), choices_to_bytes((7,)))
    stamped = database.VersionStampedDatabase(raw)
    test = module.test_rotary_embedding_matches_reference
    database.key_by_suite_node_id(Item(test, node), bad_input=False, databases=[stamped])
    key = function_digest(test.hypothesis.inner_test)
    assert list(stamped.fetch(key)) == [choices_to_bytes((7,))]
