#!/usr/bin/env bash
# `make run`'s main job on a GPU host without a Rust toolchain or make (the binaries come from
# `make carry`): `cudarl-pipe run rl-train eval` with the default pipeline on a cold store,
# timed, detached with setsid so it outlasts the shell that started it; `ACTION=wait` and
# `ACTION=collect` from later shells on the same host follow it and gather its results.
#   ACTION=start    starts it, then waits like `wait`
#   ACTION=wait     waits up to WAIT_S seconds (default 560), printing progress, then collects
#                   what is finished so far
#   ACTION=collect  writes the results to $OUT (main_job.json: wall time, per-node seconds,
#                   rl-train metrics and tiers, eval summary, sft-eval; eval_report.md) and
#                   prints a short table; the jsonl tables (turns, tasks) as tables.tar.gz
# SETS: extra `--set` values, space-separated (none for the default run); nested keys dotted
# (synth-tasks.generate.elementwise=48), not inline tables (their braces would expand).
# VARIANTS: after the main job, `run rl-train eval` again on the same store (everything before
# rl-train cached) once per variant, `name:key=value,key=value;name2:...`, each into
# variants/<name>/ (RL settings compared on the same SFT checkpoints).
# PARALLEL=1: the variants run at once, each on its own copy of the store (the store locks a
#   node per run); they share the GPU, so their timings (speedup, fast_p) are noisier than a
#   lone run's, while compile and pass rates are not affected.
#   MAX_PARALLEL (default 2) of them at a time: a 64-episode trainer takes 11-19 GB of the
#   GPU while generating, and four with their harness workers run out of an 80 GB H100
#   (rc 1, `trainer process ended: ... CUDA out of memory` in the variant's run.jsonl, which
#   the collector prints). Each variant has its own lock file.
#   Confirm a parallel result with a lone run.
# MAIN_TARGETS: the main job's targets, run as one command as `make run` does (default
#   "rl-train eval"; independent stages overlap, e.g. tokenizer and pretrain beside validate;
#   "sft-train-optimizer" stops at the SFT checkpoints and leaves RL to the variants).
#   Per-node seconds come from run.jsonl; their sum beside the wall time shows the overlap.
# VALIDATE_ALONE=1: then `run validate` again on a fresh store with nothing beside it; the
#   collector compares each kernel's timing with the main job's (where tokenizer and pretrain
#   ran beside validate, sharing the GPU through GpuLock / GpuShare): median ratio, spread,
#   and hack flags in each.
#   VALIDATE_UNBATCHED=1 as well: then once more on another fresh store with
#   validate.timing_batch=1 (one exclusive hold of the GPU per timed candidate):
#   validate_unbatched, its seconds and stats beside validate_alone's.
# GPU_TESTS=1: then the gated GPU tests (.carry/gpu-tests.gz, tests/gpu.rs); GPU_TESTS_SKIP:
#   test name filters to leave out, space-separated (e.g. torch_format, which needs more than
#   500 s alone).
# SFT_GROUPED=1: after the main job (before the variants), both SFT stages again on its store
#   from configs/model/small.toml with group_by_length = true (written here as
#   small_grouped.toml, not in the repository): sft_grouped.jsonl, length-grouped batching's
#   SFT seconds beside the main job's on the same machine.
# EXTRA_SHOW: node:output pairs (space-separated) shown after the main job as JSON Lines and
#   collected into main_job.json's "shown" (e.g. archive-native:summary); the nodes' notes
#   (stderr) go to its "notes".
# CUDARL_HOST_TMP: the folder the job lives in on the host (default /tmp), one per job where
#   several run on one host (scripts/gpu/rl_draw.sh's DRAWS, one GPU each).
# SEED_STORE: a store the job starts from (hard-linked), e.g. one where the nodes no seed reaches
#   already ran (scripts/gpu/rl_draw.sh's DRAWS); its cached nodes do not run again.
set -uo pipefail
. "$(dirname "$0")/detach.sh"
H=${CUDARL_HOST_TMP:-/tmp}
D=$H/cudarl-main
ACTION=${ACTION:-wait}
CARRY=${CARRY:-.carry}
B=$H/cudarl-bin
if [ "$ACTION" = start ]; then
  rm -rf "$D"; mkdir -p "$D" "$B"
  echo "${VARIANTS:-}" | tr ';' '\n' | sed '/^$/d' > "$D/variants.txt"
  echo "${MAIN_TARGETS:-rl-train eval}" > "$D/targets"
  for z in "$CARRY"/*.gz; do gzip -dc "$z" > "$B/$(basename "$z" .gz)"; chmod +x "$B/$(basename "$z" .gz)"; done
  # A store to start from, hard-linked (the store replaces files by rename, never in place): its
  # cached nodes do not run again. Its locks belong to the run that made it.
  if [ -n "${SEED_STORE:-}" ]; then cp -al "$SEED_STORE" "$D/store" && rm -rf "$D/store/locks"; fi
  cat > "$D/job.sh" <<EOF
set -uo pipefail
export CUDARL_WORKER=$B/cudarl-pipe-worker CUDARL_TRAINER=$B/cudarl-pipe-train
export LD_LIBRARY_PATH=\$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib:\${LD_LIBRARY_PATH:-}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:\$PATH
export CUDARL_PYTHON=\$(command -v python3)
nvidia-smi \${CUDA_VISIBLE_DEVICES:+-i \${CUDA_VISIBLE_DEVICES%%,*}} --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader > $D/gpu.txt
SETS=()
for kv in ${SETS:-}; do SETS+=(--set "\$kv"); done
date +%s > $D/start
rc=0
t0=\$(date +%s)
$B/cudarl-pipe --root . --store $D/store run ${MAIN_TARGETS:-rl-train eval} "\${SETS[@]}" --json >> $D/run.jsonl 2>> $D/run.err || rc=\$?
echo "${MAIN_TARGETS:-rl-train eval}: \$(( \$(date +%s) - t0 ))s rc=\$rc" >> $D/times.txt
echo \$rc > $D/rc
date +%s > $D/end
# What a run left in store \$1, into folder \$2 (the rest: the run's --set/--lock arguments).
outputs() {
  local S=\$1 O=\$2; shift 2
  for o in metrics tiers turns; do $B/cudarl-pipe --root . --store \$S show rl-train --output \$o --json --head 100000 "\$@" > \$O/rl_\$o.jsonl 2>/dev/null; done
  $B/cudarl-pipe --root . --store \$S show eval --output summary --json --head 100 "\$@" > \$O/eval_summary.jsonl 2>/dev/null
  $B/cudarl-pipe --root . --store \$S show eval --output turns --json --head 100000 "\$@" > \$O/eval_turns.jsonl 2>/dev/null
  # 'export' runs its node first: export a fresh eval only ('show' fails otherwise), or a main job
  # stopped at sft-train-optimizer would train and evaluate the default here, unrecorded, and
  # the default-config variant would then find rl-train and eval cached.
  $B/cudarl-pipe --root . --store \$S show eval --output summary "\$@" > /dev/null 2>&1 &&
    $B/cudarl-pipe --root . --store \$S export eval --output report --to \$O/export "\$@" > /dev/null 2>&1
}
outputs $D/store $D "\${SETS[@]}"
for ns in ${EXTRA_SHOW:-}; do
  $B/cudarl-pipe --root . --store $D/store show "\${ns%%:*}" --output "\${ns#*:}" --json --head 100000 "\${SETS[@]}" > "$D/show_\${ns%%:*}_\${ns#*:}.jsonl" 2>/dev/null
done
$B/cudarl-pipe --root . --store $D/store show sft-eval --output sft_eval --json --head 1000 "\${SETS[@]}" > $D/sft_eval.jsonl 2>/dev/null
$B/cudarl-pipe --root . --store $D/store show synth-tasks --output tasks --json --head 100000 "\${SETS[@]}" > $D/tasks.jsonl 2>/dev/null
$B/cudarl-pipe --root . --store $D/store show validate --output validations --json --head 100000 "\${SETS[@]}" > $D/validations.jsonl 2>/dev/null
if [ "${SFT_GROUPED:-0}" = 1 ]; then
  sed 's/^\[sft\]$/[sft]\ngroup_by_length = true/' configs/model/small.toml > configs/model/small_grouped.toml
  $B/cudarl-pipe --root . --store $D/store run sft-train-optimizer "\${SETS[@]}" --set sft-train.model=small_grouped --set sft-train-optimizer.model=small_grouped --lock $D/sft_grouped.lock --json > $D/sft_grouped.jsonl 2>> $D/run.err
fi
variant() {
  local name=\$1 kvs=\$2 V=$D/variants/\$1 S=$D/store
  mkdir -p \$V
  if [ "${PARALLEL:-0}" = 1 ]; then S=\$V/store; cp -r $D/store \$S; rm -rf \$S/locks; fi
  local VS=("\${SETS[@]}")
  for kv in \${kvs//,/ }; do VS+=(--set "\$kv"); done
  local t0=\$(date +%s)
  # Its own lock file: parallel runs must not record their keys in one cudarl.lock.
  VS+=(--lock \$V/cudarl.lock)
  $B/cudarl-pipe --root . --store \$S run rl-train eval "\${VS[@]}" --json > \$V/run.jsonl 2> \$V/run.err
  echo \$? > \$V/rc; echo \$(( \$(date +%s) - t0 )) > \$V/wall
  outputs \$S \$V "\${VS[@]}"
}
while IFS=: read -r name kvs; do
  if [ "${PARALLEL:-0}" = 1 ]; then
    # At most MAX_PARALLEL at once (default 2): four 64-episode trainers overflow an 80 GB GPU.
    while [ "\$(jobs -rp | wc -l)" -ge ${MAX_PARALLEL:-2} ]; do wait -n; done
    variant "\$name" "\$kvs" < /dev/null &
  else
    variant "\$name" "\$kvs"
  fi
done < $D/variants.txt
wait
if [ "${VALIDATE_ALONE:-0}" = 1 ]; then
  t0=\$(date +%s)
  $B/cudarl-pipe --root . --store $D/store2 run validate "\${SETS[@]}" --lock $D/validate_alone.lock --json > $D/validate_alone.jsonl 2>> $D/run.err
  echo \$(( \$(date +%s) - t0 )) > $D/validate_alone.wall
  $B/cudarl-pipe --root . --store $D/store2 show validate --output validations --json --head 100000 "\${SETS[@]}" --lock $D/validate_alone.lock > $D/validations_alone.jsonl 2>/dev/null
  if [ "${VALIDATE_UNBATCHED:-0}" = 1 ]; then
    t0=\$(date +%s)
    $B/cudarl-pipe --root . --store $D/store3 run validate "\${SETS[@]}" --set validate.timing_batch=1 --lock $D/validate_unbatched.lock --json > $D/validate_unbatched.jsonl 2>> $D/run.err
    echo \$(( \$(date +%s) - t0 )) > $D/validate_unbatched.wall
  fi
fi
if [ "${GPU_TESTS:-0}" = 1 ]; then
  t0=\$(date +%s)
  CUDARL_GPU=1 CUDARL_BIN=$B/cudarl-pipe CUDARL_TEST_REPO=\$PWD timeout 900 $B/gpu-tests --include-ignored --test-threads 1 --nocapture $(for s in ${GPU_TESTS_SKIP:-}; do printf -- '--skip %s ' "$s"; done) > $D/gpu_tests.log 2>&1
  echo \$? > $D/gpu_tests.rc; echo \$(( \$(date +%s) - t0 )) > $D/gpu_tests.wall
fi
touch $D/done
EOF
  # The heredoc above expands \$ and backquotes when it is written: a backquoted word in one of
  # its comments would run as a command and could leave job.sh unparsable.
  start_detached "$D"
  ACTION=wait
fi
if [ "$ACTION" = wait ]; then
  wait_done "$D" "${WAIT_S:-560}"
  echo "done: $([ -f "$D/done" ] && echo yes || echo no); elapsed $(( $(date +%s) - $(cat $D/start 2>/dev/null || date +%s) )) s"
  cat "$D/times.txt" 2>/dev/null
  for v in "$D"/variants/*/; do [ -d "$v" ] && echo "variant $(basename "$v"): rc $(cat "$v/rc" 2>/dev/null || echo running) $(cat "$v/wall" 2>/dev/null)s"; done
  tail -c 1500 "$D/run.err"
  # Collect what is there every time (a host lost before the end keeps what was collected).
  ACTION=collect
