"""Checks that the judge learns a runner's end as soon as the runners' zygote reports it
(`Zygote.exit_code`, `Forked.wait` in `python/cudarl_worker.py`), on a real socket pair.

- A runner whose `exit` line is already on the socket is reaped at once (under 0.5 s; the wait
  reads the socket in slices of 1 s), although nothing else follows and the wait may last 30 s:
  the judge measures the window's fixed cost again only after the runner is gone, so every
  timed run waits for this.
- Lines that arrive together (another runner's exit, then this one's) are all kept, also by a
  poll that does not wait.
- A runner with no exit line is still running after a short wait (None, then TimeoutExpired).

Prints `zygote exits: ok` and exits 0, or raises.
"""

import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import cudarl_worker as w


def zygote():
    z = object.__new__(w.Zygote)
    z.sock, theirs = socket.socketpair()
    z.buf, z.exits, z.asked = b"", {}, 0
    z.tail = lambda: ""
    return z, theirs


def main():
    z, theirs = zygote()
    theirs.sendall(b"exit 41 0\nexit 42 -9\n")
    t = time.monotonic()
    assert w.Forked(z, 42).wait(30) == -9, "the exit code the zygote reported"
    waited = time.monotonic() - t
    assert waited < 0.5, f"the exit line was there, but the wait took {waited:.2f} s"
    assert z.exits == {41: 0, 42: -9}, z.exits

    z, theirs = zygote()
    theirs.sendall(b"exit 41 0\nexit 42 -9\n")
    time.sleep(0.05)
    assert w.Forked(z, 42).poll() == -9, "a poll finds an exit line queued behind another"

    z, theirs = zygote()
    r = w.Forked(z, 7)
    assert r.poll() is None, "no exit line: still running"
    try:
        r.wait(0.2)
    except subprocess.TimeoutExpired:
        pass
    else:
        raise AssertionError("a runner with no exit line was reported ended")
    theirs.sendall(b"exit 7 0\n")
    assert r.wait(30) == 0
    print("zygote exits: ok")


if __name__ == "__main__":
    main()
