"""The modules the reshaping moved into the wings still import by their old names, with a
DeprecationWarning naming the new one, and hand out the very same objects."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import msgtable


@pytest.mark.parametrize(("old", "new"), sorted(msgtable.MOVED.items()))
def test_an_old_name_imports_the_new_module_with_a_warning(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}: import it from there"):
        moved = importlib.import_module(old)
    target = importlib.import_module(new)
    public = [n for n in dir(target) if not n.startswith("_")]
    assert public and all(getattr(moved, n) is getattr(target, n) for n in public)
    with pytest.raises(AttributeError):
        _ = moved.no_such_name


def test_the_documented_old_imports_run_as_before() -> None:
    code = (
        "from msgtable.keyspace import load\n"
        "from msgtable.keyspaceclient import KeyspaceClient\n"
        "from msgtable.shardenqueue import ShardedEnqueue\n"
        "import msgtable.core.keyspace, msgtable.gateway.clients, msgtable.enqueue.sharded\n"
        "assert load is msgtable.core.keyspace.load\n"
        "assert KeyspaceClient is msgtable.gateway.clients.KeyspaceClient\n"
        "assert ShardedEnqueue is msgtable.enqueue.sharded.ShardedEnqueue\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_importing_msgtable_imports_none_of_the_moved_modules() -> None:
    code = "import msgtable, sys; print(sorted(m for m in sys.modules if m.startswith('msgtable')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "['msgtable']", done.stdout + done.stderr