fi
if [ "$ACTION" = collect ]; then
  python3 - "$D" "$OUT" <<'PY'
import json, sys, os, pathlib
d, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
def jl(name, base=d):
    p = base / name
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []
recs = jl("run.jsonl")
nodes = {r.get("node"): {k: r.get(k) for k in ("status", "seconds", "stats", "error") if r.get(k) is not None}
         for r in recs if r.get("node") and r.get("status") != "cached"}
res = {
    "gpu": (d / "gpu.txt").read_text().strip() if (d / "gpu.txt").exists() else None,
    "command": "cudarl-pipe run " + ((d / "targets").read_text().strip() if (d / "targets").exists() else "?") + " (one command, cold store)",
    "rc": int((d / "rc").read_text()) if (d / "rc").exists() else None,
    "wall_s": int((d / "end").read_text()) - int((d / "start").read_text()) if (d / "end").exists() else None,
    "nodes": nodes,
    "rl_metrics": jl("rl_metrics.jsonl"),
    "rl_tiers": jl("rl_tiers.jsonl"),
    "eval_summary": jl("eval_summary.jsonl"),
    "sft_eval": jl("sft_eval.jsonl"),
    "variants": {},
}
for v in sorted((d / "variants").glob("*/")):
    spec = next((l for l in (d / "variants.txt").read_text().splitlines() if l.split(":")[0] == v.name), "")
    res["variants"][v.name] = {
        "sets": spec.partition(":")[2],
        "rc": int((v / "rc").read_text()) if (v / "rc").exists() else None,
        "wall_s": int((v / "wall").read_text()) if (v / "wall").exists() else None,
        # Per node: status (ran / cached / failed) and seconds, from the run's own records.
        "nodes": {r["node"]: [r.get("status"), round(r.get("seconds") or 0, 1)] for r in jl("run.jsonl", v) if r.get("node")},
        # A failed stage's error is a JSON record on stdout (`--json`), not on stderr.
        "errors": {r["node"]: r.get("error") for r in jl("run.jsonl", v) if r.get("node") and r.get("status") == "failed"},
        "stderr_tail": (v / "run.err").read_text()[-1500:] if (v / "run.err").exists() else "",
        "rl_metrics": jl("rl_metrics.jsonl", v),
        "eval_summary": jl("eval_summary.jsonl", v),
    }
    for p in (v / "export").rglob("report.md"):
        (out / f"eval_report_{v.name}.md").write_text(p.read_text())
    for t in ("rl_turns", "eval_turns"):
        if (v / f"{t}.jsonl").exists():
            (out / f"{t}_{v.name}.jsonl").write_text((v / f"{t}.jsonl").read_text())
