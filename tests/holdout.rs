//! The hold-out is held out: the real `splits`, `tokenizer`, `pretrain` and `sft-data` nodes
//! on a temporary store (CPU, compile-only, tiny settings), and a check by content hash and by
//! substring that no hold-out item reaches a table anything trains on: the task kernels and
//! task modules of the `test` families, and the reference code of the KernelBench `test` and
//! `val` problems, against every document of the tokenizer's and pretraining's corpora and
//! every message and fenced code block of the SFT tables' rows outside the `test` split.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{Project, stderr, stdout};
use serde_json::Value;

/// Four generated elementwise families beside vector_add and row_sum, row_sum and gen_ew_001
/// held out by name (with its group) and the others split by the hash of their group (by id
/// while they have none: gen_ew_002 and 003 in `rl`, gen_ew_000 in `train`); small SFT data
/// with repair examples; two pretraining steps with a few copy documents.
const SETS: [&str; 9] = [
    "synth-tasks.generate={ elementwise = 4, row_reduce = 0, seed = 3 }",
    r#"splits.holdout_tasks=["row_sum", "gen_ew_001"]"#,
    "splits.holdout_generated=0.45",
    "splits.rl_generated=0.1",
    "sft-data.per_family=6",
    "sft-data.optimizer_per_pair=2",
    "sft-data.repairs_per_base=1",
    "pretrain.max_steps=2",
    "pretrain.copy_documents=16",
];

/// `args` with every `--set` of [`SETS`].
fn with_sets<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    for s in SETS {
        v.extend(["--set", s]);
    }
    v
}

