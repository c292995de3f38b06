"""Counted nouns: one helper for every "N thing(s)" the CLI and the server say."""

from __future__ import annotations

from msgtable.core.words import counted


def test_one_is_singular_and_every_other_count_plural():
    assert counted(1, "dead letter") == "1 dead letter"
    assert counted(0, "dead letter") == "0 dead letters"
    assert counted(2, "message") == "2 messages"
    assert counted(12345, "message") == "12,345 messages"


def test_an_irregular_plural_is_given():
    assert counted(1, "entry", "entries") == "1 entry"
    assert counted(3, "entry", "entries") == "3 entries"