su = [r for r in jl("sft_grouped.jsonl") if r.get("node") in ("sft-train", "sft-train-optimizer")]
if su:
    res["sft_grouped"] = {r["node"]: {"status": r.get("status"), "seconds": r.get("seconds"),
                                      "main_job_seconds": nodes.get(r["node"], {}).get("seconds")} for r in su}
if (d / "gpu_tests.log").exists():
    # Still running: what has finished so far (--nocapture prints a failure's panic as it happens).
    log = (d / "gpu_tests.log").read_text()
    done = (d / "gpu_tests.rc").exists()
    res["gpu_tests"] = {"rc": int((d / "gpu_tests.rc").read_text()) if done else None,
                        "wall_s": int((d / "gpu_tests.wall").read_text()) if done else None,
                        "results": [l for l in log.splitlines() if l.startswith("test ") or "test result" in l],
                        "panics": [l for l in log.splitlines() if "panicked at" in l or l.startswith("assertion")][:20]}
    (out / "gpu_tests.log").write_text(log)
def vsum(rows):
    flags = {}
    for r in rows:
        for f in r.get("hack_flags") or []:
            flags[f] = flags.get(f, 0) + 1
    return {"rows": len(rows), "correct": sum(1 for r in rows if r.get("correct")),
            "timed": sum(1 for r in rows if r.get("median_ms")), "hack_flags": flags}
