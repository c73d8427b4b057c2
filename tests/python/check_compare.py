"""Checks the judge's output comparison (`compare`, `close_by_margin`, `rms`, `same_bits` in
`python/cudarl_worker.py`) against its float64 definition, on CPU torch.

- Outputs whose elements sit on either side of the tolerance |o - e| <= atol + rtol |e|, within
  a few float32 roundings of it, get the same verdict, count of elements off tolerance and
  first bad position as the float64 check alone (`close_by_margin` disabled); max abs and max
  rel agree to float32 precision. Outputs 1e-4 inside the tolerance are decided in float32.
- NaN, infinities (matching and not), -0.0, float16 and bfloat16 outputs, and a reference of
  another dtype get the float64 check's verdicts.
- `rms` agrees with the float64 sum to 1e-6 relative, counts non-finite elements as 0 and falls
  back past float32's range.
- `same_bits` tells -0.0 from 0.0 and NaN payloads apart, and float16 views work.

Prints `compare: ok` and exits 0, or raises.
"""

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import cudarl_worker as w

ATOL, RTOL = 1e-2, 1e-2


def exact(outs, exp, atol=ATOL, rtol=RTOL, **kw):
    fast = w.close_by_margin
    w.close_by_margin = lambda *_a: None
    try:
        return w.compare(outs, exp, atol, rtol, **kw)
    finally:
        w.close_by_margin = fast


def same_verdict(outs, exp, what, **kw):
    got, want = w.compare(outs, exp, ATOL, RTOL, **kw), exact(outs, exp, **kw)
    assert got[0] == want[0], f"{what}: verdict {got[0]} against the float64 check's {want[0]}"
    assert got[3] == want[3], f"{what}: non-finite {got[3]} against {want[3]}"
    assert got[4] == want[4], f"{what}: message {got[4]!r} against {want[4]!r}"
    for i, name in ((1, "max abs"), (2, "max rel")):
        a, b = got[i], want[i]
        assert a == b or (math.isfinite(b) and abs(a - b) <= 1e-6 * abs(b) + 1e-30), f"{what}: {name} {a} vs {b}"
    return got[0]


def straddling(n, seed, sign, low=1 - 4e-7, high=1 + 4e-7):
    """Outputs whose differences are the tolerance times factors in [low, high] at a fraction
    of positions (the rest well inside): around 1, float32 rounding could flip them."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(n, generator=g, dtype=torch.float64) * 10
    tol = ATOL + RTOL * e.abs()
    f = torch.rand(n, generator=g, dtype=torch.float64) * 0.5
    edge = torch.rand(n, generator=g) < 0.01
    f[edge] = low + torch.rand(int(edge.sum()), generator=g, dtype=torch.float64) * (high - low)
    o = e + sign * f * tol
    return o.float(), e.float()


def ulp_edge(n, seed, atol=ATOL):
    """Outputs 0-2 float32 steps either side of the float64 tolerance's edge, for references of
    magnitudes 1e-6..1e2 (where atol dominates the tolerance, a float32 step is far finer than
    the tolerance, so float32's rounding alone would decide them)."""
    g = torch.Generator().manual_seed(seed)
    mag = 10 ** (torch.rand(n, generator=g, dtype=torch.float64) * 8 - 6)
    e = (mag * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)).float()
    side = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    o = (e.double() + side * (atol + RTOL * e.double().abs())).float()
    steps = torch.randint(-2, 3, (n,), generator=g)
    for k in range(2):
        up, down = steps > k, steps < -k
        o = torch.where(up, torch.nextafter(o, torch.tensor(math.inf)), o)
        o = torch.where(down, torch.nextafter(o, torch.tensor(-math.inf)), o)
    return o, e


def per_element(o, e, atol=ATOL):
    """`compare` with one element per chunk (each decided alone, in float32 or float64) against
    the float64 check: the same count of elements off tolerance and first one; returns how
    many elements float32 decided."""
    chunk, fast, decided = w.COMPARE_CHUNK, w.close_by_margin, []
    w.COMPARE_CHUNK = 1
    w.close_by_margin = lambda *a: decided.append(fast(*a)) or decided[-1]
    try:
        got = w.compare([o], [e], atol, RTOL)
    finally:
        w.COMPARE_CHUNK, w.close_by_margin = chunk, fast
    want = exact([o], [e], atol=atol)
    assert got[0] == want[0] and got[4] == want[4], f"element by element: {got[4]!r} against {want[4]!r}"
    return sum(d is not None for d in decided)


