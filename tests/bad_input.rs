//! Bad input: clear errors naming the file and field, exit code 2, store untouched.

mod common;

use common::*;

/// Rewrites a Parquet file without one column.
fn drop_column(path: &std::path::Path, column: &str) {
    let t = cudarl_data::Table::read(path, "x").unwrap();
    let idx = t.schema.index_of(column).unwrap();
    let keep: Vec<usize> = (0..t.schema.fields().len()).filter(|&i| i != idx).collect();
    cudarl_data::write_parquet(path, &t.batch.project(&keep).unwrap()).unwrap();
}

fn assert_bad(p: &Project, args: &[&str], needles: &[&str]) {
    // `curriculum` also needs nodes a bad input may not touch and which may finish while the
    // bad node fails: build those first (each alone; the one reading the bad input fails), so
    // the snapshot covers what must not change.
    if args.contains(&"curriculum") {
        for n in [
            "synth-tasks",
            "ingest-sakana",
            "ingest-cuda-l1",
            "ingest-kernelbench",
            "splits",
            "kb-specs",
            "validate",
        ] {
            p.run(&["run", n]);
        }
    }
    let before = p.store_snapshot();
    let o = p.run(args);
    let err = stderr(&o);
    assert_eq!(
        o.status.code(),
        Some(2),
        "expected exit 2 for {args:?}, got {:?}:\n{err}\nstdout:\n{}",
        o.status.code(),
        stdout(&o)
    );
    // On stderr: the summary on stdout may be JSON or piped away.
    for n in needles {
        assert!(err.contains(n), "stderr should contain {n:?}:\n{err}");
    }
    assert_eq!(
        p.store_snapshot(),
        before,
        "store must be untouched by {args:?}"
    );
}

#[test]
fn malformed_parquet_names_the_file() {
    let p = Project::new();
    p.run(&["run", "ingest-kernelbench"]);
    std::fs::write(
        p.path("datasets/kernelbench/problems.parquet"),
        b"PAR1 definitely not parquet PAR1",
    )
    .unwrap();
    assert_bad(
        &p,
        &["run", "curriculum"],
        &[
            "datasets/kernelbench/problems.parquet",
            "not a valid Parquet file",
        ],
    );
    // The last good lock entry is kept.
    let lock = std::fs::read_to_string(p.path("cudarl.lock")).unwrap();
    assert!(lock.contains("[nodes.ingest-kernelbench]"));
}

#[test]
fn wrong_schema_names_the_column() {
    let p = Project::new();
    let path = p.path("datasets/kernelbench/problems.parquet");
    drop_column(&path, "code");
    assert_bad(
        &p,
        &["run", "curriculum"],
        &[
            "datasets/kernelbench/problems.parquet",
            "field `code`",
            "required column is missing",
        ],
    );

    // A column of the wrong type.
    let p = Project::new();
    let path = p.path("datasets/kernelbench/problems.parquet");
    let t = cudarl_data::Table::read(&path, "x").unwrap();
    let mut cols = t.batch.columns().to_vec();
    let mut fields: Vec<arrow::datatypes::Field> = t
        .schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let li = t.schema.index_of("level").unwrap();
    cols[li] = std::sync::Arc::new(arrow::array::StringArray::from(vec!["one"; t.rows()]));
    fields[li] = arrow::datatypes::Field::new("level", arrow::datatypes::DataType::Utf8, true);
    let b = arrow::array::RecordBatch::try_new(
        std::sync::Arc::new(arrow::datatypes::Schema::new(fields)),
        cols,
    )
    .unwrap();
    cudarl_data::write_parquet(&path, &b).unwrap();
    assert_bad(
        &p,
        &["run", "curriculum"],
        &[
            "problems.parquet",
            "field `level`",
            "expected an integer column",
        ],
    );
}

#[test]
fn sakana_missing_required_column_is_named() {
    let p = Project::new();
    let path = p.path("datasets/sakana_ai_cuda_engineer_archive_sample/sample.parquet");
    drop_column(&path, "Correct");
    p.run(&["run", "ingest-kernelbench"]);
    assert_bad(
        &p,
        &["run", "ingest-sakana"],
        &[
            "datasets/sakana_ai_cuda_engineer_archive_sample/sample.parquet",
            "field `Correct`",
            "required column of the SakanaAI archive schema",
        ],
    );
}

