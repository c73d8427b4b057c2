//! The DAG engine end to end on the bundled real data: determinism, caching, `--set`,
//! early cutoff, explain, status, dag, show, export, gc.

mod common;

use common::*;

const NODES: [&str; 5] = [
    "ingest-kernelbench",
    "ingest-sakana",
    "ingest-cuda-l1",
    "splits",
    "curriculum",
];

#[test]
fn two_clean_runs_give_identical_hashes() {
    let a = Project::new();
    let b = Project::new();
    // Hidden test seeds come from each store's secret salt; stores that share it reproduce
    // each other byte for byte (without it, `testgen`'s hidden rows, and so downstream keys,
    // differ by design).
    for p in [&a, &b] {
        std::fs::create_dir_all(p.store()).unwrap();
        std::fs::write(p.store().join("hidden-salt"), b"shared test salt").unwrap();
    }
    let (ca, ma) = a.run_json(&["run", "curriculum"]);
    let (cb, mb) = b.run_json(&["run", "curriculum", "-j", "1"]);
    assert_eq!((ca, cb), (0, 0));
    for n in NODES {
        assert_eq!(status_of(&ma, n), "ran");
        assert_eq!(ma[n]["key"], mb[n]["key"], "key of {n}");
        assert_eq!(ma[n]["outputs"], mb[n]["outputs"], "outputs of {n}");
    }
    assert_eq!(ma["ingest-kernelbench"]["outputs"]["problems"]["rows"], 270);
    assert_eq!(ma["ingest-sakana"]["outputs"]["kernels"]["rows"], 102);
    // 250 KernelBench problems (levels 1-3) + the 2 task families of the test project.
    assert_eq!(ma["curriculum"]["outputs"]["curriculum"]["rows"], 252);
    assert_eq!(ma["curriculum"]["outputs"]["gates"]["rows"], 4);
    // The lock file records the same lineage in both projects.
    let la = std::fs::read_to_string(a.path("cudarl.lock")).unwrap();
    let lb = std::fs::read_to_string(b.path("cudarl.lock")).unwrap();
    assert_eq!(la, lb);
    assert!(la.contains("[nodes.curriculum.outputs.curriculum]"), "{la}");
}

#[test]
fn cached_rerun_set_param_and_explain() {
    let p = Project::new();
    assert_eq!(p.run_json(&["run", "curriculum"]).0, 0);
    let (c, m) = p.run_json(&["run", "curriculum"]);
    assert_eq!(c, 0);
    for n in NODES {
        assert_eq!(status_of(&m, n), "cached", "{n}");
    }
    let base_curr = out_hash(&m, "curriculum", "curriculum");

    // status with --set: only the splits and the curriculum are stale, and explain says why.
    let st = p.run(&["status", "--set", "splits.seed=7"]);
    let text = stdout(&st);
    assert!(text.contains("FRESH    ingest-sakana"), "{text}");
    assert!(text.contains("STALE    splits"), "{text}");
    assert!(text.contains("STALE    curriculum"), "{text}");
    let ex = p.run(&["explain", "splits", "--set", "splits.seed=7"]);
    let text = stdout(&ex);
    assert!(text.contains("splits is stale"), "{text}");
    assert!(text.contains("params changed: seed 0 -> 7"), "{text}");

    let (c, m) = p.run_json(&["run", "curriculum", "--set", "splits.seed=7"]);
    assert_eq!(c, 0);
    for n in &NODES[..3] {
        assert_eq!(status_of(&m, n), "cached", "{n}");
    }
    assert_eq!(status_of(&m, "splits"), "ran");
    assert_eq!(m["splits"]["reasons"][0], "params changed: seed 0 -> 7");
    assert_eq!(status_of(&m, "curriculum"), "ran");
    assert_ne!(
        out_hash(&m, "curriculum", "curriculum"),
        base_curr,
        "a new seed gives new splits"
    );

    // Back to seed 0: the old key is still in the store.
    let (_, m) = p.run_json(&["run", "curriculum"]);
    assert_eq!(status_of(&m, "curriculum"), "cached");
    assert_eq!(out_hash(&m, "curriculum", "curriculum"), base_curr);

    // --force re-runs and yields the same bytes.
    let (_, m) = p.run_json(&["run", "curriculum", "--force", "curriculum"]);
    assert_eq!(status_of(&m, "curriculum"), "ran");
    assert_eq!(m["curriculum"]["reasons"][0], "forced with --force");
    assert_eq!(out_hash(&m, "curriculum", "curriculum"), base_curr);
}

