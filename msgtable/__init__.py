"""msgtable: a message-table engine for MySQL in the spirit of Vitess messaging."""

from __future__ import annotations

__version__ = "0.1.0"
