//! Sharded validation over a shared object-store cache (docs/architecture.md, "Sharding"): each
//! "machine" is its own project and store, the shared cache a local directory (the
//! `object_store` local backend, as a network mount would be). Real processes, real nvcc
//! (compile-only verdicts, so the test means the same with or without a GPU).

mod common;

use std::path::Path;

use common::*;

const COMPILE: &str = "validate.mode=\"compile\"";

/// A project whose store has the hidden-test salt `salt` (hidden test seeds, and so `testgen`'s
/// rows and the validate keys, derive from it; with a shared cache the cache's salt wins).
fn machine(salt: &[u8]) -> Project {
    let p = Project::new();
    std::fs::create_dir_all(p.store()).unwrap();
    std::fs::write(p.store().join("hidden-salt"), salt).unwrap();
    p
}

/// `run validate ...` with the shared cache, as JSON records by node, plus exit code and stderr.
fn validate(
    p: &Project,
    cache: &Path,
    extra: &[&str],
) -> (
    i32,
    std::collections::BTreeMap<String, serde_json::Value>,
    String,
) {
    let mut args = vec![
        "run",
        "validate",
        "--json",
        "--set",
        COMPILE,
        "--shared-cache",
        cache.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = p.run(&args);
    (o.status.code().unwrap(), records(&o), stderr(&o))
}

fn stat(m: &std::collections::BTreeMap<String, serde_json::Value>, name: &str) -> u64 {
    m["validate"]["stats"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("stat {name} in {}", m["validate"]))
}

/// Rows of `validate` in the shared cache (its two memo namespaces; upstream stages such as
/// `testgen` memoize their own rows there too).
fn validate_rows(cache: &Path) -> usize {
    files(&cache.join("memo/validate-v1")).len()
        + files(&cache.join("memo/validate-torch-v1")).len()
}

/// Files under `dir` (recursively).
fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.path().is_dir() {
                v.extend(files(&e.path()));
            } else {
                v.push(e.path());
            }
        }
    }
    v
}