/// Rewrites a Parquet file with our writer (different bytes, same rows).
fn rewrite_same_rows(path: &std::path::Path) {
    let t = cudarl_data::Table::read(path, "x").unwrap();
    cudarl_data::write_parquet(path, &t.batch).unwrap();
}

#[test]
fn input_edit_reruns_ingest_and_early_cutoff_spares_downstream() {
    let p = Project::new();
    let (_, m0) = p.run_json(&["run", "curriculum"]);
    let problems = p.path("datasets/kernelbench/problems.parquet");
    let before = std::fs::read(&problems).unwrap();
    rewrite_same_rows(&problems);
    assert_ne!(
        std::fs::read(&problems).unwrap(),
        before,
        "file bytes changed"
    );

    let ex = stdout(&p.run(&["explain", "ingest-kernelbench"]));
    assert!(ex.contains("input `source` changed"), "{ex}");
    assert!(ex.contains("file problems.parquet content changed"), "{ex}");
    let st = stdout(&p.run(&["status"]));
    assert!(st.contains("STALE    ingest-kernelbench"), "{st}");
    assert!(
        st.contains("upstream `ingest-kernelbench` is not fresh"),
        "{st}"
    );

    let (c, m) = p.run_json(&["run", "curriculum"]);
    assert_eq!(c, 0);
    assert_eq!(status_of(&m, "ingest-kernelbench"), "ran");
    // Same rows -> same output bytes -> everything downstream keeps its key.
    assert_eq!(
        out_hash(&m, "ingest-kernelbench", "problems"),
        out_hash(&m0, "ingest-kernelbench", "problems")
    );
    for n in &NODES[1..] {
        assert_eq!(
            status_of(&m, n),
            "cached",
            "{n} must be spared by early cutoff"
        );
    }

    // A real content change propagates: drop level 4 rows -> problems changes -> all re-run.
    let t = cudarl_data::Table::read(&problems, "x").unwrap();
    let lv = t.req_ints("level").unwrap();
    let keep = arrow::array::BooleanArray::from(
        (0..t.rows())
            .map(|i| lv.get(i) != Some(4))
            .collect::<Vec<_>>(),
    );
    let filtered = arrow::compute::filter_record_batch(&t.batch, &keep).unwrap();
    cudarl_data::write_parquet(&problems, &filtered).unwrap();
    let (c, m) = p.run_json(&["run", "curriculum"]);
    assert_eq!(c, 0);
    assert_eq!(m["ingest-kernelbench"]["outputs"]["problems"]["rows"], 250);
    for n in NODES {
        assert_eq!(status_of(&m, n), "ran", "{n}");
    }
}

#[test]
fn editing_op_categories_reruns_only_curriculum() {
    let p = Project::new();
    p.run_json(&["run", "curriculum"]);
    let f = p.path("configs/curriculum/op_categories.toml");
    let text = std::fs::read_to_string(&f).unwrap();
    std::fs::write(
        &f,
        text.replace("unknown_op_tier = 2", "unknown_op_tier = 3"),
    )
    .unwrap();
    let ex = stdout(&p.run(&["explain", "curriculum"]));
    assert!(ex.contains("input `op_categories` changed"), "{ex}");
    let (_, m) = p.run_json(&["run", "curriculum"]);
    assert_eq!(status_of(&m, "curriculum"), "ran");
    assert_eq!(status_of(&m, "ingest-kernelbench"), "cached");
}