def main():
    o, e = ulp_edge(1500, 11)
    assert per_element(o, e) > 50, "float32 decides elements near the edge"
    assert not exact([o], [e])[0], "some elements are past the edge"
    o0, e0 = ulp_edge(200, 12, atol=0.0)
    per_element(o0, e0, atol=0.0)
    sub = torch.tensor([7.86264084177569e-39])
    per_element(torch.tensor([7.941267698608956e-39]), sub, atol=0.0)
    assert not w.compare([torch.tensor([7.941267698608956e-39])], [sub], 0.0, RTOL)[0], "a subnormal edge"

    n = 3 * w.COMPARE_CHUNK // 64
    passed = failed = 0
    for seed in range(6):
        o, e = straddling(n, seed, 1 if seed % 2 else -1)
        ok = same_verdict([o], [e], f"straddling seed {seed}")
        passed, failed = passed + ok, failed + (not ok)
        o2 = e.clone()
        o2[seed * 1000] += 1.0
        assert not same_verdict([o2], [e], "one element off")
        assert same_verdict([e.clone()], [e], "identical")
    assert failed, "some straddling outputs fail the float64 check (the test reaches the margin)"
    decided = []
    fast = w.close_by_margin
    w.close_by_margin = lambda *a: decided.append(fast(*a)) or decided[-1]
    try:
        o, e = straddling(n, 7, 1, low=1 - 2e-4, high=1 - 1e-4)
        assert same_verdict([o], [e], "just under the margin")
    finally:
        w.close_by_margin = fast
    assert decided and all(d is not None for d in decided), "float32 decides outside the margin"

    e = torch.randn(4096, generator=torch.Generator().manual_seed(9))
    cases = {
        "NaN in the output": (lambda o: o.__setitem__(5, math.nan)),
        "infinity in the output": (lambda o: o.__setitem__(6, math.inf)),
        "-0.0 for 0.0": (lambda o: o.__setitem__(7, -0.0)),
    }
    for what, spoil in cases.items():
        o = e.clone()
        spoil(o)
        same_verdict([o], [e], what)
    ei = e.clone()
    ei[3], ei[4] = math.inf, math.nan
    oi = ei.clone()
    assert same_verdict([oi], [ei], "matching infinity and NaN"), "matching non-finite elements pass"
    oi[3] = -math.inf
    assert not same_verdict([oi], [ei], "opposite infinity")
    for dt in (torch.float16, torch.bfloat16):
        assert same_verdict([e.to(dt)], [e.to(dt)], f"{dt} identical")
        assert not same_verdict([(e + 1).to(dt)], [e.to(dt)], f"{dt} off")
        same_verdict([e.to(dt)], [e], f"{dt} against a float32 reference")
    e64 = e.double()
    assert same_verdict([e64.clone()], [e64], "float64 outputs")
    big = torch.full((8,), 1e30)
    same_verdict([big * (1 + 1e-3)], [big], "magnitudes past float32 squares", scaled=True)

    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(3)) * 1e3
    want = float(x.double().square().mean().sqrt())
    assert abs(w.rms(x, "cpu") - want) <= 1e-6 * want, "rms in float32 within 1e-6 of float64's"
    assert abs(w.rms(torch.tensor([3.0, 4.0, math.inf]), "cpu") - (25 / 3) ** 0.5) < 1e-12
    huge = torch.tensor([3e30, 4e30]).repeat(256)
    assert abs(w.rms(huge, "cpu") - 12.5**0.5 * 1e30) <= 1e-6 * 1e30 * 12.5**0.5, "past float32's range"
    assert w.rms(torch.empty(0), "cpu") == 0.0

    z = torch.zeros(4)
    m = z.clone()
    m[1] = -0.0
    assert w.same_bits(z, z.clone()) and not w.same_bits(z, m), "-0.0 is not 0.0"
    n1 = torch.tensor([math.nan])
    n2 = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert w.same_bits(n1, n1.clone()) and not w.same_bits(n1, n2), "NaN payloads count"
    h = torch.randn(8).half()
    assert w.same_bits(h, h.clone()) and not w.same_bits(h, h + 1)
    t = torch.randn(4, 3)
    assert w.same_bits(t.t(), t.t().contiguous()), "a transposed view"
    assert w.same_bits(torch.tensor(1.5), torch.tensor(1.5)) and not w.same_bits(torch.tensor(1.5), torch.tensor(2.5))
    print("compare: ok")


if __name__ == "__main__":
    main()
