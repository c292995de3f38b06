"""Reading a TOML file a user wrote (the auth file, the keyspace file): one line naming the
file when it cannot be read or is not TOML."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from msgtable.errors import InvalidArgument


def read(path: str | Path, what: str) -> dict[str, Any]:
    """The parsed file at ``path``; ``what`` names it in errors ("the auth file")."""
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidArgument(f"cannot read {what} {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"{what} {path} is not valid TOML: {exc}") from None
