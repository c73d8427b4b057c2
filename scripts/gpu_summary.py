"""Collects the results of scripts/gpu_checks.sh into one JSON file and prints a table."""
import json
import sys
import tomllib
from pathlib import Path

w, out = Path(sys.argv[1]), Path(sys.argv[2])
expected = tomllib.load(open("tests/kernels/hacks/expected.toml", "rb"))
res = {"gpu": (w / "gpu.txt").read_text().strip(), "nvcc": (w / "nvcc.txt").read_text().strip(), "checks": {}}
for f in sorted(w.glob("*.json")):
    if f.name.startswith("compile_") or f.name == "load_inline.json":
        continue
    name = f.stem
    try:
        v = json.loads(f.read_text())
    except Exception as e:  # noqa: BLE001
        v = {"error": f"unreadable verdict: {e}", "stderr": (w / f"{name}.err").read_text()[-2000:]}
    v["exit_code"] = int((w / f"{name}.rc").read_text())
    v["wall_s"] = float((w / f"{name}.wall").read_text())
    v.pop("tests", None) if False else None
    res["checks"][name] = v
colds = sorted(json.loads((w / f"compile_{i}.json").read_text())["compile_seconds"] for i in range(1, 6))
hit = json.loads((w / "compile_hit.json").read_text())
res["compile"] = {"cold_s": colds[2], "cold_all_s": colds, "second_cache_hit": hit["cache_hit"],
                  "cache_hit_process_wall_s": float((w / "compile_hit.wall").read_text())}

vrun = [json.loads(l) for l in (w / "validate_run.jsonl").read_text().splitlines() if l.strip()]
vrows = [json.loads(l) for l in (w / "validate_rows.jsonl").read_text().splitlines() if l.strip()]
vwall = float((w / "validate_run.wall").read_text())
res["validate"] = {
    "wall_s": vwall,
    "kernels": len(vrows),
    "kernels_per_hour": 3600 * len(vrows) / vwall if vwall else None,
    "all_correct": all(r.get("correct") is True for r in vrows),
    "rows": [{k: r.get(k) for k in ("task_id", "role", "correct", "median_ms", "speedup_vs_naive", "tests", "tests_passed")} for r in vrows],
    "nodes": {r["node"]: r["status"] for r in vrun},
}
try:
    res["load_inline"] = json.loads((w / "load_inline.json").read_text())
except Exception as e:  # noqa: BLE001
    res["load_inline"] = {"error": str(e), "stderr": (w / "load_inline.err").read_text()[-1500:]}
rows, ok_all = [], True
def med(v):
    t = v.get("timing") or {}
    return t.get("median_ms")
for name, v in res["checks"].items():
    if name.startswith("hack__"):
        want = expected[name[6:]]["failure"]
        got = v.get("failure")
        ok = got == want
        rows.append((name, f"want {want}", f"got {got}", "OK" if ok else "FAIL", (v.get("failure_detail") or "")[:60]))
    else:
        ok = v.get("correct") is True and v.get("executed") is True
        ntests = len(v.get("tests") or [])
        rows.append((name, f"correct={v.get('correct')} tests={ntests}", f"median={med(v)}", "OK" if ok else "FAIL",
                     f"x{v.get('speedup_vs_naive') or 0:.2f} vs naive, {100 * (v.get('dram_fraction_of_peak') or 0):.0f}% peak"))
    ok_all &= ok
# optimized beats naive; repeat timing within 2%
for task in ("vector_add", "row_sum"):
    opt = [k for k in res["checks"] if k.startswith(task + "__") and k.endswith("__again")]
    for again in opt:
        first = again[: -len("__again")]
        a, b = med(res["checks"][first]), med(res["checks"][again])
        n = med(res["checks"][f"{task}__naive"])
        rep = abs(a - b) / a if a and b else None
        beats = a is not None and n is not None and a < n
        ok = beats and rep is not None and rep <= 0.02
        ok_all &= ok
        rows.append((f"{first} vs naive/repeat", f"opt {a} naive {n}", f"repeat diff {rep}", "OK" if ok else "FAIL", ""))
rows.append(("compile", f"cold median {res['compile']['cold_s']:.3f}s of 5", f"hit={res['compile']['second_cache_hit']} (whole check process {res['compile']['cache_hit_process_wall_s']:.3f}s)", "OK", ""))
rows.append(("validate stage", f"{res['validate']['kernels']} kernels in {vwall:.1f}s", f"{res['validate']['kernels_per_hour'] or 0:.0f}/h", "OK" if res["validate"]["all_correct"] else "FAIL", ""))
ok_all &= res["validate"]["all_correct"]
li = res["load_inline"]
if "build_s" in li:
    rows.append(("load_inline vs nvcc", f"load_inline {li['build_s']:.1f}s", f"nvcc cold {res['compile']['cold_s']:.2f}s", "OK", f"ratio {li['build_s'] / res['compile']['cold_s']:.0f}x"))
res["all_ok"] = ok_all
(out / "gpu_checks.json").write_text(json.dumps(res, indent=2) + "\n")
print(res["gpu"], "|", res["nvcc"])
for r in rows:
    print(" | ".join(str(x) for x in r))
print("ALL OK" if ok_all else "SOME CHECKS FAILED")