/// The rows of `node`'s `output`, as JSON objects.
fn rows(p: &Project, node: &str, output: &str) -> Vec<Value> {
    let o = p.run(&with_sets(&[
        "show", node, "--output", output, "--json", "--head", "1000000",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn str_of<'a>(r: &'a Value, col: &str) -> &'a str {
    r[col]
        .as_str()
        .unwrap_or_else(|| panic!("no string `{col}` in {r}"))
}

/// BLAKE3 of a text with its surrounding whitespace removed (a fenced block ends without the
/// source's trailing newline).
fn digest(text: &str) -> [u8; 32] {
    *blake3::hash(text.trim().as_bytes()).as_bytes()
}

/// The bodies of a text's fenced code blocks (```` ``` ```` or ```` ```cuda ````).
fn fenced_blocks(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("```") {
        let after = &rest[start + 3..];
        let Some(nl) = after.find('\n') else { break };
        let body = &after[nl + 1..];
        let Some(end) = body.find("```") else { break };
        out.push(&body[..end]);
        rest = &body[end + 3..];
    }
    out
}

/// Named texts: (where it is, the text).
type Docs = Vec<(String, String)>;

/// The hold-out, as named texts: what no training text may contain.
#[derive(Debug, Default)]
struct HoldOut {
    texts: BTreeMap<[u8; 32], String>,
    sources: Docs,
}

impl HoldOut {
    fn add(&mut self, name: String, text: &str) {
        self.texts.insert(digest(text), name.clone());
        self.sources.push((name, text.trim().to_string()));
    }
}

/// What of the hold-out `docs` (training texts) contain: each leak as `doc name: hold-out
/// name`, found by the hash of a whole text, of a message or of a fenced code block, or as a
/// substring of the text.
fn leaks(holdout: &HoldOut, docs: &[(String, String)]) -> Vec<String> {
    let mut out = BTreeSet::new();
    for (name, text) in docs {
        let parts = std::iter::once(text.as_str()).chain(fenced_blocks(text));
        for part in parts {
            if let Some(h) = holdout.texts.get(&digest(part)) {
                out.insert(format!("{name}: {h} (same content hash)"));
            }
        }
        for (h, src) in &holdout.sources {
            if text.contains(src.as_str()) {
                out.insert(format!("{name}: {h} (substring)"));
            }
        }
    }
    out.into_iter().collect()
}

/// The texts of a corpus row's JSON line: the document (a string) or each message's content.
fn corpus_texts(node: &str, r: &Value) -> Docs {
    let name = format!("{node}.corpus {}", r["item_id"]);
    match serde_json::from_str::<Value>(str_of(r, "line")).unwrap() {
        Value::String(s) => vec![(name, s)],
        Value::Array(m) => m
            .iter()
            .map(|msg| (name.clone(), str_of(msg, "content").to_string()))
            .collect(),
        other => panic!("{name}: a corpus line is a string or messages, not {other}"),
    }
}

/// Every message of an SFT table's rows: those outside the `test` split, and those in it.
fn sft_texts(p: &Project, table: &str) -> (Docs, Docs) {
    let (mut train, mut test) = (Vec::new(), Vec::new());
    for r in rows(p, "sft-data", table) {
        let name = format!("sft-data.{table} {} ({})", r["task_id"], r["split"]);
        let into = if r["split"] == "test" {
            &mut test
        } else {
            &mut train
        };
        for m in r["messages"].as_array().unwrap() {
            into.push((name.clone(), str_of(m, "content").to_string()));
        }
    }
    (train, test)
}

#[test]
fn no_holdout_item_reaches_the_corpora_or_the_sft_training_rows() {
    let p = Project::new();
    let o = p.run(&with_sets(&[
        "run",
        "splits",
        "tokenizer",
        "pretrain",
        "sft-data",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // The hold-out, from the splits table, where the families of a group share a split.
    let table = rows(&p, "splits", "splits");
    let splits: BTreeMap<String, String> = table
        .iter()
        .map(|r| (str_of(r, "item_id").into(), str_of(r, "split").into()))
        .collect();
    let mut by_group: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for r in &table {
        by_group
            .entry(str_of(r, "group"))
            .or_default()
            .insert(str_of(r, "split"));
    }
    assert!(by_group.values().all(|s| s.len() == 1), "{by_group:?}");
    let split_of = |id: &str| splits.get(id).map(String::as_str);
    let mut holdout = HoldOut::default();
    let mut held_families = BTreeSet::new();
    for k in rows(&p, "synth-tasks", "task_kernels") {
        let task = str_of(&k, "task_id");
        match split_of(&format!("synth/{task}")) {
            Some("test") => {
                held_families.insert(task.to_string());
                holdout.add(format!("{task} kernel {}", k["role"]), str_of(&k, "code"));
            }
            Some(_) => {}
            None => panic!("task family {task} has no split"),
        }
    }
    for t in rows(&p, "synth-tasks", "tasks") {
        let spec: Value = serde_json::from_str(str_of(&t, "spec_json")).unwrap();
        let task = str_of(&t, "task_id");
        if let Some(m) = spec["module"]
            .as_str()
            .filter(|_| held_families.contains(task))
        {
            holdout.add(format!("{task} module"), m);
        }
    }
    let mut held_problems = BTreeMap::new();
    for r in rows(&p, "ingest-kernelbench", "problems") {
        let id = str_of(&r, "problem_id");
        if let Some(s @ ("test" | "val")) = split_of(id) {
            *held_problems.entry(s.to_string()).or_insert(0) += 1;
            holdout.add(format!("{id} ({s})"), str_of(&r, "code"));
        }
    }
    // Non-empty: row_sum and a generated family by name, a quarter of each level's problems in
    // `test` and a tenth in `val`.
    assert!(
        held_families.contains("row_sum") && held_families.contains("gen_ew_001"),
        "{held_families:?}"
    );
    assert_eq!(held_problems.get("test"), Some(&63), "{held_problems:?}");
    assert_eq!(held_problems.get("val"), Some(&25), "{held_problems:?}");

    // The training texts.
    let mut docs = Vec::new();
    let mut kinds = BTreeMap::new();
    for node in ["tokenizer", "pretrain"] {
        for r in rows(&p, node, "corpus") {
            *kinds
                .entry((node, str_of(&r, "kind").to_string()))
                .or_insert(0) += 1;
            docs.extend(corpus_texts(node, &r));
        }
    }
    // Both corpora hold train kernels and problems, and pretraining its copy documents.
    for want in [
        ("tokenizer", "task_kernel"),
        ("tokenizer", "kernelbench"),
        ("pretrain", "task_kernel"),
        ("pretrain", "kernelbench"),
        ("pretrain", "copy_document"),
    ] {
        assert!(
            kinds.contains_key(&(want.0, want.1.to_string())),
            "{want:?}: {kinds:?}"
        );
    }
    assert_eq!(
        kinds[&("tokenizer", "kernelbench".to_string())],
        250 - 63 - 25,
        "the train problems of levels 1-3 ({kinds:?})"
    );
    let mut held_rows = Vec::new();
    for table in ["sft_generator", "sft_optimizer"] {
        let (train, test) = sft_texts(&p, table);
        assert!(!train.is_empty(), "{table}");
        docs.extend(train);
        held_rows.extend(test);
    }
    // Repair examples are among the optimizer's rows.
    assert!(
        rows(&p, "sft-data", "sft_optimizer")
            .iter()
            .any(|r| str_of(r, "kind").starts_with("repair:") && r["split"] != "test")
    );

    let found = leaks(&holdout, &docs);
    assert!(
        found.is_empty(),
        "hold-out items in training tables: {found:#?}"
    );

    // The check finds what is there: the SFT rows of the `test` split (kept for eval, never
    // trained on) hold the hold-out families' kernels in fenced blocks ...
    let in_test_rows = leaks(&holdout, &held_rows);
    assert!(
        in_test_rows.iter().any(|l| l.contains("same content hash")),
        "{in_test_rows:?}"
    );
    // ... and a hold-out kernel put in the corpus as the trainer reads it, or a KernelBench
    // test problem inside a longer text, is caught.
    let (name, kernel) = holdout
        .sources
        .iter()
        .find(|(n, _)| n.starts_with("row_sum kernel"))
        .unwrap();
    let mut planted = docs.clone();
    planted.push((
        "planted corpus line".into(),
        serde_json::from_str::<String>(&serde_json::to_string(kernel).unwrap()).unwrap(),
    ));
    let found = leaks(&holdout, &planted);
    assert!(
        found.contains(&format!("planted corpus line: {name} (same content hash)")),
        "{found:?}"
    );
    let (pname, problem) = holdout
        .sources
        .iter()
        .find(|(n, _)| n.ends_with("(test)"))
        .unwrap();
    let mut planted = docs;
    planted.push((
        "planted message".into(),
        format!("Speed this up:\n{problem}\n# thanks"),
    ));
    assert_eq!(
        leaks(&holdout, &planted),
        [format!("planted message: {pname} (substring)")]
    );
}

#[test]
fn fenced_blocks_are_found_whole() {
    let t = "Here:\n\n```cuda\n__global__ void k() {}\n```\nand ```\nx\n``` done";
    assert_eq!(fenced_blocks(t), ["__global__ void k() {}\n", "x\n"]);
    assert!(fenced_blocks("no code").is_empty());
}
