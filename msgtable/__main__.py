"""``python -m msgtable``: the msgtable command."""

from __future__ import annotations

from msgtable.cli import main

raise SystemExit(main())
