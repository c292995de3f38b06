"""The throwaway server's watchdog: stops a server whose owner died without stopping it.

``python -m msgtable.testing.watchdog PID DIR... KEEP`` runs beside a server msgtable.testing.devdb
started
(process group PID), its stdin a pipe whose write end only the owner holds. Data on the pipe
means "I stopped the server myself": it exits. End of file without data means the owner died
(SIGKILL, ``os._exit``: what atexit cannot catch), so it stops the server (SIGTERM, then
SIGKILL) and deletes its directories (DIR...), unless KEEP is 1.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence

STOP_TIMEOUT_S = 30.0  # the server's graceful shutdown, before SIGKILL
KILL_TIMEOUT_S = 5.0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def stop_group(pid: int, stop_timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop the process group ``pid``: SIGTERM, then SIGKILL if it takes too long."""
    for sig, wait_s in ((signal.SIGTERM, stop_timeout_s), (signal.SIGKILL, KILL_TIMEOUT_S)):
        if alive(pid):
            with contextlib.suppress(OSError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + wait_s
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    pid, dirs, keep = int(args[0]), args[1:-1], args[-1] == "1"
    if sys.stdin.buffer.read():
        return 0  # the owner stopped the server itself
    stop_group(pid)
    if not keep:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
