"""The server process's heap as Python's cyclic garbage collector sees it.

A server imports a great deal (grpc, protobuf, the database drivers, the binlog library, every
feature): some 90,000 objects that live as long as the process. The collector's full
collections scan every object in its oldest generation, and the cache's rows, which live for
seconds, reach that generation and make such collections come round (one or two per 30,000
messages at batch 100): each rescanned every module's objects again, a cost that grew with
every feature that landed, though a plain table's messages never touch them (issue 42: in a
profile of the server under the bench, the collector took a third of the time the server's
threads held the GIL).

:func:`settle` runs once the server has started: a collection, then ``gc.freeze()``, which
moves every object alive into a permanent generation that no collection scans again. What
the server allocates afterwards (the cache's rows, the requests) is collected as before, and
freezing frees nothing and keeps nothing alive that a collection would have freed: those
objects were reachable when frozen.
"""

from __future__ import annotations

import gc


def settle() -> int:
    """Collect once, then freeze what survives (see the module docstring); returns how
    many objects are frozen now."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
