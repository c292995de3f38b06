"""Spark's JVM starts in a process that already runs gRPC (a worker with a msgtable client
open, a stream sink, the test session itself).

PySpark starts its JVM through a fork that runs Python in the child (a ``preexec_fn``): there
every handler registered for fork runs, gRPC's among them, and with gRPC's threads busy the
child can die before it execs java, which PySpark reports only as "Java gateway process exited
before sending its port number" (once in three starts on this machine). msgtable's session
starts the JVM without Python in the child. Each case starts a session in a fresh process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from msgtable.spark.session import jdbc_jar

START_TIMEOUT_S = 240  # a JVM start on a busy machine

# A fork handler that cannot survive the child: a library's (gRPC's) that dies there.
EXIT_IN_CHILD = """
import os
os.register_at_fork(after_in_child=lambda: os._exit(3))
"""

# gRPC busy in this process: a server and three threads opening channels to it.
BUSY_GRPC = """
import threading
from concurrent import futures
import grpc
server = grpc.server(futures.ThreadPoolExecutor(4))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
def connect():
    channels = []
    while True:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            grpc.channel_ready_future(channel).result(timeout=1)
        except grpc.FutureTimeoutError:
            pass
        channels.append(channel)
        if len(channels) > 50:
            channels.pop(0).close()
for _ in range(3):
    threading.Thread(target=connect, daemon=True).start()
"""

START = """
import time
from pathlib import Path
from msgtable.spark.session import session
time.sleep(0.5)
spark = session("local[1]", "msgtable-start-test", jvm_output=Path({log!r}))
print("started", spark.range(3).count(), flush=True)
spark.stop()
"""


@pytest.mark.parametrize("before", [EXIT_IN_CHILD, BUSY_GRPC], ids=["fork-handler", "busy-grpc"])
def test_the_jvm_starts_in_a_process_whose_fork_handlers_cannot_run_in_a_child(
    before: str, tmp_path: Path
) -> None:
    assert jdbc_jar() is not None
    log = tmp_path / "jvm.log"
    script = textwrap.dedent(before) + START.format(log=str(log))
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    said = log.read_text(errors="replace") if log.exists() else "(no JVM output)"
    assert done.returncode == 0 and "started 3" in done.stdout, (
        f"no Spark session started (exit {done.returncode}): {done.stderr[-1500:]}\n"
        f"the JVM said: {said[-1500:]}"
    )
