#!/usr/bin/env bash
# The kernel harness on a GPU host (the judge/runner split, its sandbox and its timing), one
# part per invocation, each under ten minutes:
#   PART=hacks  every case of tests/kernels/hacks/ (with its expected verdict from expected.toml)
#               and every kernel of tests/kernels/honest/ through `check --json`, plus the task
#               families' naive and optimized kernels of vector_add, row_sum and matmul; writes
#               hacks.jsonl and prints one line per case (want / got / agrees).
#   PART=bench  `bench validate` (kernels/hour, cold store) and `bench serve` (latency under
#               load) with the binaries of this checkout and, when $OLD holds another build's
#               binaries (*.gz) and $OLD_ROOT that build's configs, pipelines and task families,
#               with those too, in the same run: the cost of the isolation as a ratio. BENCHES:
#               which of the two (default "validate serve").
#   PART=profile  the Nsight Compute profile pass: `check --json` with and without `--ncu`
#               on naive and optimized kernels of vector_add, row_sum, matmul and softmax; writes
#               profile_pass.json (timing, the judge's DRAM fraction, the counters, the pass's ms).
#   PART=kb-native  KernelBench problems as native tasks: `run testgen` on a fresh store (timed),
#               then `check --json` (timed by default) of every kernel of tests/kernels/kb_native/ (named by
#               its problem) against its kb/L1 problem; writes kb_native.jsonl (per kernel: the
#               build's seconds, cache hit, correct, failure, recorded tests, the problem's own
#               sizes, timing, torch eager's and torch.compile's, the speedups, and nvcc's own
#               phase times for the kernel alone, `nvcc -time`) and prints a table. Detached
#               (setsid) into /tmp/cudarl-kb-native; WAIT_S (default 540) bounds one command, and
#               the next invocation on the same host collects it (ACTION=wait). STORE: a store
#               where testgen already ran (e.g. the main job's, /tmp/cudarl-main/store) instead
#               of a fresh one. TORCH_EQUIV=1: then the same kernels as torch extensions
#               (scripts/gpu/kb_torch_equivalents.py), built side by side and checked one at a
#               time; writes kb_torch_agreement.jsonl (each verdict beside the native one's).
#               MODEL_NEW=1: each native check also writes the kernel's `ModelNew` wrapper
#               (`check --model-new`), and the wrappers are built and checked as torch-format
#               candidates like TORCH_EQUIV's; writes kb_model_new_agreement.jsonl.
#               KB_ONLY: the kernels to check (names without .cu, space-separated; default all);
#               CHECK_FLAGS: extra `check` flags for every check (e.g. --no-bench). REPEAT=N: each
#               kernel checked as N distinct sources (a comment appended) in one `check`, so
#               the 2nd..Nth show a candidate's cost after its problem's first ("repeats").
#   PART=serve-kb  `serve` on a store where the main job ran (STORE, default
#               /tmp/cudarl-main/store; SETS: its `--set` values, space-separated) answering
#               KernelBench requests on the GPU: POST /v1/evaluate with a native kernel
#               (tests/kernels/kb_native/19_ReLU.cu) and with its ModelNew wrapper (from
#               PART=kb-native MODEL_NEW=1 when it ran on this host), and POST /v1/optimize for
#               kb/L1/19_ReLU (2 samples, 2 turns); writes serve_kb.json and prints a line each.
# Binaries: `make carry` (.carry/*.gz: cudarl-pipe, cudarl-pipe-worker, cudarl-pipe-runner).
#   PART=torch-build  `bench torch-build` (cold torch-extension builds of archive kernels, one
#               unit against the harness's kernel/host build; KERNELS, default 6, JOBS, default
#               4) into torch_build.json.
#   PART=families  generated families whose group starts with one of FAMILY_GROUPS (space-
#               separated, e.g. "conv:conv3d conv:transposed2d"): `run synth-tasks` on a fresh
#               store, then per family one `check --json` of its naive and fast kernels in turn;
#               writes families.jsonl (per kernel: task, group, file, compiled, correct, failure
#               and its detail, the number of tests, median_ms, the speedup over the family's
#               naive kernel; a kernel without a verdict, e.g. after a timeout, has failure
#               `no_verdict`) and prints a table. FAMILY_LIMIT: at most this many families
#               (default 24).
# Usage: PART=hacks OUT=out bash scripts/gpu/harness_checks.sh
set -uo pipefail
. "$(dirname "$0")/detach.sh"
CARRY=${CARRY:-.carry}
OUT=${OUT:-out}
PART=${PART:-hacks}
mkdir -p "$OUT"
unpack() { # dir of .gz -> dir of binaries
  local d
  d=$(mktemp -d)
  for z in "$1"/*.gz; do
    [ -e "$z" ] && gzip -dc "$z" > "$d/$(basename "$z" .gz)" && chmod +x "$d/$(basename "$z" .gz)"
  done
  echo "$d"
}
NEW=$(unpack "$CARRY")
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
export LD_LIBRARY_PATH=$TL/lib:${LD_LIBRARY_PATH:-}
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -x "$d/nvcc" ] && export PATH="$d:$PATH"; done
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
date -u +%Y-%m-%dT%H:%M:%SZ > "$OUT/date.txt"
if [ "$PART" = hacks ]; then
  S=$(mktemp -d)
  check() { # name task file [args]
    local name=$1 task=$2 file=$3; shift 3
    local t0 v
    t0=$(date +%s%N)
    v=$(CUDARL_WORKER=$NEW/cudarl-pipe-worker CUDARL_RUNNER=$NEW/cudarl-pipe-runner timeout 200 \
      "$NEW/cudarl-pipe" --root . --store "$S" check --task "$task" --source "$file" --json "$@" 2>/dev/null)
    python3 - "$name" "$task" "$(( ($(date +%s%N) - t0) / 1000000 ))" "$v" <<'PY' >> "$OUT/hacks.jsonl"
import json, sys
name, task, ms, v = sys.argv[1:5]
try:
    v = json.loads(v)
except Exception:
    v = {"failure": "no_verdict"}
t = v.get("timing") or {}
print(json.dumps({"case": name, "task": task, "ms": int(ms), "failure": v.get("failure"),
                  "failure_detail": (v.get("failure_detail") or "")[:300], "correct": v.get("correct"),
                  "hack_flags": v.get("hack_flags"), "static_rules": [f["rule"] for f in v.get("static_flags") or []],
                  "median_ms": t.get("median_ms"), "overhead_ms": t.get("overhead_ms"), "sets": t.get("sets"),
                  "windows": t.get("windows"), "cv": t.get("cv"), "speedup_vs_naive": v.get("speedup_vs_naive"),
                  "speedup_vs_torch": v.get("speedup_vs_torch"), "roofline_ms": v.get("roofline_ms"),
                  "candidate_output": (v.get("candidate_output") or "")[:200]}))
PY
  }
  : > "$OUT/hacks.jsonl"
  # One honest kernel first, traced: if the harness itself is broken there is no point going on.
  CUDARL_JUDGE_TRACE=$OUT/judge_trace.txt check "vector_add/naive(first)" vector_add datasets/tasks/vector_add/naive.cu
  if ! grep -q '"correct": true' "$OUT/hacks.jsonl"; then
    cat "$OUT/hacks.jsonl"; tail -30 "$OUT/judge_trace.txt"; exit 1
  fi
  for t in vector_add row_sum matmul; do
    check "$t/naive" "$t" "datasets/tasks/$t/naive.cu"
    for f in $(python3 -c "import tomllib,sys;print(' '.join(tomllib.load(open('datasets/tasks/$t/task.toml','rb'))['optimized']))"); do
      check "$t/$f" "$t" "datasets/tasks/$t/$f"
    done
  done
  for f in tests/kernels/honest/*.cu; do
    n=$(basename "$f" .cu)
    check "honest/$n" "${n%%__*}" "$f"
  done
  for f in tests/kernels/hacks/*.cu; do
    check "hack/$(basename "$f" .cu)" vector_add "$f" --timeout 15
  done
  python3 - "$OUT/hacks.jsonl" <<'PY' | tee "$OUT/hacks_summary.txt"
import json, sys, tomllib
exp = tomllib.load(open("tests/kernels/hacks/expected.toml", "rb"))
rows = [json.loads(l) for l in open(sys.argv[1])]
bad = 0
for r in rows:
    c = r["case"]
    if c.startswith("hack/"):
        e = exp[c[5:]]
        ok = r["failure"] == e["failure"] and (("flag" not in e) or e["flag"] in (r["hack_flags"] or []))
        want = e["failure"]
    else:
        ok = r["correct"] is True and not r["hack_flags"]
        want = "correct"
    bad += not ok
    print(f"{'ok ' if ok else 'BAD'} {c:44s} want {want:22s} got {str(r['failure'] or ('correct' if r['correct'] else r['correct'])):22s} {r['ms']:6d} ms  med {r['median_ms']} ovh {r['overhead_ms']} sets {r['sets']} naive {r['speedup_vs_naive']} torch {r['speedup_vs_torch']} {r['failure_detail'][:90]}")
print(f"{len(rows)} cases, {bad} not as expected")
PY
elif [ "$PART" = kb-native ]; then
  K=/tmp/cudarl-kb-native
  if [ "${ACTION:-start}" = start ]; then
    rm -rf "$K"; mkdir -p "$K"
    KS=${STORE:-$K/store}
    NVCC=$(command -v nvcc)
    cat > "$K/job.sh" <<EOF
set -uo pipefail
export CUDARL_WORKER=$NEW/cudarl-pipe-worker CUDARL_RUNNER=$NEW/cudarl-pipe-runner CUDARL_PYTHON=\$(command -v python3)
t0=\$(date +%s)
$NEW/cudarl-pipe --root . --store $KS run testgen --json > $K/testgen.jsonl 2> $K/testgen.err
echo "testgen rc=\$? \$(( \$(date +%s) - t0 )) s" > $K/testgen.txt
for f in tests/kernels/kb_native/*.cu; do
  n=\$(basename \$f .cu)
  [ -n "${KB_ONLY:-}" ] && ! echo " ${KB_ONLY:-} " | grep -q " \$n " && continue
  t1=\$(date +%s%N)
  wrap=; [ "${MODEL_NEW:-0}" = 1 ] && mkdir -p $K/wrap && wrap="--model-new $K/wrap/\$n.py"
  srcs="--source \$f"
  for r in \$(seq 2 ${REPEAT:-1}); do
    mkdir -p $K/rep; { cat \$f; echo "// candidate \$r"; } > $K/rep/\$n.\$r.cu; srcs="\$srcs --source $K/rep/\$n.\$r.cu"
  done
  timeout 400 $NEW/cudarl-pipe --root . --store $KS check --task kb/L1/\$n \$srcs \$wrap ${CHECK_FLAGS:-} --json > $K/\$n.json 2> $K/\$n.err
  echo "\$n \$? \$(( (\$(date +%s%N) - t1) / 1000000 ))" >> $K/ran.txt
done
# Torch-format candidates of the same problems in a folder (named by problem): built side by
# side (check --mode compile fills the build cache), then checked one at a time.
torch_format() { # dir ext
  t2=\$(date +%s)
  ls \$1/*.\$2 | xargs -P 16 -I{} sh -c 'n=\$(basename {} .'\$2'); timeout 400 $NEW/cudarl-pipe --root . --store $KS check --task kb/L1/\$n --source {} --mode compile --json > '\$1'/\$n.build.json 2> '\$1'/\$n.build.err'
  echo "torch builds \$(( \$(date +%s) - t2 )) s" >> \$1/builds.txt
  for f in \$1/*.\$2; do
    n=\$(basename \$f .\$2)
    t1=\$(date +%s%N)
    timeout 400 $NEW/cudarl-pipe --root . --store $KS check --task kb/L1/\$n --source \$f ${CHECK_FLAGS:-} --json > \$1/\$n.json 2> \$1/\$n.err
    echo "\$n \$? \$(( (\$(date +%s%N) - t1) / 1000000 ))" >> \$1/ran.txt
  done
}
# TORCH_EQUIV=1: the same kernels as torch extensions (scripts/gpu/kb_torch_equivalents.py).
if [ "${TORCH_EQUIV:-0}" = 1 ]; then
  python3 scripts/gpu/kb_torch_equivalents.py $K/torch > $K/torch.txt 2>&1
  torch_format $K/torch cu
fi
[ "${MODEL_NEW:-0}" = 1 ] && torch_format $K/wrap py
# nvcc's phases for each kernel alone, with the harness's compile flags to an object (no link,
# no shim), outside the sandbox.
mkdir -p $K/nvcc
for f in tests/kernels/kb_native/*.cu; do
  n=\$(basename \$f .cu)
  (cd $K/nvcc && $NVCC -gencode=arch=compute_90,code=sm_90 -std=c++17 -Xcompiler -fPIC -Xptxas -v -lineinfo -c --keep --keep-dir . -o k.o $PWD/\$f -time \$n.csv > /dev/null 2>&1)
done
touch $K/done
EOF
    start_detached "$K"
  fi
  wait_done "$K" "${WAIT_S:-540}"
  cat "$K/testgen.txt" 2>/dev/null || tail -c 400 "$K/testgen.err"
  python3 - "$K" "$OUT" <<'PY'
import json, pathlib, sys
k, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
rows = []
for line in (k / "ran.txt").read_text().splitlines() if (k / "ran.txt").exists() else []:
    n, rc, ms = line.split()
    try:
        vs = [json.loads(x) for x in (k / f"{n}.json").read_text().splitlines() if x.strip()]
        v = vs[0]
    except Exception:
        vs, v = [], {"failure": "no_verdict", "failure_detail": (k / f"{n}.err").read_text()[-400:]}
    t, tt = v.get("timing") or {}, v.get("torch_timing") or {}
    tc = v.get("torch_compile_timing") or {}
    phases = {}
    csv = k / "nvcc" / f"{n}.csv"
    for ln in csv.read_text().splitlines()[1:] if csv.exists() else []:
        c = [x.strip() for x in ln.split(",")]
        if len(c) >= 8 and c[7] == "ms":
            phases[c[1]] = phases.get(c[1], 0.0) + float(c[6])
    rows.append({"problem": f"kb/L1/{n}", "rc": int(rc), "check_ms": int(ms),
                 "compile_seconds": v.get("compile_seconds"), "cache_hit": v.get("cache_hit"),
                 "compiled": v.get("compiled"), "correct": v.get("correct"), "failure": v.get("failure"),
                 "failure_detail": (v.get("failure_detail") or "")[:300], "hack_flags": v.get("hack_flags"),
                 "tests": [[x.get("seed"), x.get("passed")] for x in v.get("tests") or []],
                 "full_size": v.get("full_size"), "median_ms": t.get("median_ms"),
                 "torch_median_ms": tt.get("median_ms"), "speedup_vs_torch": v.get("speedup_vs_torch"),
                 "torch_compile_median_ms": tc.get("median_ms"),
                 "speedup_vs_torch_compile": v.get("speedup_vs_torch_compile"),
                 "torch_compile_error": v.get("torch_compile_error"),
                 "worker_ms": v.get("worker_ms"), "nvcc_phase_ms": phases,
                 "repeats": [{"compile_seconds": x.get("compile_seconds"), "correct": x.get("correct"),
                              "failure": x.get("failure"), "worker_ms": x.get("worker_ms"),
                              "speedup_vs_torch": x.get("speedup_vs_torch")} for x in vs[1:]],
                 "gpu": (v.get("gpu") or {}).get("name")})
(out / "kb_native.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
# TORCH_EQUIV=1 / MODEL_NEW=1: each torch-format candidate's verdict beside the native one's.
def agreement(tdir):
  agree = []
  for line in (tdir / "ran.txt").read_text().splitlines() if (tdir / "ran.txt").exists() else []:
      n, rc, ms = line.split()
      try:
          v = json.loads((tdir / f"{n}.json").read_text())
      except Exception:
          v = {"failure": "no_verdict", "failure_detail": (tdir / f"{n}.err").read_text()[-400:]}
      try:
          b = json.loads((tdir / f"{n}.build.json").read_text())
      except Exception:
          b = {}
      nat = next((r for r in rows if r["problem"] == f"kb/L1/{n}"), {})
      agree.append({"problem": f"kb/L1/{n}", "rc": int(rc), "check_ms": int(ms),
                    "build_seconds": b.get("compile_seconds"),
                    "native": {"correct": nat.get("correct"), "failure": nat.get("failure"),
                               "speedup_vs_torch": nat.get("speedup_vs_torch")},
                    "torch": {"correct": v.get("correct"), "failure": v.get("failure"),
                              "failure_detail": (v.get("failure_detail") or "")[:300],
                              "speedup_vs_torch": v.get("speedup_vs_torch"),
                              "speedup_vs_torch_compile": v.get("speedup_vs_torch_compile"),
                              "median_ms": (v.get("timing") or {}).get("median_ms")},
                    "same_verdict": (nat.get("correct"), nat.get("failure")) == (v.get("correct"), v.get("failure"))})
  return agree
agree = agreement(k / "torch")
wrapped = agreement(k / "wrap")
for name, a in [("kb_torch_agreement.jsonl", agree), ("kb_model_new_agreement.jsonl", wrapped)]:
    if a:
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in a))
print(f"done: {(k / 'done').exists()}")
for r in rows:
    print(f"{r['problem']:48s} rc {r['rc']} build {r['compile_seconds'] or 0:5.2f}s correct {r['correct']} "
          f"{r['failure'] or ''} {r['median_ms'] or 0:.3f} ms vs torch {r['torch_median_ms'] or 0:.3f} ms "
          f"speedup {r['speedup_vs_torch'] or 0:.2f} vs compile {r['torch_compile_median_ms'] or 0:.3f} ms "
          f"speedup {r['speedup_vs_torch_compile'] or 0:.2f} nvcc {sum(r['nvcc_phase_ms'].values()):.0f} ms "
          f"{(r['torch_compile_error'] or '')[:80]} {r['failure_detail'][:120]}")
    for x in r["repeats"]:
        print(f"  again: build {x['compile_seconds'] or 0:5.2f}s correct {x['correct']} {x['failure'] or ''} "
              f"judge {(x['worker_ms'] or {}).get('total', 0):.0f} ms {x['worker_ms']}")
for a in agree + wrapped:
    print(f"{a['problem']:48s} torch-format: build {a['build_seconds'] or 0:5.1f}s correct {a['torch']['correct']} "
          f"{a['torch']['failure'] or ''} speedup {a['torch']['speedup_vs_torch'] or 0:.2f} (native "
          f"{a['native']['speedup_vs_torch'] or 0:.2f}) same verdict {a['same_verdict']} {a['torch']['failure_detail'][:100]}")
for label, a in [("torch-format equivalents", agree), ("ModelNew wrappers", wrapped)]:
    if a:
        print(f"{label}: {sum(x['same_verdict'] for x in a)}/{len(a)} same verdict as native")
PY
elif [ "$PART" = families ]; then
  S=$(mktemp -d); K=$(mktemp -d)
  CUDARL_WORKER=$NEW/cudarl-pipe-worker "$NEW/cudarl-pipe" --root . --store "$S" run synth-tasks > "$OUT/synth.log" 2>&1
  "$NEW/cudarl-pipe" --root . --store "$S" show synth-tasks --output tasks --json --head 100000 > "$K/tasks.jsonl"
  "$NEW/cudarl-pipe" --root . --store "$S" show synth-tasks --output task_kernels --json --head 100000 > "$K/kernels.jsonl"
  python3 - "$K" "${FAMILY_GROUPS:-conv:}" "${FAMILY_LIMIT:-24}" <<'PY'
import json, pathlib, sys
k, prefixes, limit = pathlib.Path(sys.argv[1]), sys.argv[2].split(), int(sys.argv[3])
tasks = [json.loads(l) for l in (k / "tasks.jsonl").read_text().splitlines() if l.strip()]
picked = []
for t in tasks:
    g = t.get("group") or ""
    if any(g.startswith(p) for p in prefixes) and len(picked) < limit:
        picked.append((t["task_id"], g))
rows = [json.loads(l) for l in (k / "kernels.jsonl").read_text().splitlines() if l.strip()]
with open(k / "list.txt", "w") as out:
    for tid, g in picked:
        files = []
        for r in rows:
            if r.get("task_id") == tid:
                f = k / f"{tid}__{r['file'].replace('/', '_')}"
                f.write_text(r["code"])
                files.append(str(f))
        out.write(" ".join([tid, g] + files) + "\n")
PY
  : > "$OUT/families.jsonl"
  while read -r tid g files; do
    srcs=""; for f in $files; do srcs="$srcs --source $f"; done
    timeout 300 "$NEW/cudarl-pipe" --root . --store "$S" check --task "$tid" $srcs --json < /dev/null 2>> "$OUT/families.err" > "$K/verdicts.jsonl"
    python3 - "$tid" "$g" "$files" "$K/verdicts.jsonl" >> "$OUT/families.jsonl" <<'PY'
import json, sys
files = sys.argv[3].split()
lines = [json.loads(x) for x in open(sys.argv[4]) if x.strip()]
for i, f in enumerate(files):
    v = lines[i] if i < len(lines) else {"failure": "no_verdict"}
    t = v.get("timing") or {}
    print(json.dumps({"task": sys.argv[1], "group": sys.argv[2], "file": f.rsplit("__", 1)[-1],
                      "compiled": v.get("compiled"), "correct": v.get("correct"), "failure": v.get("failure"),
                      "detail": (v.get("failure_detail") or "")[:300], "tests": len(v.get("tests") or []),
                      "median_ms": t.get("median_ms")}))
PY
  done < "$K/list.txt"
  python3 - "$OUT/families.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault(r["task"], []).append(r)
for t, rs in by.items():
    naive = next((r for r in rs if r["file"] == "naive.cu"), None)
    for r in rs:
        sp = (naive["median_ms"] / r["median_ms"]) if naive and naive.get("median_ms") and r.get("median_ms") else None
        r["speedup_vs_naive"] = sp
        print(f"{t:14} {r['group']:32} {str(r['file']):22} correct={r['correct']} ms={r['median_ms']} x_naive={sp and round(sp, 2)} {r['failure'] or ''} {r['detail'][:80]}")
with open(sys.argv[1], "w") as f:
    for rs in by.values():
        for r in rs:
            f.write(json.dumps(r) + "\n")
PY
elif [ "$PART" = serve-kb ]; then
  S=${STORE:-/tmp/cudarl-main/store}
  SF=(); for kv in ${SETS:-}; do SF+=(--set "$kv"); done
  export CUDARL_WORKER=$NEW/cudarl-pipe-worker CUDARL_RUNNER=$NEW/cudarl-pipe-runner
  export CUDARL_TRAINER=$NEW/cudarl-pipe-train CUDARL_PYTHON=$(command -v python3)
  $NEW/cudarl-pipe --root . --store "$S" serve --bind 127.0.0.1:8765 --deadline-s 500 "${SF[@]}" > "$OUT/serve.log" 2>&1 &
  SP=$!
  for _ in $(seq 120); do grep -q listening "$OUT/serve.log" && break; sleep 1; done
  python3 - "$OUT" <<'PY'
import json, pathlib, sys, time, urllib.request
out = pathlib.Path(sys.argv[1])
def post(path, body, timeout=560):
    t0 = time.time()
    req = urllib.request.Request("http://127.0.0.1:8765" + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            code, data = r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        code, data = e.code, json.loads(e.read() or b"{}")
    except Exception as e:
        code, data = None, {"error": str(e)}
    return {"status": code, "seconds": round(time.time() - t0, 1), "body": data}
res = {}
relu = pathlib.Path("tests/kernels/kb_native/19_ReLU.cu").read_text()
res["evaluate_native"] = post("/v1/evaluate", {"task_id": "kb/L1/19_ReLU", "source": relu})
wrap = pathlib.Path("/tmp/cudarl-kb-native/wrap/19_ReLU.py")
if wrap.exists():
    res["evaluate_model_new"] = post("/v1/evaluate", {"task_id": "kb/L1/19_ReLU", "source": wrap.read_text()})
res["optimize"] = post("/v1/optimize", {"problem_id": "kb/L1/19_ReLU", "samples": 2, "turns": 2})
(out / "serve_kb.json").write_text(json.dumps(res, indent=1))
for k, r in res.items():
    b = r["body"]
    v = b.get("verdict") or b
    print(f"{k:20s} HTTP {r['status']} {r['seconds']} s compiled {v.get('compiled')} correct {v.get('correct')} "
          f"failure {v.get('failure')} speedup {v.get('speedup_vs_torch')} {str(b.get('error') or b.get('detail') or '')[:200]}")
    if k == "optimize":
        print("  " + json.dumps({x: b.get(x) for x in b if x not in ("code", "model_new", "verdict")})[:600])
PY
  kill $SP 2>/dev/null; wait $SP 2>/dev/null
  tail -5 "$OUT/serve.log"
elif [ "$PART" = torch-build ]; then
  export CUDARL_RUNNER=$NEW/cudarl-pipe-runner CUDARL_PYTHON=$(command -v python3)
  "$NEW/cudarl-pipe" --root . bench torch-build --kernels "${KERNELS:-6}" --jobs "${JOBS:-4}" \
    --out "$OUT/torch_build.json" 2>&1 | tail -3
elif [ "$PART" = profile ]; then
  export CUDARL_WORKER=$NEW/cudarl-pipe-worker CUDARL_RUNNER=$NEW/cudarl-pipe-runner
  "${CUDARL_NCU:-/usr/local/cuda/bin/ncu}" --version | tail -1 > "$OUT/ncu.txt" 2>&1
  S=$(mktemp -d)
  : > "$OUT/profile.tsv"
  for k in vector_add/naive vector_add/vec4 row_sum/warp_shuffle matmul/tiled_4x4 softmax/naive; do
    for mode in plain profile; do
      flag=; [ $mode = profile ] && flag=--ncu
      timeout 300 "$NEW/cudarl-pipe" --root . --store "$S" check --task "${k%/*}" \
        --source "datasets/tasks/$k.cu" $flag --json > "$OUT/v.json" 2>/dev/null
      echo "$k $mode $(cat "$OUT/v.json" | tr -d '\n')" >> "$OUT/profile.tsv"
    done
  done
  python3 - "$OUT" <<'PY' | tee "$OUT/profile_summary.txt"
import json, sys
o = sys.argv[1]
rows = []
for line in open(f"{o}/profile.tsv"):
    k, mode, v = line.split(" ", 2)
    v = json.loads(v)
    p = v.get("profile") or {}
    rows.append({"kernel": k, "mode": mode, "correct": v.get("correct"),
                 "median_ms": (v.get("timing") or {}).get("median_ms"),
                 "dram_fraction_of_peak_judge": v.get("dram_fraction_of_peak"),
                 "profile": p or None, "profile_ms": (v.get("worker_ms") or {}).get("profile")})
    print(k, mode, v.get("correct"), rows[-1]["median_ms"], p.get("status"), p.get("metrics"), rows[-1]["profile_ms"])
json.dump(rows, open(f"{o}/profile_pass.json", "w"), indent=1)
PY
elif [ "$PART" = bench ]; then
  K=${KERNELS:-120}
  for side in new old; do
    ROOT=.
    if [ "$side" = old ]; then
      [ -n "${OLD:-}" ] || continue
      B=$(unpack "$OLD")
      # The other build's own configs and task families (`git archive` of its commit).
      ROOT=${OLD_ROOT:-.}
    else
      B=$NEW
    fi
    export CUDARL_WORKER=$B/cudarl-pipe-worker CUDARL_RUNNER=$B/cudarl-pipe-runner
    # TRACE=1: the new build's judge steps, timestamped, per worker process (CUDARL_JUDGE_TRACE).
    [ "$side" = new ] && [ -n "${TRACE:-}" ] && export CUDARL_JUDGE_TRACE=$OUT/judge_trace_validate.txt
    if [[ " ${BENCHES:-validate serve} " == *" validate "* ]]; then
      t0=$(date +%s)
      timeout ${BENCH_LIMIT:-280} "$B/cudarl-pipe" --root "$ROOT" bench validate --kernels "$K" --out "$OUT/bench_validate_$side.json" > /dev/null 2> "$OUT/bench_validate_$side.err"
      echo "bench validate $side rc=$? $(( $(date +%s) - t0 )) s"
    fi
    [ -n "${CUDARL_JUDGE_TRACE:-}" ] && export CUDARL_JUDGE_TRACE=$OUT/judge_trace_serve.txt
    if [[ " ${BENCHES:-validate serve} " == *" serve "* ]]; then
      t0=$(date +%s)
      timeout ${SERVE_LIMIT:-120} "$B/cudarl-pipe" --root "$ROOT" bench serve --clients ${SERVE_CLIENTS:-16} --seconds ${SERVE_SECONDS:-30} \
        --out "$OUT/bench_serve_$side.json" > /dev/null 2> "$OUT/bench_serve_$side.err"
      echo "bench serve $side rc=$? $(( $(date +%s) - t0 )) s"
    fi
    unset CUDARL_JUDGE_TRACE
  done
  # Single cases of tests/kernels/hacks/ named in $CASES (space-separated stems), new binaries.
  for c in ${CASES:-}; do
    CUDARL_WORKER=$NEW/cudarl-pipe-worker CUDARL_RUNNER=$NEW/cudarl-pipe-runner timeout 120 "$NEW/cudarl-pipe" --root . \
      --store "$(mktemp -d)" check --task vector_add --source "tests/kernels/hacks/$c.cu" --json 2>/dev/null \
      | python3 -c "import json,sys; v=json.load(sys.stdin); print('case $c:', v.get('failure'), v.get('hack_flags'), (v.get('failure_detail') or '')[:200])" \
      | tee -a "$OUT/bench_summary.txt"
  done
  python3 - "$OUT" <<'PY' | tee -a "$OUT/bench_summary.txt"
import json, os, sys
o = sys.argv[1]
def load(n):
    p = os.path.join(o, n)
    return json.load(open(p)) if os.path.exists(p) else None
for side in ["old", "new"]:
    v, s = load(f"bench_validate_{side}.json"), load(f"bench_serve_{side}.json")
    if v:
        print(side, "validate", {k: v.get(k) for k in ["kernels", "correct", "wall_s", "kernels_per_hour", "seconds_by_phase"]})
    if s:
        print(side, "serve", {k: s.get(k) for k in ["requests", "ok", "verdicts_per_second", "latency_ms"]})
vo, vn = load("bench_validate_old.json"), load("bench_validate_new.json")
if vo and vn:
    print("validate throughput new/old:", vn["kernels_per_hour"] / vo["kernels_per_hour"])
so, sn = load("bench_serve_old.json"), load("bench_serve_new.json")
if so and sn:
    print("serve verdicts/s new/old:", sn["verdicts_per_second"] / so["verdicts_per_second"],
          "p50 latency new/old:", sn["latency_ms"]["p50"] / so["latency_ms"]["p50"])
PY
fi