#[test]
fn missing_input_file() {
    let p = Project::new();
    std::fs::remove_file(p.path("datasets/cuda_l1/kernels.parquet")).unwrap();
    p.run(&["run", "ingest-kernelbench"]);
    assert_bad(
        &p,
        &["run", "ingest-cuda-l1"],
        &["datasets/cuda_l1/kernels.parquet", "file not found"],
    );
}

#[test]
fn bad_pipeline_toml_unknown_stage_and_param() {
    let p = Project::new();
    let f = p.path("pipelines/default.toml");
    let good = std::fs::read_to_string(&f).unwrap();

    std::fs::write(&f, "[stages.curriculum\nseed = 0\n").unwrap();
    assert_bad(
        &p,
        &["run"],
        &["pipelines/default.toml", "invalid TOML", "line 1"],
    );

    std::fs::write(&f, format!("{good}\n[stages.frobnicate]\n")).unwrap();
    assert_bad(
        &p,
        &["run"],
        &[
            "pipelines/default.toml",
            "stages.frobnicate",
            "unknown stage `frobnicate`",
        ],
    );

    std::fs::write(&f, good.replace("seed = 0", "sed = 0")).unwrap();
    assert_bad(
        &p,
        &["run"],
        &[
            "pipelines/default.toml",
            "stages.splits",
            "unknown field `sed`",
        ],
    );

    std::fs::write(&f, good.replace("seed = 0", "seed = \"zero\"")).unwrap();
    assert_bad(&p, &["run"], &["stages.splits", "seed"]);

    std::fs::write(&f, &good).unwrap();
    assert_bad(
        &p,
        &["run", "--set", "curriculum.sed=1"],
        &["unknown field `sed`"],
    );
    assert_bad(
        &p,
        &["run", "--set", "nosuchnode.x=1"],
        &["unknown node `nosuchnode`"],
    );
    assert_bad(
        &p,
        &["run", "nosuchtarget"],
        &["unknown node `nosuchtarget`"],
    );
    // A typo gets the nearest name.
    assert_bad(
        &p,
        &["run", "curriculm"],
        &["unknown node `curriculm`; did you mean `curriculum`?"],
    );
    assert_bad(
        &p,
        &["run", "--set", "valdiate.x=1"],
        &["unknown node `valdiate`; did you mean `validate`?"],
    );
    assert_bad(
        &p,
        &["run", "--set", "splits.test_fraction=0.95"],
        &["test_fraction"],
    );
    assert_bad(&p, &["frobnicate"], &["unrecognized subcommand"]);

    // A pipeline whose input wiring names a missing node.
    std::fs::write(&f, "[stages.curriculum]\nmin_pass_rate = 0.75\n").unwrap();
    assert_bad(
        &p,
        &["run"],
        &["stages.curriculum.inputs.problems", "not in this pipeline"],
    );
}

#[test]
fn bad_op_categories_file() {
    let p = Project::new();
    std::fs::write(
        p.path("configs/curriculum/op_categories.toml"),
        "[categories]\nelementwise = \"zero\"\n",
    )
    .unwrap();
    p.run(&["run", "ingest-cuda-l1", "ingest-sakana"]);
    assert_bad(
        &p,
        &["run", "curriculum"],
        &[
            "configs/curriculum/op_categories.toml",
            "line 2",
            "elementwise = \"zero\"",
            "expected i64",
        ],
    );
}

#[test]
fn hand_written_family_with_a_generated_id_is_refused() {
    let p = Project::new();
    let toml = p.path("datasets/tasks/vector_add/task.toml");
    let t = std::fs::read_to_string(&toml).unwrap();
    std::fs::write(
        &toml,
        t.replace("id = \"vector_add\"", "id = \"gen_ew_000\""),
    )
    .unwrap();
    assert_bad(
        &p,
        &["run", "synth-tasks"],
        &[
            "vector_add/task.toml",
            "gen_ew_000",
            "reserved for generated families",
        ],
    );
}