#[test]
fn status_dag_show_and_gc() {
    let p = Project::new();
    p.run_json(&["run", "ingest-kernelbench"]);
    let o = p.run(&["status", "curriculum", "--exit-code"]);
    let st = stdout(&o);
    assert!(st.contains("FRESH    ingest-kernelbench"), "{st}");
    assert!(st.contains("MISSING  curriculum"), "{st}");
    // A last line counts them; `--exit-code` is 1 while anything reported is not fresh.
    let n = |w: &str| st.lines().filter(|l| l.starts_with(w)).count();
    assert_eq!(n("FRESH"), 1, "{st}");
    assert_eq!(
        st.lines().last().unwrap_or_default(),
        format!(
            "1 of {} nodes fresh, 0 stale, {} missing",
            1 + n("MISSING"),
            n("MISSING")
        ),
        "{st}"
    );
    assert_eq!(o.status.code(), Some(1), "{st}");
    assert_eq!(p.run(&["status", "curriculum"]).status.code(), Some(0));
    let (_, sj) = p.run_json(&["status", "curriculum"]);
    assert_eq!(status_of(&sj, "curriculum"), "missing");
    p.run_json(&["run", "curriculum"]);
    let (_, sj) = p.run_json(&["status", "curriculum"]);
    for n in NODES {
        assert_eq!(status_of(&sj, n), "fresh");
        assert_eq!(sj[n]["key"].as_str().unwrap().len(), 64);
    }
    let o = p.run(&["status", "curriculum", "--exit-code"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    // Given no target, every node is listed and `--exit-code` is about what the pipeline's
    // default targets need (the main job has not run).
    let o = p.run(&["status", "--exit-code"]);
    let st = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{st}");
    assert!(
        st.lines()
            .last()
            .unwrap_or_default()
            .contains("; the default targets (rl-train, eval) need ")
            && st.contains("MISSING  sft-eval"),
        "{st}"
    );

    let dot = stdout(&p.run(&["dag", "--format", "dot"]));
    assert!(dot.contains("ingest_kernelbench -> curriculum"), "{dot}");
    // The curriculum feeds training: sft-data takes the families' splits from it, and
    // rl-train and eval read sft-data's.
    assert!(dot.contains("curriculum -> sft_data"), "{dot}");
    assert!(!dot.contains("validate_archive -> curriculum"), "{dot}");
    let mm = stdout(&p.run(&["dag", "--format", "mermaid"]));
    assert!(mm.starts_with("flowchart LR"), "{mm}");
    let dj: serde_json::Value =
        serde_json::from_str(&stdout(&p.run(&["dag", "--format", "json"]))).unwrap();
    // ingest x3, splits (2 inputs: problems, tasks), curriculum (7 inputs, the splits among
    // them; the archives' verdicts only with `archive`), synth-tasks, validate (task kernels),
    // validate-archive, kb-specs, testgen, sft-repairs (2 inputs), sft-data (5: the curriculum's
    // splits), tokenizer (3: the splits keep the hold-out out of its corpus), pretrain (5),
    // sft-train (generator), sft-train-optimizer, sft-eval, rl-train (7 inputs: PPO-ptx reads
    // sft-data's optimizer table; the splits), eval (14: with `kernelbench_samples`, the
    // curriculum's KernelBench test problems, their source, launchers and recorded tests; the
    // splits; rl-train's turns, the KernelBench problems RL practised); pretrain reads synth-tasks' tasks for its copy documents (the expressions they
    // must not show); collab-data (7), collab-sft and collab-sft-optimizer (2 each);
    // `optimize`'s chain: optimize-problem, optimize-specs (1), optimize-tests (2), optimize (5:
    // the problem, its launcher and tests, the RL agents); archive-native (6: both archives and
    // the curriculum's KernelBench inputs).
    assert_eq!(dj["nodes"].as_array().unwrap().len(), 27);
    assert_eq!(dj["edges"].as_array().unwrap().len(), 88);
    assert!(dot.contains("splits -> curriculum"), "{dot}");
    assert!(dot.contains("splits -> tokenizer"), "{dot}");
    assert!(dot.contains("splits -> pretrain"), "{dot}");
    assert!(dot.contains("curriculum -> eval"), "{dot}");
    assert!(dot.contains("testgen -> eval"), "{dot}");

    let show = stdout(&p.run(&["show", "ingest-kernelbench", "--head", "3"]));
    assert!(show.contains("270 rows"), "{show}");
    assert!(
        show.contains("kb/L1/1_Square_matrix_multiplication_"),
        "{show}"
    );
    let sj = stdout(&p.run(&["show", "curriculum", "--output", "gates", "--json"]));
    let rows: Vec<serde_json::Value> = sj
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[0]["min_compile_rate"], 0.9);
    assert_eq!(rows[0]["min_pass_rate"], 0.75);
    let total: i64 = rows.iter().map(|r| r["problems"].as_i64().unwrap()).sum();
    assert_eq!(total, 252);
    // Null fields are written as null, not left out: every row has every column.
    let sj = stdout(&p.run(&["show", "curriculum", "--json", "--head", "1000"]));
    let synth = sj
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["source"] == "synthetic")
        .expect("a synthetic row");
    assert!(synth["level"].is_null(), "{synth}");
    assert_eq!(synth.as_object().unwrap().len(), 19, "{synth}");
    // show of a stale node says to run it, exit 1
    let o = p.run(&["show", "curriculum", "--set", "splits.seed=9"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("run `cudarl-pipe run curriculum` first"),
        "{}",
        stderr(&o)
    );

    // Make two more curriculum versions, then gc keeps only the lock file's and the newest.
    p.run_json(&["run", "curriculum", "--set", "splits.seed=1"]);
    p.run_json(&["run", "curriculum", "--set", "splits.seed=2"]);
    p.run_json(&["run", "curriculum"]);
    let manifests = |p: &Project| {
        std::fs::read_dir(p.store().join("ac/curriculum"))
            .unwrap()
            .count()
    };
    assert_eq!(manifests(&p), 3);
    // A dry run names what would go and deletes nothing.
    let dry: serde_json::Value = serde_json::from_str(&stdout(&p.run(&[
        "gc",
        "--keep-last",
        "1",
        "--dry-run",
        "--json",
    ])))
    .unwrap();
    assert_eq!(dry["dry_run"], true, "{dry}");
    assert_eq!(manifests(&p), 3);
    let g: serde_json::Value =
        serde_json::from_str(&stdout(&p.run(&["gc", "--keep-last", "1", "--json"]))).unwrap();
    for k in [
        "manifests_removed",
        "blobs_removed",
        "bytes_freed",
        "manifests",
    ] {
        assert_eq!(dry[k], g[k], "{k}: {dry} vs {g}");
    }
    // Newest by time is the seed-0 re-run?  No: it was cached, so the newest file is seed 2;
    // the lock file names seed 0. Both stay, seed 1 goes, of the splits and the curriculum.
    let gone: Vec<&str> = g["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().split('/').next().unwrap())
        .collect();
    assert_eq!(gone, ["curriculum", "splits"], "{g}");
    assert_eq!(g["manifests_removed"], 2, "{g}");
    // splits, curriculum, gates and validated_kernels of seed 1, and the compiled shared objects
    // of the compile cache (no manifest names them: gc reclaims them, a later compile rebuilds
    // them).
    assert!(g["blobs_removed"].as_u64().unwrap() >= 4, "{g}");
    assert_eq!(manifests(&p), 2);
    let (_, sj) = p.run_json(&["status", "curriculum"]);
    assert_eq!(status_of(&sj, "curriculum"), "fresh");
}

/// A file's size, modification time, mode and link count.
type Entry = (u64, std::time::SystemTime, u32, u64);

/// Every file and folder under `dir` (relative path -> [`Entry`]), for "nothing created or
/// changed" checks.
fn tree(dir: &std::path::Path) -> std::collections::BTreeMap<String, Entry> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let m = e.metadata().unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
            out.insert(rel, (m.len(), m.modified().unwrap(), m.mode(), m.nlink()));
            if m.is_dir() {
                todo.push(e.path());
            }
        }
    }
    out
}