v1, v2 = jl("validations.jsonl"), jl("validations_alone.jsonl")
if v1:
    res["validations"] = vsum(v1)
    res["validations_not_correct"] = [
        {k: (str(r.get(k))[:300] if k == "failure_detail" else r.get(k))
         for k in ("kernel_id", "task_id", "role", "compiled", "correct", "failure", "failure_detail")}
        for r in v1 if not r.get("correct")][:100]
if v2:
    import math, statistics
    a = {r["kernel_id"]: r for r in v1 if r.get("median_ms")}
    ratios = sorted(a[r["kernel_id"]]["median_ms"] / r["median_ms"] for r in v2
                    if r.get("median_ms") and r["kernel_id"] in a)
    q = lambda p: ratios[min(len(ratios) - 1, int(p * len(ratios)))]
    res["validate_alone"] = {
        "wall_s": int((d / "validate_alone.wall").read_text()) if (d / "validate_alone.wall").exists() else None,
        "seconds": next((r.get("seconds") for r in jl("validate_alone.jsonl") if r.get("node") == "validate"), None),
        "alone": vsum(v2), "kernels_timed_in_both": len(ratios),
        "median_ms_ratio_main_over_alone": {"p10": q(0.1), "median": q(0.5), "p90": q(0.9),
            "geomean": math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else None,
            "beyond_1_5x": sum(1 for x in ratios if x > 1.5 or x < 1 / 1.5)}} if ratios else {}
