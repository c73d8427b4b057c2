"""Checks which spare runner a torch-format run takes (`take_spare` in
`python/cudarl_worker.py`), with stand-in runner objects (no GPU, no zygote).

- A spare started for the run's spec, running, up and with its profiler started is taken.
- A spare whose profiler did not start (its start beside the previous candidate's run failed,
  e.g. that candidate took the GPU's memory) is ended, and a new runner is started: the run
  would otherwise report `kernels_unlisted` for a candidate that did nothing.
- So is a spare that never comes up, and one started for another spec.
- A spec that does not profile does not ask.
- A timed run ends a spare that started badly before its timing (`spare_up`); a good spare is
  checked once, there and at take together.

Prints `spare runner: ok` and exits 0, or raises.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import cudarl_worker as w


class Proc:
    def poll(self):
        return None


class Runner:
    """A runner that answers `profiler` with `answer`, or never comes up (`up` False)."""

    made = []

    def __init__(self, spec=None, step_s=60.0, answer="ok", up=True):
        self.spec, self.step_s, self.answer, self.comes_up = spec, step_s, answer, up
        self.proc, self.closed, self.asked = Proc(), False, []
        Runner.made.append(self)

    def wait_up(self, limit=w.START_S):
        if not self.comes_up:
            raise w.RunnerGone("timeout", f"the runner did not start within {limit:.0f} s")

    def ask(self, msg):
        self.asked.append(msg["op"])
        return (self.answer, "")

    def close(self):
        self.closed = True


def take(spare, spec):
    Runner.made.clear()
    w.SPARE = (spare.spec, spare)
    got = w.take_spare(spec, 30.0)
    assert w.SPARE is None
    return got


def main():
    w.TorchRunner = Runner
    spec = {"dir": "/tmp/a", "profile": True}
    good = Runner(spec)
    assert take(good, spec) is good and not good.closed and good.step_s == 30.0
    assert good.asked == ["profiler"]
    for what, bad, other in (
        ("profiler did not start", Runner(spec, answer="none"), spec),
        ("never came up", Runner(spec, up=False), spec),
        ("another spec", Runner({"dir": "/tmp/b", "profile": True}), spec),
    ):
        got = take(bad, other)
        assert got is not bad and bad.closed, what
        assert got in Runner.made and got.spec == other, what
    quiet = {"dir": "/tmp/c", "profile": False}
    r = Runner(quiet, answer="none")
    assert take(r, quiet) is r and r.asked == [], "a spec that does not profile does not ask"
    w.SPARE = (spec, Runner(spec, answer="none"))
    bad = w.SPARE[1]
    w.spare_up()
    assert w.SPARE is None and bad.closed, "a timed run ends a spare that started badly before timing"
    kept = Runner(spec)
    w.SPARE = (spec, kept)
    w.spare_up()
    assert w.SPARE[1] is kept and w.take_spare(spec, 30.0) is kept
    assert kept.asked == ["profiler"], "a spare is checked once, before timing and at take"
    print("spare runner: ok")


if __name__ == "__main__":
    main()
