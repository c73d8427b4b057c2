//! Every command's `--json` output against docs/json.md, through the real binary: JSON Lines on
//! stdout (one object per line), each record with exactly the documented fields, nulls kept.

mod common;

use common::*;
use serde_json::{Map, Value};

/// The fields docs/json.md lists in the section whose heading contains `heading`.
fn documented(heading: &str) -> Vec<String> {
    let doc = std::fs::read_to_string(repo_root().join("docs/json.md")).unwrap();
    let section = doc
        .split("\n## ")
        .find(|s| s.lines().next().is_some_and(|h| h.contains(heading)))
        .unwrap_or_else(|| panic!("docs/json.md has no section `{heading}`"));
    let fields: Vec<String> = section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| field "))
        .filter_map(|l| l.split('|').nth(1))
        .map(|f| f.trim().to_string())
        .collect();
    assert!(!fields.is_empty(), "`{heading}` lists no fields");
    fields
}

/// The records of a `--json` stdout: every line one JSON object, no other lines.
fn records(o: &std::process::Output) -> Vec<Map<String, Value>> {
    let out = stdout(o);
    assert!(!out.is_empty(), "no output; stderr: {}", stderr(o));
    out.lines()
        .map(|l| match serde_json::from_str(l) {
            Ok(Value::Object(m)) => m,
            other => panic!("not one JSON object per line: `{l}` ({other:?})"),
        })
        .collect()
}

/// Every record has exactly the fields of `heading`'s table.
fn exactly_documented(recs: &[Map<String, Value>], heading: &str) {
    let mut want = documented(heading);
    want.sort();
    for r in recs {
        let mut got: Vec<String> = r.keys().cloned().collect();
        got.sort();
        assert_eq!(got, want, "{heading}: {r:?}");
    }
}

#[test]
fn every_json_output_is_json_lines_with_the_documented_fields() {
    let p = Project::new();
    // run: one record per node, every field present (`error` null on success).
    let o = p.run(&["run", "ingest-kernelbench", "ingest-sakana", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let recs = records(&o);
    assert_eq!(recs.len(), 2);
    exactly_documented(&recs, "`run --json`");
    assert!(
        recs.iter()
            .all(|r| r["error"].is_null() && r["interrupted"] == false)
    );
    // status: the same record, one per node of the pipeline.
    let o = p.run(&["status", "--json"]);
    let recs = records(&o);
    assert!(recs.len() > 10, "{}", recs.len());
    exactly_documented(&recs, "`run --json`");
    assert!(
        recs.iter()
            .any(|r| r["status"] == "missing" && r["outputs"] == serde_json::json!({}))
    );
    // explain: one record per node of the closure.
    let o = p.run(&["explain", "curriculum", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let recs = records(&o);
    assert!(recs.iter().any(|r| r["node"] == "curriculum"));
    exactly_documented(&recs, "`explain NODE --json`");
    // show: one record per row, every column present even where null.
    let o = p.run(&["show", "ingest-sakana", "--json", "--head", "5"]);
    let recs = records(&o);
    assert_eq!(recs.len(), 5);
    let keys = |r: &Map<String, Value>| r.keys().cloned().collect::<Vec<_>>();
    assert!(recs.iter().all(|r| keys(r) == keys(&recs[0])));
    // gc: one record.
    let o = p.run(&["gc", "--dry-run", "--json"]);
    let recs = records(&o);
    assert_eq!(recs.len(), 1);
    exactly_documented(&recs, "`gc --json`");
    assert_eq!(recs[0]["dry_run"], true);
    // check: one verdict per --source, in order, nulls kept (`profile`, `correct`, `timing`).
    if cudarl_cuda::Nvcc::discover_or_skip(&repo_root()).is_none() {
        return;
    }
    let a = repo_root().join("datasets/tasks/vector_add/naive.cu");
    let b = repo_root().join("datasets/tasks/vector_add/vec4.cu");
    let o = p.run(&[
        "check",
        "--task",
        "vector_add",
        "--source",
        a.to_str().unwrap(),
        "--source",
        b.to_str().unwrap(),
        "--mode",
        "compile",
        "--json",
    ]);
    let recs = records(&o);
    assert_eq!(recs.len(), 2, "{}", stdout(&o));
    exactly_documented(&recs, "`check --json`");
    for r in &recs {
        assert_eq!(r["compiled"], true, "{r:?}");
        assert!(r["profile"].is_null() && r["correct"].is_null() && r["timing"].is_null());
    }
}
