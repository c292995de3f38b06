"""msgtable: a message-table engine for MySQL in the spirit of Vitess messaging.

Three modules moved into the package's wings; their old names still import, with a
DeprecationWarning naming the new one: ``msgtable.keyspace`` (now msgtable.core.keyspace),
``msgtable.keyspaceclient`` (msgtable.gateway.clients) and ``msgtable.shardenqueue``
(msgtable.enqueue.sharded). Nothing is imported before an old name is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__version__ = "0.1.0"

MOVED = {
    "msgtable.keyspace": "msgtable.core.keyspace",
    "msgtable.keyspaceclient": "msgtable.gateway.clients",
    "msgtable.shardenqueue": "msgtable.enqueue.sharded",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old name as a module that hands out the new module's names."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def exec_module(self, module: ModuleType) -> None:
        new = MOVED[module.__name__]
        warnings.warn(
            f"{module.__name__} moved to {new}: import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        target = importlib.import_module(new)
        names = vars(module)
        names["__getattr__"] = lambda name: getattr(target, name)
        names["__dir__"] = lambda: dir(target)
        names["__all__"] = [n for n in dir(target) if not n.startswith("_")]


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())
