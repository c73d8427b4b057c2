//! `cudarl-pipe sql` through the real binary: SQL over the store's tables by `node.table`,
//! as a table, JSON Lines or a Parquet file; bad queries and unbuilt nodes named (exit 2).

mod common;

use common::*;
use serde_json::Value;

fn lines(o: &std::process::Output) -> Vec<Value> {
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn sql_answers_over_node_tables_as_table_json_lines_and_parquet() {
    let p = Project::new();
    let o = p.run(&["run", "curriculum"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // A GROUP BY over one node's table agrees with the counts another table of it holds.
    let by_tier =
        "SELECT tier, count(*) AS n FROM curriculum.curriculum GROUP BY tier ORDER BY tier";
    let o = p.run(&["sql", by_tier, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let counted = lines(&o);
    assert!(!counted.is_empty());
    let o = p.run(&[
        "sql",
        "SELECT tier, problems FROM curriculum.gates WHERE problems > 0 ORDER BY tier",
        "--json",
    ]);
    let gates = lines(&o);
    assert_eq!(counted.len(), gates.len(), "{counted:?} {gates:?}");
    for (c, g) in counted.iter().zip(&gates) {
        assert_eq!((&c["tier"], &c["n"]), (&g["tier"], &g["problems"]));
    }
    // A join across two nodes, a hyphenated node name written bare.
    let o = p.run(&[
        "sql",
        "SELECT c.level, count(*) AS n FROM curriculum.curriculum c JOIN ingest-kernelbench.problems k ON c.problem_id = k.problem_id GROUP BY c.level ORDER BY c.level",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let levels = lines(&o);
    assert!(
        levels.iter().all(|r| r["n"].as_i64().unwrap() > 0),
        "{levels:?}"
    );
    // The default: a printed table.
    let o = p.run(&["sql", by_tier]);
    assert!(
        stdout(&o).contains("tier") && stdout(&o).contains('│'),
        "{}",
        stdout(&o)
    );
    // --parquet: a file pyarrow-compatible readers open (the magic bytes at both ends).
    let f = p.path("by_tier.parquet");
    let o = p.run(&["sql", by_tier, "--parquet", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let bytes = std::fs::read(&f).unwrap();
    assert!(bytes.starts_with(b"PAR1") && bytes.ends_with(b"PAR1"));
    // Bad SQL, an unknown column and a node not built: exit 2 with the reason.
    let o = p.run(&["sql", "SELEC nonsense"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = p.run(&["sql", "SELECT no_such_column FROM curriculum.gates"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no_such_column"), "{}", stderr(&o));
    let o = p.run(&["sql", "SELECT * FROM eval.episodes"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("not built under these settings") && stderr(&o).contains("eval"),
        "{}",
        stderr(&o)
    );
}