/// The verbs that read the store create and change nothing: on a path with no store they stop
/// with exit 2 naming it (and make no store there); on a built store they leave every file of
/// the store and the project's lock file as they were. A run on another store keeps its lock
/// file in that store, not in the project.
#[test]
fn read_verbs_create_and_change_nothing() {
    let p = Project::new();
    let out = p.path("out");
    let o = out.to_str().unwrap();
    let reads: [&[&str]; 8] = [
        &["status"],
        &["status", "curriculum", "--json"],
        &["explain", "curriculum"],
        &["show", "curriculum", "--head", "2"],
        &["export", "curriculum", "--to", o],
        &["export", "curriculum", "--format", "verl", "--to", o],
        &["run", "curriculum", "--dry-run"],
        &["gc", "--dry-run"],
    ];
    for args in reads {
        let r = p.run(args);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {}", stderr(&r));
        assert!(
            stderr(&r).contains(&format!("no store at {}", p.store().display())),
            "{args:?}: {}",
            stderr(&r)
        );
        assert!(!p.store().exists(), "{args:?} made a store");
    }
    assert!(!out.exists());
    // `dag` needs no store.
    assert_eq!(p.run(&["dag"]).status.code(), Some(0));
    assert!(!p.store().exists());

    let r = p.run(&["run", "curriculum"]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    let lock = p.path("cudarl.lock");
    let (store, lock_before) = (tree(&p.store()), std::fs::read(&lock).unwrap());
    let lock_time = std::fs::metadata(&lock).unwrap().modified().unwrap();
    for args in reads {
        let r = p.run(args);
        assert_eq!(r.status.code(), Some(0), "{args:?}: {}", stderr(&r));
        let after = tree(&p.store());
        let changed: Vec<&String> = (store.keys().chain(after.keys()))
            .filter(|k| store.get(*k) != after.get(*k))
            .collect();
        assert!(
            changed.is_empty(),
            "{args:?} changed the store: {changed:?}"
        );
        assert_eq!(std::fs::read(&lock).unwrap(), lock_before, "{args:?}");
        assert_eq!(
            std::fs::metadata(&lock).unwrap().modified().unwrap(),
            lock_time,
            "{args:?}"
        );
    }
    assert!(out.join("curriculum").is_dir(), "the export wrote nothing");

    // A run on a scratch store writes its lock there; the project's stays as it was.
    let scratch = p.path("scratch");
    let s = scratch.to_str().unwrap();
    let r = p.run(&["--store", s, "run", "curriculum", "--set", "splits.seed=3"]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    assert!(scratch.join("cudarl.lock").is_file());
    assert_eq!(std::fs::read(&lock).unwrap(), lock_before);
}

/// `status --verify` re-hashes the stored files of fresh nodes: none changed after a run
/// (exit 0); a blob edited in place (they are read-only on disk, so it takes a chmod) is named
/// with its node, output and path (exit 1).
#[test]
fn status_verify_names_a_stored_file_that_changed() {
    let p = Project::new();
    let r = p.run(&["run", "splits"]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    let o = p.run(&["status", "splits", "--verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("verify: 0 stored file(s) changed"),
        "{}",
        stderr(&o)
    );
    let (_, sj) = p.run_json(&["status", "splits"]);
    let hash = sj["splits"]["outputs"]["splits"]["hash"].as_str().unwrap();
    let blob = p.store().join("cas").join(&hash[..2]).join(hash);
    let perm = std::fs::metadata(&blob).unwrap().permissions();
    assert!(perm.readonly(), "a store blob is writable: {blob:?}");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&blob, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes.push(b'\n');
    std::fs::write(&blob, bytes).unwrap();
    let o = p.run(&["status", "splits", "--verify"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("CHANGED  splits splits {}", blob.display()))
            && stderr(&o).contains("verify: 1 stored file(s) changed"),
        "{}",
        stderr(&o)
    );
}

/// `[profiles.NAME]` overrides, the `cpu` profile picked where no GPU is found, a bare `run`
/// building the default targets, and the verbs that read the store reusing the settings of the
/// last run that built them, or of a run named with `--run`, never of a one-off run.
#[test]
fn profiles_default_targets_and_remembered_runs() {
    let p = Project::new();
    let pl = p.path("pipelines/default.toml");
    let text = std::fs::read_to_string(&pl).unwrap();
    let head = &text[..text
        .find("[profiles.cpu]")
        .expect("default.toml has [profiles.cpu]")];
    let targets = "targets = [\"rl-train\", \"eval\"]";
    assert!(
        head.contains(targets),
        "default.toml names its default targets"
    );
    let head = head.replace(targets, "targets = [\"splits\"]");
    std::fs::write(
        &pl,
        format!("{head}[profiles.cpu]\n\"splits.seed\" = 5\n\n[profiles.other.splits]\nseed = 6\n"),
    )
    .unwrap();
    // As a user runs it: no CUDARL_PROFILE.
    let run = |args: &[&str]| p.cmd(args).env_remove("CUDARL_PROFILE").output().unwrap();
    let gpu = cudarl_cuda::gpu::present();
    let o = run(&["run", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stderr(&o).contains("no GPU found: profile `cpu`"),
        !gpu,
        "{}",
        stderr(&o)
    );
    let ran: Vec<String> = stdout(&o)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| v["node"].as_str().unwrap().to_string())
        .collect();
    assert!(
        ran.contains(&"splits".to_string()) && !ran.contains(&"curriculum".to_string()),
        "a bare run builds the default targets and what they need: {ran:?}"
    );
    let state = |o: &std::process::Output, node: &str| {
        stdout(o)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["node"] == node)
            .map(|v| v["status"].as_str().unwrap().to_string())
            .unwrap()
    };
    // The reading verbs take that run's settings (said so, with the run's name), whatever
    // the machine; `status --exit-code` is 0 with the default targets fresh, the rest missing.
    let o = run(&["status", "splits", "--json"]);
    let e = stderr(&o);
    assert_eq!(state(&o, "splits"), "fresh", "{e}");
    assert!(
        e.contains("the settings of run `splits`, the last that built the default targets"),
        "{e}"
    );
    if !gpu {
        assert!(e.contains("--profile cpu"), "{e}");
    }
    let o = run(&["status", "--exit-code"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("MISSING  curriculum"), "{}", stdout(&o));
    // Told otherwise: the file's own sizes, another profile (nested tables allowed), or `--set`
    // on top of the machine's profile. (status without a GPU, status with one)
    for (other, want) in [
        (["--profile", "none"], ("stale", "fresh")),
        (["--profile", "other"], ("stale", "stale")),
        (["--set", "splits.seed=5"], ("fresh", "stale")),
    ] {
        let mut args = vec!["status", "splits", "--json"];
        args.extend(other);
        let o = run(&args);
        let want = if gpu { want.1 } else { want.0 };
        assert_eq!(state(&o, "splits"), want, "{other:?}: {}", stderr(&o));
    }
    // A one-off run of another target is remembered under its own name and switches nothing.
    let o = run(&["run", "ingest-kernelbench", "--set", "splits.seed=9"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(&["status", "splits", "--json"]);
    let e = stderr(&o);
    assert_eq!(state(&o, "splits"), "fresh", "{e}");
    assert!(
        !e.contains("splits.seed=9") && e.contains("other runs: ingest-kernelbench (--run NAME)"),
        "{e}"
    );
    let o = run(&["status", "splits", "--json", "--run", "ingest-kernelbench"]);
    let e = stderr(&o);
    assert_eq!(state(&o, "splits"), "stale", "{e}");
    assert!(e.contains("--set splits.seed=9"), "{e}");
    // `--run` on a reading verb wins over a profile from the environment.
    let o = p
        .cmd(&["status", "splits", "--json", "--run", "splits"])
        .env("CUDARL_PROFILE", "other")
        .output()
        .unwrap();
    assert_eq!(state(&o, "splits"), "fresh", "{}", stderr(&o));
    // An unknown run: named with the ones there are (exit 2); `--run` with `--set` on a
    // reading verb is a usage error.
    let o = run(&["status", "--run", "ingest-kernelbenc"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("did you mean `ingest-kernelbench`?")
            && stderr(&o).contains("runs: ingest-kernelbench, splits"),
        "{}",
        stderr(&o)
    );
    let o = run(&["status", "--run", "splits", "--set", "splits.seed=1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // A run that builds the default targets upstream of its own, under another profile and a
    // chosen name, becomes what the reading verbs use.
    let o = run(&["run", "curriculum", "--profile", "other", "--run", "seed6"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(&["status", "splits", "--json"]);
    assert_eq!(state(&o, "splits"), "fresh", "{}", stderr(&o));
    assert!(
        stderr(&o).contains("run `seed6`") && stderr(&o).contains("--profile other"),
        "{}",
        stderr(&o)
    );
    // A profile the file does not define: named with the ones it does (exit 2).
    let o = run(&["run", "curriculum", "--profile", "nope"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("profiles.nope") && e.contains("profiles: cpu, other"),
        "{e}"
    );
    // A profile override naming no node; default targets naming no node.
    std::fs::write(&pl, format!("{head}[profiles.bad]\n\"nonode.seed\" = 1\n")).unwrap();
    let o = run(&["status", "--profile", "bad"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("profiles.bad") && stderr(&o).contains("unknown node `nonode`"),
        "{}",
        stderr(&o)
    );
    std::fs::write(&pl, head.replace("[\"splits\"]", "[\"splts\"]")).unwrap();
    let o = run(&["run", "--profile", "none"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("pipeline.targets") && stderr(&o).contains("did you mean `splits`?"),
        "{}",
        stderr(&o)
    );
}

/// `run --dry-run` gives each node it would run the seconds of its previous run, `n/a` for one
/// that never ran, and a total.
#[test]
fn dry_run_estimates_seconds_from_previous_runs() {
    let p = Project::new();
    p.run_json(&["run", "splits"]);
    let dry = |json: bool| {
        let mut args = vec![
            "run",
            "splits",
            "curriculum",
            "--force",
            "ingest-kernelbench",
        ];
        args.push("--dry-run");
        if json {
            args.push("--json");
        }
        p.run(&args)
    };
    let o = dry(true);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let recs: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let rec = |n: &str| recs.iter().find(|r| r["node"] == n).unwrap().clone();
    // The forced node and the one downstream of it ran before: their seconds; curriculum
    // never ran: null.
    for n in ["ingest-kernelbench", "splits"] {
        let r = rec(n);
        assert_eq!(r["status"], "would_run", "{r}");
        assert!(r["estimated_seconds"].as_f64().unwrap() > 0.0, "{r}");
    }
    let c = rec("curriculum");
    assert_eq!(c["status"], "would_run", "{c}");
    assert!(c["estimated_seconds"].is_null(), "{c}");
    let out = stdout(&dry(false));
    assert!(
        out.lines()
            .any(|l| l.contains(" curriculum ") && l.contains("n/a")),
        "{out}"
    );
    let last = out.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("would run ")
            && last.contains("by their previous runs (")
            && last.contains("never ran: not counted)"),
        "{out}"
    );
}

/// Exported Parquet opens in pyarrow and polars with the documented schema.
#[test]
fn export_opens_in_pyarrow_and_polars() {
    let Some(python) = common::python() else {
        eprintln!("SKIPPED export_opens_in_pyarrow_and_polars: no .venv (run `make setup`)");
        return;
    };
    let p = Project::new();
    let out = p.path("out");
    p.run_json(&["run", "ingest-kernelbench"]);
    // Never built: named, with the command that builds it, and nothing written (exit 2).
    let o = p.run(&["export", "curriculum", "--to", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("`curriculum` is missing") && e.contains("--build"),
        "{e}"
    );
    assert!(!out.exists(), "an export that did not happen wrote {out:?}");
    let o = p.run(&[
        "export",
        "curriculum",
        "--build",
        "--to",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let lock_before = std::fs::read_to_string(p.path("cudarl.lock")).ok();
    // Two nodes whose tables are both `kernels.parquet`: each in its own folder.
    for node in ["ingest-sakana", "ingest-cuda-l1"] {
        let o = p.run(&["export", node, "--build", "--to", out.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    // Exporting builds what it needs but records no lineage in the checkout.
    assert_eq!(
        std::fs::read_to_string(p.path("cudarl.lock")).ok(),
        lock_before
    );
    {
        use std::os::unix::fs::PermissionsExt;
        for f in ["curriculum/curriculum.parquet", "curriculum/export.json"] {
            let mode = std::fs::metadata(out.join(f)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o644, "{f}");
        }
    }
    // VERL's layouts, with row_sum as the hold-out family (checked by the script below).
    // Each node exports its own part: the curriculum its RL files, sft-data its SFT files.
    for (node, own, other) in [
        ("curriculum", ["rl_train", "rl_test"], "sft_"),
        ("sft-data", ["sft_train", "sft_val"], "rl_"),
    ] {
        let o = p.run(&[
            "export",
            node,
            "--build",
            "--format",
            "verl",
            "--to",
            out.to_str().unwrap(),
            "--set",
            r#"splits.holdout_tasks=["row_sum"]"#,
        ]);
        assert_eq!(o.status.code(), Some(0), "{node}: {}", stderr(&o));
        let listed = stdout(&o);
        for f in own {
            assert!(listed.contains(&format!("verl/{f}.parquet")), "{listed}");
        }
        assert!(!listed.contains(other), "{node}: {listed}");
    }
    let o = p.run(&["export", "validate", "--format", "verl", "--to", "x"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let side: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("curriculum/export.json")).unwrap())
            .unwrap();
    assert_eq!(side["outputs"]["curriculum"]["rows"], 252);
    // The manifest names what is on disk.
    assert_eq!(
        side["files"],
        serde_json::json!([
            "curriculum.parquet",
            "gates.parquet",
            "validated_kernels.parquet"
        ])
    );
    for f in side["files"].as_array().unwrap() {
        assert!(
            out.join("curriculum").join(f.as_str().unwrap()).is_file(),
            "{f}"
        );
    }
    let script = repo_root().join("tests/python/check_export.py");
    let o = std::process::Command::new(python)
        .arg(script)
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "python check failed:\n{}\n{}",
        stdout(&o),
        stderr(&o)
    );
    assert!(stdout(&o).contains("OK"), "{}", stdout(&o));
}

/// Paths are not in the keys, so outputs must not depend on them either: moving an input file
/// and pointing `path` at it gives the same key and, when forced to re-run, the same bytes.
#[test]
fn outputs_do_not_depend_on_input_paths() {
    let p = Project::new();
    let (_, m0) = p.run_json(&["run", "curriculum"]);
    std::fs::create_dir_all(p.path("elsewhere/deep")).unwrap();
    for (node, from, to) in [
        (
            "ingest-cuda-l1",
            "datasets/cuda_l1/kernels.parquet",
            "elsewhere/deep/kernels.parquet",
        ),
        (
            "ingest-sakana",
            "datasets/sakana_ai_cuda_engineer_archive_sample/sample.parquet",
            "elsewhere/sample.parquet",
        ),
        (
            "ingest-kernelbench",
            "datasets/kernelbench/problems.parquet",
            "elsewhere/problems.parquet",
        ),
    ] {
        std::fs::copy(p.path(from), p.path(to)).unwrap();
        let set = format!("{node}.path=\"{to}\"");
        let (c, m) = p.run_json(&["run", node, "--set", &set, "--force", node]);
        assert_eq!(c, 0, "{m:?}");
        assert_eq!(status_of(&m, node), "ran");
        assert_eq!(m[node]["key"], m0[node]["key"], "{node}: key");
        assert_eq!(
            m[node]["outputs"], m0[node]["outputs"],
            "{node}: output bytes depend on the path"
        );
    }
}
