"""Collects what scripts/gpu/checks.sh left in WORK into OUT/gpu_checks.json and prints a table."""

import json
import sys
from pathlib import Path

w, out = Path(sys.argv[1]), Path(sys.argv[2])
read = lambda n: (w / n).read_text() if (w / n).exists() else None
res = {"gpu": (read("gpu.txt") or "").strip(), "nvcc": (read("nvcc.txt") or "").strip()}
rows, ok_all = [], True


def add(name, a, b, ok, note=""):
    global ok_all
    ok_all &= ok
    rows.append((name, a, b, "OK" if ok else "FAIL", note))


if read("gpu_tests.rc") is not None:
    rc = int(read("gpu_tests.rc"))
    log = read("gpu_tests.log") or ""
    res["gpu_tests"] = {"exit_code": rc, "wall_s": float(read("gpu_tests.wall")), "log_tail": log[-4000:]}
    passed = [line for line in log.splitlines() if line.startswith("test ") and line.endswith(" ok")]
    add(
        "gated GPU tests (tests/gpu.rs)",
        f"exit {rc}",
        f"{len(passed)} passed in {res['gpu_tests']['wall_s']:.0f}s",
        rc == 0,
    )
if read("compile_1.json") is not None:
    colds = sorted(json.loads(read(f"compile_{i}.json"))["compile_seconds"] for i in range(1, 6))
    hit = json.loads(read("compile_hit.json"))
    res["compile"] = {
        "cold_median_s": colds[2],
        "cold_all_s": colds,
        "second_cache_hit": hit["cache_hit"],
        "cache_hit_process_wall_s": float(read("compile_hit.wall")),
    }
    add(
        "compile",
        f"cold median {colds[2]:.3f}s of 5",
        f"hit={hit['cache_hit']} (whole check process {res['compile']['cache_hit_process_wall_s']:.3f}s)",
        hit["cache_hit"],
    )
if read("validate_rows.jsonl") is not None:
    vrows = [json.loads(line) for line in read("validate_rows.jsonl").splitlines() if line.strip()]
    vwall = float(read("validate_run.wall"))
    keep = (
        "task_id",
        "role",
        "correct",
        "failure",
        "tests",
        "tests_passed",
        "median_ms",
        "speedup_vs_naive",
        "torch_median_ms",
        "speedup_vs_torch",
        "dram_fraction_of_peak",
        "hack_flags",
    )
    res["validate"] = {
        "wall_s": vwall,
        "kernels": len(vrows),
        "all_correct": all(r.get("correct") is True for r in vrows),
        "rows": [{k: r.get(k) for k in keep} for r in vrows],
    }
    add(
        "validate stage",
        f"{len(vrows)} kernels in {vwall:.1f}s",
        "all correct" if res["validate"]["all_correct"] else "NOT all correct",
        res["validate"]["all_correct"],
    )
    for r in sorted(vrows, key=lambda r: (r["task_id"], r["role"] != "naive")):
        sn, st = r.get("speedup_vs_naive"), r.get("speedup_vs_torch")
        beats = r["role"] == "naive" or (sn or 0) > 1.0
        add(
            f"  {r['task_id']}/{r['role']}",
            f"correct={r.get('correct')} {r.get('tests_passed')}/{r.get('tests')} tests",
            f"{r.get('median_ms') or 0:.4f} ms",
            r.get("correct") is True and beats,
            f"x{sn or 0:.2f} vs naive, x{st or 0:.2f} vs torch, "
            f"{100 * (r.get('dram_fraction_of_peak') or 0):.0f}% peak",
        )
