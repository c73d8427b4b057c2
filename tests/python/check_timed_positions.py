"""Checks what the torch-format judge compares in a timed window (`TorchJudge.timed_positions`,
`python/cudarl_worker.py`), on CPU torch.

- The first timed window (`whole`) and outputs of at most TIMED_COMPARE elements are compared
  in full: the same tensors come back.
- A larger output is compared at TIMED_COMPARE positions, the same ones in the candidate's output
  and the reference's, drawn from the judge's generator (two draws differ).
- An output wrong at one element in 10^5, all of them in its last third (positions drawn from a
  prefix would miss them), fails the comparison in each of 8 windows; a right one passes in each.
- A sample's tolerance under `scaled` is the one given for the whole output (`scales`).

Prints `timed positions: ok` and exits 0, or raises.
"""

import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import cudarl_worker as w

N = 3 * w.TIMED_COMPARE  # elements of the large output


def main():
    judge = types.SimpleNamespace(gen=torch.Generator().manual_seed(7))
    positions = lambda outs, exp, whole: w.TorchJudge.timed_positions(judge, outs, exp, whole)
    small = torch.arange(16, dtype=torch.float32)
    large = torch.rand(N, generator=torch.Generator().manual_seed(1))
    outs, exp = [small.clone(), large.clone()], [small.clone(), large.clone()]

    got, want = positions(outs, exp, True)
    assert got[1] is outs[1] and want[1] is exp[1], "the first timed window is compared in full"
    got, want = positions(outs, exp, False)
    assert got[0] is outs[0], "a small output is compared in full"
    assert got[1].numel() == want[1].numel() == w.TIMED_COMPARE
    assert torch.equal(got[1], want[1]), "the same positions of output and reference"
    again, _ = positions(outs, exp, False)
    assert not torch.equal(got[1], again[1]), "each window draws its own positions"

    wrong = large.clone()
    third = N // 3
    bad = 2 * third + torch.randperm(third, generator=torch.Generator().manual_seed(2))[: N // 100_000]
    wrong[bad] += 1.0
    for _ in range(8):
        g, e = positions([small, large], [small, large], False)
        assert w.compare(g, e, 1e-5, 1e-5)[0], "a right output passes"
        g, e = positions([small, wrong], [small, large], False)
        assert not w.compare(g, e, 1e-5, 1e-5)[0], "an output wrong at 1 in 1e5 elements fails"
    got, want = [torch.tensor([1000.5])], [torch.tensor([1000.0])]
    assert not w.compare(got, want, 1e-3, 0.0, scaled=True, scales=[1.0])[0], "the given scale, not the sample's"
    assert w.compare(got, want, 1e-3, 0.0, scaled=True, scales=[1e3])[0], "the given scale, not the sample's"
    assert abs(w.rms(torch.tensor([3.0, 4.0, float("nan")]), "cpu") - (25 / 3) ** 0.5) < 1e-12
    print("timed positions: ok")


if __name__ == "__main__":
    main()
