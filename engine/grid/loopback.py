"""A Ray head on 127.0.0.1 for tests and benchmarks: a free port outside Ray's worker range,
and the processes a head started in its own session (to stop exactly those, never others)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

RAY_WORKER_PORTS = range(10002, 20000)  # Ray keeps these for its workers


def free_port() -> int:
    """A free TCP port on 127.0.0.1 that Ray's workers will not take."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in RAY_WORKER_PORTS:
            return port


def session_pids(sid: int) -> list[int]:
    """Processes of one session (a head started with ``start_new_session``, and all it started)."""
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = Path(f"/proc/{p}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[3]) == sid:
                pids.append(int(p))
    return pids
