//! Crash safety (a run killed mid-write leaves a consistent store) and per-node locks (two
//! processes on one store never corrupt it), with real child processes.

mod common;

use std::process::Stdio;

use common::*;

/// Every CAS blob's content hashes to its name.
fn assert_cas_consistent(p: &Project) {
    let cas = p.store().join("cas");
    let mut n = 0;
    for shard in std::fs::read_dir(&cas).unwrap() {
        for f in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let f = f.unwrap().path();
            let name = f.file_name().unwrap().to_str().unwrap().to_string();
            let h = blake3::hash(&std::fs::read(&f).unwrap())
                .to_hex()
                .to_string();
            assert_eq!(h, name, "blob {name} is corrupt");
            n += 1;
        }
    }
    assert!(n > 0);
}

fn kill_at(p: &Project, point: &str) {
    let (said, code) = stop_at_fault(
        p,
        &["run", "curriculum", "-j", "1"],
        &format!("curriculum:{point}"),
        libc::SIGKILL,
    );
    assert_eq!(code, 128 + libc::SIGKILL, "{said}");
}

#[test]
fn killed_mid_write_leaves_store_consistent() {
    for point in ["after-run", "before-manifest"] {
        let p = Project::new();
        kill_at(&p, point);
        // Upstream nodes completed; curriculum has no manifest.
        assert!(
            !p.store().join("ac/curriculum").exists()
                || std::fs::read_dir(p.store().join("ac/curriculum"))
                    .unwrap()
                    .count()
                    == 0
        );
        let (_, st) = p.run_json(&["status", "curriculum"]);
        assert_eq!(status_of(&st, "ingest-kernelbench"), "fresh");
        assert_eq!(status_of(&st, "curriculum"), "missing", "{point}");
        assert_cas_consistent(&p);
        // The lock file was not written by the killed run.
        assert!(!p.path("cudarl.lock").exists());
        // The next run re-runs only curriculum and succeeds.
        let (c, m) = p.run_json(&["run", "curriculum"]);
        assert_eq!(c, 0);
        assert_eq!(status_of(&m, "curriculum"), "ran");
        assert_eq!(status_of(&m, "ingest-sakana"), "cached");
        assert_cas_consistent(&p);
        // gc removes the killed run's scratch files.
        let g: serde_json::Value =
            serde_json::from_str(&stdout(&p.run(&["gc", "--json"]))).unwrap();
        assert!(g["tmp_removed"].as_u64().unwrap() >= 1, "{point}: {g}");
        assert_eq!(std::fs::read_dir(p.store().join("tmp")).unwrap().count(), 0);
    }
}

#[test]
fn an_interrupt_lets_the_running_node_finish_and_starts_no_other() {
    let p = Project::new();
    // SIGTERM while `synth-tasks` is about to run, one node at a time: it finishes and is
    // stored, no node after it starts, the run says so and exits 130.
    let (said, code) = stop_at_fault(
        &p,
        &["run", "curriculum", "-j", "1"],
        "synth-tasks:before-run",
        libc::SIGTERM,
    );
    assert_eq!(code, 130, "{said}");
    for node in ["validate", "curriculum"] {
        assert!(
            said.contains(&format!("stopped {node}: not started: interrupted")),
            "{said}"
        );
    }
    assert!(
        said.contains("interrupted: nodes that finished are stored"),
        "{said}"
    );
    let (_, st) = p.run_json(&["status", "curriculum"]);
    assert_eq!(status_of(&st, "synth-tasks"), "fresh");
    assert_eq!(status_of(&st, "curriculum"), "missing");
    assert_cas_consistent(&p);
    // Run again: what finished is cached, the rest runs.
    let (c, m) = p.run_json(&["run", "curriculum"]);
    assert_eq!(c, 0);
    assert_eq!(status_of(&m, "synth-tasks"), "cached");
    assert_eq!(status_of(&m, "curriculum"), "ran");
}

#[test]
fn stage_failure_leaves_no_manifest() {
    // A stage that fails (bad categories file) publishes nothing; the others complete.
    let p = Project::new();
    std::fs::write(
        p.path("configs/curriculum/op_categories.toml"),
        "garbage = [",
    )
    .unwrap();
    let (c, m) = p.run_json(&["run", "curriculum"]);
    assert_eq!(c, 2);
    assert_eq!(status_of(&m, "curriculum"), "failed");
    assert_eq!(status_of(&m, "ingest-sakana"), "ran");
    assert!(!p.store().join("ac/curriculum").exists());
}

#[test]
fn concurrent_runs_share_one_store() {
    let p = Project::new();
    let spawn = || {
        p.cmd(&["run", "curriculum", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (oa, ob) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(oa.status.success(), "{}", stderr(&oa));
    assert!(ob.status.success(), "{}", stderr(&ob));
    let parse = |o: &std::process::Output| -> Vec<serde_json::Value> {
        stdout(o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let (ra, rb) = (parse(&oa), parse(&ob));
    for node in [
        "ingest-kernelbench",
        "ingest-sakana",
        "ingest-cuda-l1",
        "curriculum",
    ] {
        let sa = ra.iter().find(|r| r["node"] == node).unwrap();
        let sb = rb.iter().find(|r| r["node"] == node).unwrap();
        let ran = [sa, sb].iter().filter(|r| r["status"] == "ran").count();
        assert_eq!(
            ran, 1,
            "{node} must run exactly once across both processes: {sa} {sb}"
        );
        assert_eq!(sa["outputs"], sb["outputs"]);
    }
    assert_cas_consistent(&p);
    assert_eq!(
        std::fs::read_dir(p.store().join("ac/curriculum"))
            .unwrap()
            .count(),
        1
    );
}
