"""Start and teardown cost of sandboxed runners on a GPU host.

Starts `cudarl-pipe-runner native --gpu` the way the judge does (control socket on fd 3, clean
environment, own process group), waits for its `ready` line, then kills it with SIGKILL and
waits until it is reaped. Measures one runner at a time, then N started at once, with the
driver's default number of hardware queues per context and with CUDA_DEVICE_MAX_CONNECTIONS=1.
Prints one JSON object.

Usage: python3 scripts/gpu/runner_start_cost.py RUNNER LIBCUDART
"""

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

RUNNER, CUDART = sys.argv[1], sys.argv[2]


def spawn(extra):
    judge_end, runner_end = socket.socketpair()
    fd = runner_end.fileno()
    env = {k: os.environ[k] for k in ["LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES"] if k in os.environ}
    env.update({"CUDA_MODULE_LOADING": "EAGER", "CUDA_CACHE_DISABLE": "1"})
    env.update(extra)

    def child():
        os.dup2(fd, 3)
        os.set_inheritable(3, True)
        os.setpgid(0, 0)

    p = subprocess.Popen(
        [RUNNER, "native", "--dir", tempfile.mkdtemp(prefix="runner-cost-"), "--gpu", "--cudart", CUDART],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        close_fds=False,
        preexec_fn=child,
    )
    runner_end.close()
    return p, judge_end, time.time()


def ready(judge_end):
    line = judge_end.makefile("r").readline()
    if '"ready"' not in line:
        sys.exit(f"runner did not start: {line.strip()!r}")


def batch(n, extra):
    procs = [spawn(extra) for _ in range(n)]
    waits = []
    for _p, s, t0 in procs:
        ready(s)
        waits.append(time.time() - t0)
    t = time.time()
    for p, _, _ in procs:
        os.killpg(p.pid, signal.SIGKILL)
    for p, _, _ in procs:
        p.wait()
    return {
        "ready_max_s": round(max(waits), 3),
        "ready_median_s": round(statistics.median(waits), 3),
        "all_reaped_s": round(time.time() - t, 3),
    }


out = {}
for name, extra in [("default_queues", {}), ("one_queue", {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})]:
    one = [batch(1, extra) for _ in range(5)]
    out[name] = {
        "one_at_a_time": {"ready_s": [r["ready_max_s"] for r in one], "reaped_s": [r["all_reaped_s"] for r in one]},
        **{f"{n}_at_once": batch(n, extra) for n in (4, 8, 16)},
    }
print(json.dumps(out))
