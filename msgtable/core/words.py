"""Counted nouns in what the CLI and the server say: "1 dead letter", "2 dead letters"."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str = "") -> str:
    """``n`` (with thousands separators) and ``noun``, in the plural unless ``n`` is 1: the
    plural is ``noun + "s"`` unless given (``counted(2, "entry", "entries")``)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
