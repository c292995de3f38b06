"""What the ``msgtable`` command logs, and how it looks.

msgtable's own lines are short and in one format (time, level, the line, which names its
subject: a table, the lease, the binlog, the database); they show from ``--log-level`` on (info
for serve, warning for the other commands). Libraries speak only when something is wrong: their
INFO chatter, and the binlog library's advice about server settings (which reads as if msgtable
changed them; msgtable says itself what the binlog lets it do), only with ``--verbose``.
``--verbose`` shows everything, every logger's name, and an error's traceback.
"""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(message)s"
VERBOSE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
# Libraries whose warnings are not the user's business unless --verbose.
QUIET_LIBRARIES = {"pymysqlreplication": logging.ERROR}


def configure(level: str, verbose: bool) -> None:
    """Set up logging for one command (``level``: msgtable's own, e.g. "info")."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format=VERBOSE_FORMAT if verbose else FORMAT,
        datefmt=DATE_FORMAT,
    )
    logging.getLogger("msgtable").setLevel(logging.DEBUG if verbose else level.upper())
    for name, quiet in QUIET_LIBRARIES.items():
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else quiet)