if read("curriculum.rc") is not None:
    rc = int(read("curriculum.rc"))
    cur = {"exit_code": rc, "cold_wall_s": float(read("curriculum_cold.wall"))}
    if read("curriculum_cached.wall") is not None:
        cur["cached_wall_s"] = float(read("curriculum_cached.wall"))
    add(
        "make curriculum (cold)",
        f"exit {rc}",
        f"{cur['cold_wall_s']:.1f}s",
        rc == 0,
        (read("curriculum_run.err") or "")[-300:] if rc else "",
    )
    if "cached_wall_s" in cur:
        add("make curriculum (cached)", "", f"{cur['cached_wall_s']:.3f}s", True)
    if read("validations.jsonl") is not None:
        vr = [json.loads(line) for line in read("validations.jsonl").splitlines() if line.strip()]
        syn = [r for r in vr if r.get("source") == "synth"]
        cur["synthetic"] = {"kernels": len(syn), "correct": sum(r.get("correct") is True for r in syn)}
        add(
            "  synthetic kernels",
            f"{cur['synthetic']['correct']}/{len(syn)} correct",
            "",
            cur["synthetic"]["correct"] == len(syn),
        )
        fam = {}
        for r in syn:
            fam.setdefault(r["task_id"], {})[r["role"]] = r
        slow = [
            t
            for t, d in fam.items()
            if any((x.get("speedup_vs_naive") or 0) <= 1.0 for k, x in d.items() if k != "naive")
        ]
        cur["optimized_not_faster"] = slow
        add("  optimized beats naive", f"{len(fam) - len(slow)}/{len(fam)} families", ",".join(slow), not slow)
    if read("agreement.jsonl") is not None:
        ag = [json.loads(line) for line in read("agreement.jsonl").splitlines() if line.strip()]
        cur["agreement_rows"] = ag
        for src in ("sakana", "cuda-l1"):
            rows_ = [r for r in ag if r["source"] == src]
            known = [r for r in rows_ if r.get("agree") is not None]
            agree = sum(r["agree"] for r in known)
            fails = {}
            for r in rows_:
                f = (r.get("our_reason") or "correct").split(":")[0]
                fails[f] = fails.get(f, 0) + 1
            cur[f"{src}_summary"] = {
                "kernels": len(rows_),
                "compared": len(known),
                "agree": agree,
                "our_outcomes": fails,
            }
            add(
                f"  {src} agreement",
                f"{agree}/{len(known)} agree ({len(rows_)} kernels)",
                json.dumps(fails)[:120],
                True,
            )
    if read("kb_testgen.jsonl") is not None:
        kt = [json.loads(line) for line in read("kb_testgen.jsonl").splitlines() if line.strip()]
        cur["testgen"] = {"problems": len(kt), "recorded": sum(r["status"] == "recorded" for r in kt)}
        add("  testgen", f"{cur['testgen']['recorded']}/{len(kt)} problems recorded", "", True)
    if read("kb_testgen_cuda.jsonl") is not None:
        kt = [json.loads(line) for line in read("kb_testgen_cuda.jsonl").splitlines() if line.strip()]
        cur["testgen_cuda"] = {
            "problems": len(kt),
            "recorded": sum(r["status"] == "recorded" for r in kt),
            "wall_s": float(read("testgen_cuda.wall")),
            "excluded": [(r["problem_id"], r["reason"]) for r in kt if r["status"] != "recorded"],
        }
        add(
            "  KernelBench references on the GPU",
            f"{cur['testgen_cuda']['recorded']}/{len(kt)} ran",
            f"{cur['testgen_cuda']['wall_s']:.0f}s",
            True,
        )
    res["curriculum"] = cur
if read("bench_validate.json") is not None:
    bv = json.loads(read("bench_validate.json"))
    res["bench_validate"] = bv
    add(
        "bench validate",
        f"{bv['kernels']} kernels in {bv['wall_s']:.1f}s ({bv['correct']} correct)",
        f"{bv['kernels_per_hour']:.0f}/h",
        bv["correct"] == bv["kernels"],
        f"goal {bv['goal_kernels_per_hour']}/h: {'met' if bv['meets_goal'] else 'NOT met'}",
    )
elif read("bench_validate.err") is not None:
    res["bench_validate"] = {"error": read("bench_validate.err")[-2000:]}
    add("bench validate", "error", "", False)
if read("load_inline.json") is not None:
    try:
        li = json.loads(read("load_inline.json"))
        res["load_inline"] = li
        cold = res.get("compile", {}).get("cold_median_s")
        add(
            "load_inline vs nvcc",
            f"load_inline {li['build_s']:.1f}s",
            f"nvcc cold {cold:.2f}s",
            True,
            f"ratio {li['build_s'] / cold:.0f}x",
        )
    except Exception as e:
        res["load_inline"] = {"error": str(e), "stderr": (read("load_inline.err") or "")[-1500:]}
res["all_ok"] = ok_all
(out / "gpu_checks.json").write_text(json.dumps(res, indent=2) + "\n")
print(res["gpu"], "|", res["nvcc"])
for r in rows:
    print(" | ".join(str(x) for x in r))
print("ALL OK" if ok_all else "SOME CHECKS FAILED")