#[test]
fn two_shards_and_a_merge_equal_one_unsharded_run() {
    let salt = b"one sharded job";
    let shared = tempfile::tempdir().unwrap();
    let cache = shared.path().join("cache");

    // The reference: one machine, no sharding, no shared cache.
    let whole = machine(salt);
    let (c, m) = whole.run_json(&["run", "validate", "--set", COMPILE]);
    assert_eq!(c, 0, "{m:?}");
    let rows = stat(&m, "rows");
    assert_eq!(stat(&m, "rows_computed"), rows);
    let reference = out_hash(&m, "validate", "validations");

    // A merge before any shard ran computes nothing and names what is missing. The machines'
    // own salts differ; the first one to touch the shared cache publishes its salt (here the
    // reference's) and every other machine of the job draws its hidden tests from it.
    let (c1, c2) = (machine(salt), machine(b"another machine's salt"));
    // (`validate` of the task kernels needs no salt without a GPU; `testgen`, upstream of
    // `validate-archive`, draws hidden seeds, so machine 1 runs it first.)
    let o = c1.run(&["run", "testgen", "--shared-cache", cache.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let (c, m, err) = validate(&c1, &cache, &["--merge"]);
    assert_eq!(c, 1, "{err}");
    let msg = m["validate"]["error"].as_str().unwrap_or_default();
    assert!(
        msg.contains(&format!("{rows} of {rows} rows have no verdict"))
            && msg.contains("--shard i/N"),
        "{msg}"
    );
    assert_eq!(validate_rows(&cache), 0, "a merge writes no rows");

    // Shard 0 on machine 1, shard 1 on machine 2.
    let (c, m0, err) = validate(&c1, &cache, &["--shard", "0/2"]);
    assert_eq!(c, 0, "{err}");
    assert_eq!(status_of(&m0, "validate"), "shard");
    assert_eq!(std::fs::read(cache.join("hidden-salt")).unwrap(), salt);
    assert!(m0["validate"]["outputs"].as_object().unwrap().is_empty());
    let (c, m1, err) = validate(&c2, &cache, &["--shard", "1/2"]);
    assert_eq!(c, 0, "{err}");
    let (o0, o1) = (stat(&m0, "rows_owned"), stat(&m1, "rows_owned"));
    assert_eq!(o0 + o1, rows, "the shards partition the rows");
    assert!(o0 > 0 && o1 > 0, "both shards have rows ({o0}, {o1})");
    assert_eq!(
        stat(&m0, "rows_computed") + stat(&m1, "rows_computed"),
        rows
    );
    // Each row is one entry in the shared cache, written once.
    assert_eq!(validate_rows(&cache) as u64, rows);
    let records = files(&cache.join("shards/validate"));
    let mut names: Vec<String> = records
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["0-of-2.json", "1-of-2.json"]);
    let rec0 = records.iter().find(|p| p.ends_with("0-of-2.json")).unwrap();
    let first = std::fs::read(rec0).unwrap();
    let r: serde_json::Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(r["stats"]["rows_owned"], o0);

    // Shard 0 again: every row from the cache, the record not rewritten.
    let (c, m, err) = validate(&c1, &cache, &["--shard", "0/2"]);
    assert_eq!(c, 0, "{err}");
    assert_eq!(stat(&m, "rows_computed"), 0);
    assert_eq!(stat(&m, "rows_from_memo"), o0);
    assert_eq!(std::fs::read(rec0).unwrap(), first);

    // The merge on a third machine: nothing computed, the same table as the unsharded run.
    let merger = machine(b"a third salt");
    let (c, m, err) = validate(&merger, &cache, &["--merge"]);
    assert_eq!(c, 0, "{err}");
    assert_eq!(status_of(&m, "validate"), "ran");
    assert_eq!(stat(&m, "rows_computed"), 0);
    assert_eq!(stat(&m, "rows_from_memo"), rows);
    assert_eq!(out_hash(&m, "validate", "validations"), reference);
    // Then a plain run there is cached (the merge published the node under its normal key).
    let (c, m, _) = validate(&merger, &cache, &[]);
    assert_eq!(c, 0);
    assert_eq!(status_of(&m, "validate"), "cached");
    assert_eq!(validate_rows(&cache) as u64, rows);
}

#[test]
fn a_killed_shard_loses_only_its_in_flight_rows() {
    let shared = tempfile::tempdir().unwrap();
    let cache = shared.path().join("cache");
    let p = machine(b"crash");
    // SIGKILL while other rows are compiling: like a machine that dies.
    let (said, code) = stop_at_fault(
        &p,
        &[
            "run",
            "validate",
            "--set",
            COMPILE,
            "--shard",
            "0/1",
            "--shared-cache",
            cache.to_str().unwrap(),
        ],
        "validate:after-row",
        libc::SIGKILL,
    );
    assert_eq!(code, 128 + libc::SIGKILL, "{said}");
    // The row that reached the crash point survives; so may rows other workers finished
    // between that line and the kill (each of them then pauses at the same point).
    let survived = validate_rows(&cache);
    assert!(survived >= 1, "the finished row survives");
    assert!(
        files(&cache.join("shards")).is_empty(),
        "no record: the shard did not finish"
    );

    // The shard again (here, or on any other machine): only the lost rows are computed.
    let (c, m, err) = validate(&p, &cache, &["--shard", "0/1"]);
    assert_eq!(c, 0, "{err}");
    let rows = stat(&m, "rows");
    assert!((survived as u64) < rows, "the in-flight rows were lost");
    assert_eq!(stat(&m, "rows_from_memo"), survived as u64);
    assert_eq!(stat(&m, "rows_computed"), rows - survived as u64);
    let (c, m, err) = validate(&p, &cache, &["--merge"]);
    assert_eq!(c, 0, "{err}");
    assert_eq!(stat(&m, "rows_computed"), 0);
}

#[test]
fn shard_flags_are_checked() {
    let p = Project::new();
    for (args, needle) in [
        (
            vec!["run", "curriculum", "--shard", "0/2"],
            "does not process rows independently",
        ),
        (vec!["run", "validate", "--shard", "2/2"], "expected i/N"),
        (vec!["run", "validate", "--shard", "x"], "expected i/N"),
        (vec!["run", "--merge"], "name the stage"),
        (
            vec![
                "run",
                "validate",
                "--shard",
                "0/2",
                "--shared-cache",
                "ftp://host/x",
            ],
            "--shared-cache",
        ),
    ] {
        let o = p.run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}