if nodes.get("validate", {}).get("stats"):
    res.setdefault("validate_runs", {})["main_job"] = {
        "wall_s": None, "seconds": nodes["validate"].get("seconds"), "stats": nodes["validate"]["stats"]}
for name in ("validate_alone", "validate_unbatched"):
    run = [r for r in jl(f"{name}.jsonl") if r.get("node") == "validate"]
    if run:
        res.setdefault("validate_runs", {})[name] = {
            "wall_s": int((d / f"{name}.wall").read_text()) if (d / f"{name}.wall").exists() else None,
            "seconds": run[0].get("seconds"), "stats": run[0].get("stats")}
res["shown"] = {f.stem[len("show_"):]: jl(f.name) for f in sorted(d.glob("show_*.jsonl"))}
err = (d / "run.err").read_text(errors="replace") if (d / "run.err").exists() else ""
res["notes"] = [l.strip() for l in err.splitlines() if l.strip().startswith("note ")]
(out / "main_job.json").write_text(json.dumps(res, indent=1))
for p in (d / "export").rglob("report.md"):
    (out / "eval_report.md").write_text(p.read_text())
for t in ("rl_turns", "eval_turns", "tasks"):
    (out / f"{t}.jsonl").write_text((d / f"{t}.jsonl").read_text() if (d / f"{t}.jsonl").exists() else "")
print(f"wall {res['wall_s']} s, rc {res['rc']}")
for n, v in nodes.items():
    print(f"  {n:22s} {v.get('status', ''):8s} {v.get('seconds', 0) or 0:8.1f} s")
    if v.get("error"):
        print(f"    error: {str(v['error'])[:600]}")
def rate(x):
    return "n/a" if x is None else f"{x:.2f}"
for m in res["rl_metrics"]:
    # A rate is null where nothing was there to count (no candidate compiled: no pass rate).
    print(f"  step {m['step']} tier {m['tier']} reward {m['mean_reward']:.3f}±{m.get('reward_std', 0):.3f} "
          f"compile {rate(m['compile_rate'])} pass {rate(m['pass_rate'])} gen {m['gen_seconds']:.0f}s "
          f"harness {m['harness_seconds']:.0f}s update {m['update_seconds']:.1f}s")
def show_eval(rows):
  for e in rows:
    def r(k):
        return "n/a" if e.get(k) is None else f"{e[k]:.3f}"
    print(f"  eval {e['checkpoint']:4s} {e['split']:5s} n={e['episodes']} compile {e['compile_rate']:.3f} "
          f"pass {r('pass_rate')} (1-turn {r('single_turn_pass_rate')}) "
          f"fast_1 {r('fast_1')} reward {e['mean_reward']:.3f}")
    print(f"       {e.get('candidates')} candidates: gen {e.get('gen_seconds') or 0:.0f}s harness "
          f"{e.get('harness_seconds') or 0:.0f}s (compile {e.get('harness_compile_seconds') or 0:.0f}, "
          f"gpu {e.get('harness_gpu_seconds') or 0:.0f}, sass {e.get('harness_sass_seconds') or 0:.0f})")
show_eval(res["eval_summary"])
for name, v in res["variants"].items():
    print(f"variant {name} ({v['sets']}): rc {v['rc']} {v['wall_s']} s")
    for n, e in v["errors"].items():
        print(f"  FAILED {n}: {str(e)[:600]}")
    if v["rc"] and v["stderr_tail"]:
        print("  stderr: " + v["stderr_tail"][-600:])
    for m in v["rl_metrics"]:
        print(f"  step {m['step']} reward {m['mean_reward']:.3f}±{m.get('reward_std', 0):.3f} pass {m.get('pass_rate') or 0:.2f} "
              f"signal {m.get('signal_groups', 0):.2f} kl {m.get('kl', 0):.4f} ent {m.get('entropy', 0):.3f}")
    show_eval(v["eval_summary"])
# How often a turn's code carries the asked expression (generated elementwise families: the
# description is `out[i] = EXPR for i in [0, n)`), per checkpoint and agent (docs/experiments.md,
# "Why does the generator miss families it has not seen?").
import re
tasks = {}
for t in jl("tasks.jsonl"):
    m = re.match(r"out\[i\] = (.*) for i in \[0, n\)", t.get("description", ""))
    if m:
        tasks[t["task_id"]] = m.group(1)
def copy_rates(path):
    if not path.exists():
        return {}
    c = {}
    for line in path.read_text().splitlines():
        r = json.loads(line) if line.strip() else None
        if not r or r["task_id"] not in tasks or not r.get("code"):
            continue
        e = tasks[r["task_id"]]
        k = f"{r.get('checkpoint', 'rl-train')}/{r['role']}"
        hit = e in r["code"] or e.replace("[i]", "") in r["code"]
        c.setdefault(k, [0, 0])
        c[k][0] += hit
        c[k][1] += 1
    return c
for name, path in [("main", d / "eval_turns.jsonl")] + [
        (v.name, v / "eval_turns.jsonl") for v in sorted((d / "variants").glob("*/"))]:
    rates = copy_rates(path)
    if rates:
        print(f"expression copied ({name} eval): " + ", ".join(f"{k} {a}/{n}" for k, (a, n) in sorted(rates.items())))
if "validations" in res:
    print(f"validations (main job): {res['validations']}")
    for r in res.get("validations_not_correct", [])[:25]:
        print(f"  not correct: {r['kernel_id']} {r['task_id']} {r['failure']}: {(r['failure_detail'] or '')[:120]}")
if "sft_grouped" in res:
    print(f"sft grouped vs the main job's (seconds): {json.dumps(res['sft_grouped'])}")
if "validate_alone" in res:
    print(f"validate alone: {json.dumps(res['validate_alone'])}")
for name, r in res.get("validate_runs", {}).items():
    st = r.get("stats") or {}
    print(f"{name}: {r['seconds']} s (wall {r['wall_s']} s) gpu_ms {st.get('gpu_ms')} timer_ms {st.get('timer_ms')} "
          f"tests {st.get('worker_tests_ms')} timing {st.get('worker_timing_ms')} torch {st.get('worker_torch_ms')} "
          f"transfer {st.get('worker_transfer_ms')} compile {st.get('compile_ms_summed')} gpu_wait {st.get('gpu_wait_ms')}")
for line in res["notes"]:
    print(line[:300])
for name, rows in res["shown"].items():
    if len(rows) <= 12:
        print(f"{name}: " + "; ".join(json.dumps(r) for r in rows))
if "gpu_tests" in res:
    print(f"gpu tests rc {res['gpu_tests']['rc']} in {res['gpu_tests']['wall_s']} s")
    print("\n".join(res["gpu_tests"]["results"] + res["gpu_tests"]["panics"]))
PY
  # The device returns at most 8 files: the turns and task tables travel as one archive.
  if ls "$OUT"/*.jsonl >/dev/null 2>&1; then
    (cd "$OUT" && tar czf tables.tar.gz ./*.jsonl && rm -f ./*.jsonl)
  fi
fi
