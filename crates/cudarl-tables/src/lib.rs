//! cudarl-tables: the tables more than one part of cudarl-pipe reads, each as one documented
//! row struct whose fields are its columns (an `Option` for a nullable one), its Arrow schema
//! traced from the type with `serde_arrow`, and typed reads and writes
//! (docs/architecture.md, "Tables"). A stage that writes such a table and every reader of it
//! (other stages, the CLI, `serve`) go through this crate, so no reader imports the writer's
//! module.
//!
//! - [`archive`]: the archives' kernels in the native ABI (`archive-native`).
//! - [`splits`]: what is held out (`splits`).
//! - [`curriculum`]: tiers, splits and gates (`curriculum`, `gates`, `validated_kernels`).
//! - [`problems`]: KernelBench problems (`ingest-kernelbench`'s `problems`).
//! - [`eval`]: the hold-out evaluation's episodes (`eval`'s `episodes`).
//! - [`kb_specs`]: KernelBench native signatures and their coverage (`kb-specs`), recorded
//!   tests (`testgen`).
//! - [`rl`]: RL's steps and tiers (`rl-train`'s `metrics` and `tiers`).
//! - [`sft`]: SFT examples (`sft-data`, `collab-data`).
//! - [`sft_eval`]: the generator after SFT on the hold-out (`sft-eval`).
//! - [`tasks`]: task families and their reference kernels (`synth-tasks`).
//! - [`train`]: the model stages' step metrics and corpus (`pretrain`, SFT, `tokenizer`).
//! - [`turns`]: every turn of RL and the evaluation (`rl-train`'s and `eval`'s `turns`).
//! - [`validate`]: verdicts on the task and archive kernels (`validate`).

pub mod archive;
pub mod curriculum;
pub mod eval;
pub mod kb_specs;
pub mod problems;
pub mod rl;
pub mod sft;
pub mod sft_eval;
pub mod splits;
pub mod tasks;
pub mod train;
pub mod turns;
pub mod validate;

use std::path::Path;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use cudarl_data::{DataError, Table};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_arrow::schema::{SchemaLike, TracingOptions};

/// One row of a pipeline table.
pub trait TableRow: Serialize + DeserializeOwned {
    /// The table's name, as its stage's output names it (and as errors name a file without a
    /// path).
    const NAME: &'static str;

    /// The table's Arrow schema, traced from the type ([`traced`]); implementations keep it
    /// in a `LazyLock`.
    fn schema() -> SchemaRef;
}

/// Implements [`TableRow`] for the row type `$row` of the table named `$name`, its schema traced
/// once ([`traced`]).
#[macro_export]
macro_rules! table_row {
    ($row:ty, $name:literal) => {
        impl $crate::TableRow for $row {
            const NAME: &'static str = $name;
            fn schema() -> ::arrow::datatypes::SchemaRef {
                static S: ::std::sync::LazyLock<::arrow::datatypes::SchemaRef> =
                    ::std::sync::LazyLock::new($crate::traced::<$row>);
                S.clone()
            }
        }
    };
}

/// The Arrow schema of row type `T`, traced from its serde form: `String` as `utf8`, `i64`
/// as `int64`, `f64` as `float64`, `bool` as `boolean`, `Vec<T>` as `list<T>` with a nullable
/// `item` field (Arrow's default, as the hand-written schemas of `cudarl-data` have it),
/// `Option<T>` as a nullable column, fields in declaration order.
///
/// # Panics
/// `T` is not a struct of those types (a programming error, caught by each table's test).
pub fn traced<T: Serialize + DeserializeOwned>() -> SchemaRef {
    let opts = TracingOptions::default()
        .strings_as_large_utf8(false)
        .sequence_as_large_list(false);
    let fields = Vec::<FieldRef>::from_type::<T>(opts).expect("a table row type traces");
    Arc::new(Schema::new(
        fields
            .into_iter()
            .map(|f| item_named(&f))
            .collect::<Vec<_>>(),
    ))
}

/// `f` with every list's item field named `item` (serde_arrow names it `element`).
fn item_named(f: &Field) -> Field {
    let dt = match f.data_type() {
        DataType::List(item) => {
            let inner = item_named(item);
            DataType::List(Arc::new(Field::new(
                "item",
                inner.data_type().clone(),
                true,
            )))
        }
        DataType::Struct(fields) => DataType::Struct(
            fields
                .iter()
                .map(|c| Arc::new(item_named(c)))
                .collect::<Vec<_>>()
                .into(),
        ),
        other => other.clone(),
    };
    Field::new(f.name(), dt, f.is_nullable())
}

/// Whether a column of type `found` can be read as `expected` (list item names aside).
fn fits(expected: &DataType, found: &DataType) -> bool {
    match (expected, found) {
        (DataType::List(e), DataType::List(f) | DataType::LargeList(f)) => {
            fits(e.data_type(), f.data_type())
        }
        (DataType::Utf8, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => true,
        (DataType::Struct(e), DataType::Struct(f)) => e.iter().all(|ef| {
            f.iter()
                .find(|ff| ff.name() == ef.name())
                .is_some_and(|ff| fits(ef.data_type(), ff.data_type()))
        }),
        _ => expected == found,
    }
}

/// The rows of table `T` in the Parquet file `path` (`display` in errors), in file order.
/// Columns the type does not name are left out.
///
/// # Errors
/// [`DataError::BadInput`] naming `display` and the column: the file cannot be read, a column
/// of `T` is missing or of another type, or a non-nullable column holds a null.
pub fn read<T: TableRow>(path: &Path, display: &str) -> Result<Vec<T>, DataError> {
    let t = Table::read(path, display)?;
    from_batch(&t.batch, display)
}

/// The rows of table `T` in `batch` (named `display` in errors), checked as [`read`] does.
///
/// # Errors
/// As [`read`].
pub fn from_batch<T: TableRow>(batch: &RecordBatch, display: &str) -> Result<Vec<T>, DataError> {
    let want = T::schema();
    let have = batch.schema();
    let mut fields = Vec::with_capacity(want.fields().len());
    let mut columns = Vec::with_capacity(want.fields().len());
    for f in want.fields() {
        let Ok(i) = have.index_of(f.name()) else {
            return Err(DataError::bad(
                display,
                Some(f.name()),
                "required column is missing",
            ));
        };
        let found = have.field(i).data_type();
        if !fits(f.data_type(), found) {
            return Err(DataError::bad(
                display,
                Some(f.name()),
                format!("expected {}, found {found}", f.data_type()),
            ));
        }
        let col = batch.column(i);
        if !f.is_nullable() && col.null_count() > 0 {
            let row = (0..col.len()).find(|&r| col.is_null(r)).unwrap_or(0);
            return Err(DataError::bad(
                display,
                Some(f.name()),
                format!("null in row {row} (the column is required)"),
            ));
        }
        fields.push(have.fields()[i].clone());
        columns.push(col.clone());
    }
    serde_arrow::from_arrow(&fields, &columns)
        .map_err(|e| DataError::bad(display, None, format!("cannot read rows: {e}")))
}

/// A batch of table `T` holding `rows`, with `T`'s schema.
///
/// # Errors
/// [`DataError::Write`] when a value does not fit its column (a programming error).
pub fn to_batch<T: TableRow>(rows: &[T]) -> Result<RecordBatch, DataError> {
    cudarl_data::parquet_io::rows_batch(&T::schema(), rows)
}

/// Writes `rows` as the Parquet file `path` (deterministic bytes, `cudarl_data::write_parquet`).
///
/// # Errors
/// As [`to_batch`], or the file cannot be written.
pub fn write<T: TableRow>(path: &Path, rows: &[T]) -> Result<(), DataError> {
    cudarl_data::write_parquet(path, &to_batch(rows)?)
}

/// The schema of columns `(name, type, nullable)`, in order.
#[cfg(test)]
fn schema_of(cols: &[(&str, DataType, bool)]) -> Schema {
    Schema::new(
        cols.iter()
            .map(|(n, t, null)| Field::new(*n, t.clone(), *null))
            .collect::<Vec<_>>(),
    )
}

/// Asserts that row type `T`'s traced schema is the columns `(name, type, nullable)`, in
/// order: what each table's test holds its schema (and so its Parquet bytes) to.
#[cfg(test)]
pub(crate) fn assert_columns<T: TableRow>(cols: &[(&str, DataType, bool)]) {
    assert_eq!(*T::schema(), schema_of(cols), "table `{}`", T::NAME);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;

    use super::*;
    use crate::curriculum::{CurriculumRow, GateRow, ValidatedKernelRow};
    use crate::kb_specs::{CoverageRow, KbSpecRow};
    use crate::problems::ProblemRow;
    use crate::splits::SplitRow;

    fn f(name: &str, t: DataType, nullable: bool) -> Field {
        Field::new(name, t, nullable)
    }

    /// The traced schemas are the tables' documented ones, column for column: the Parquet
    /// files (and so their hashes) are the bytes the hand-written schemas gave.
    #[test]
    fn traced_schemas_are_the_documented_ones() {
        use DataType::{Boolean, Float64, Int64, Utf8};
        assert_eq!(
            *SplitRow::schema(),
            Schema::new(vec![
                f("item_id", Utf8, false),
                f("source", Utf8, false),
                f("level", Int64, true),
                f("group", Utf8, false),
                f("split", Utf8, false),
            ])
        );
        assert_eq!(
            *KbSpecRow::schema(),
            Schema::new(vec![
                f("problem_id", Utf8, false),
                f("level", Int64, false),
                f("covered", Boolean, false),
                f("excluded_reason", Utf8, true),
                f("signature", Utf8, true),
                f("sizes_json", Utf8, false),
                f("buffers_json", Utf8, false),
                f("constants_json", Utf8, false),
            ])
        );
        assert_eq!(
            *CoverageRow::schema(),
            Schema::new(vec![
                f("level", Int64, false),
                f("problems", Int64, false),
                f("covered", Int64, false),
                f("fraction", Float64, false),
                f("goal", Float64, true),
            ])
        );
        assert_eq!(ProblemRow::schema(), cudarl_data::schemas::PROBLEMS.clone());
        let list = || DataType::List(Arc::new(f("item", Utf8, true)));
        let strs = |names: &[&str]| names.iter().map(|n| f(n, Utf8, false)).collect::<Vec<_>>();
        let mut tasks = strs(&["task_id"]);
        tasks.push(f("tier", Int64, false));
        tasks.extend(strs(&["description", "dtype", "signature", "train_shapes"]));
        tasks.extend(strs(&["holdout_shapes"]));
        tasks.extend([f("atol", Float64, false), f("rtol", Float64, false)]);
        tasks.extend(strs(&["bytes", "flops", "spec_json", "problem", "group"]));
        assert_eq!(*crate::tasks::TaskRow::schema(), Schema::new(tasks));
        let (b, i, fl) = (Boolean, Int64, Float64);
        let mut v = strs(&["kernel_id", "task_id", "role", "mode"]);
        v.extend([
            f("compiled", b.clone(), false),
            f("executed", b.clone(), false),
        ]);
        v.extend([f("correct", b.clone(), true), f("failure", Utf8, true)]);
        v.extend([
            f("failure_detail", Utf8, true),
            f("static_flags", list(), false),
        ]);
        v.extend([
            f("hack_flags", list(), false),
            f("registers", i.clone(), true),
        ]);
        v.extend([
            f("shared_mem_bytes", i.clone(), true),
            f("spill_bytes", i.clone(), true),
        ]);
        v.extend([f("tests", i.clone(), false), f("tests_passed", i, false)]);
        for n in [
            "max_abs_err",
            "max_rel_err",
            "median_ms",
            "p10_ms",
            "p90_ms",
            "cv",
        ] {
            v.push(f(n, fl.clone(), true));
        }
        for n in ["speedup_vs_naive", "torch_median_ms", "speedup_vs_torch"] {
            v.push(f(n, fl.clone(), true));
        }
        v.extend([
            f("dram_fraction_of_peak", fl.clone(), true),
            f("gpu", Utf8, true),
        ]);
        v.extend(strs(&["nvcc", "arch", "verdict_json", "source"]));
        v.extend([
            f("claimed_correct", b, true),
            f("claimed_speedup", fl, true),
        ]);
        assert_eq!(*crate::validate::ValidationRow::schema(), Schema::new(v));
        let mut kt = strs(&["problem_id"]);
        kt.push(f("seed", Int64, false));
        kt.extend(strs(&[
            "split",
            "dist",
            "sizes_json",
            "blob",
            "tensors_json",
        ]));
        kt.push(f("bytes", Int64, false));
        kt.extend(strs(&["device"]));
        assert_eq!(*crate::kb_specs::KbTestRow::schema(), Schema::new(kt));
        crate::assert_columns::<kb_specs::KbTestgenRow>(&[
            ("problem_id", Utf8, false),
            ("level", Int64, false),
            ("status", Utf8, false),
            ("reason", Utf8, true),
            ("test_sizes_json", Utf8, false),
            ("test_bytes", Int64, false),
            ("full_bytes", Int64, false),
            ("rand_mix_note", Utf8, true),
            ("tests", Int64, false),
        ]);
        assert_eq!(
            *crate::tasks::TaskKernelRow::schema(),
            Schema::new(strs(&["kernel_id", "task_id", "role", "file", "code"]))
        );
        assert_eq!(
            *CurriculumRow::schema(),
            Schema::new(vec![
                f("problem_id", Utf8, false),
                f("source", Utf8, false),
                f("level", Int64, true),
                f("name", Utf8, false),
                f("tier", Int64, false),
                f("tier_reason", Utf8, false),
                f("op_features", list(), false),
                f("op_categories", list(), false),
                f("unknown_ops", list(), false),
                f("split", Utf8, false),
                f("archive_kernels", Int64, false),
                f("archive_claimed_correct", Int64, false),
                f("archive_best_claimed_speedup", Float64, true),
                f("archive_reference_drift", Boolean, false),
                f("signature", Utf8, true),
                f("train_shapes", Utf8, true),
                f("holdout_shapes", Utf8, true),
                f("validated_kernels", Int64, false),
                f("best_validated_speedup", Float64, true),
            ])
        );
        let ints = |names: &[&str]| names.iter().map(|n| f(n, Int64, false)).collect::<Vec<_>>();
        let mut gates = ints(&["tier"]);
        gates.extend([
            f("min_compile_rate", Float64, false),
            f("min_pass_rate", Float64, false),
        ]);
        gates.extend(ints(&["problems", "train", "val", "test"]));
        assert_eq!(*GateRow::schema(), Schema::new(gates));
        assert_eq!(
            *ValidatedKernelRow::schema(),
            Schema::new(vec![
                f("kernel_id", Utf8, false),
                f("problem_id", Utf8, false),
                f("role", Utf8, false),
                f("tests", Int64, false),
                f("median_ms", Float64, false),
                f("speedup_vs_naive", Float64, true),
                f("speedup_vs_torch", Float64, true),
                f("gpu", Utf8, false),
            ])
        );
    }

    #[test]
    fn rows_written_are_the_rows_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("splits.parquet");
        let rows = vec![
            SplitRow {
                item_id: "kb/L1/19_ReLU".into(),
                source: "kernelbench".into(),
                level: Some(1),
                group: "kb/L1/19_ReLU".into(),
                split: "test".into(),
            },
            SplitRow {
                item_id: "synth/vector_add".into(),
                source: "synthetic".into(),
                level: None,
                group: "vector_add".into(),
                split: "train".into(),
            },
        ];
        write(&p, &rows).unwrap();
        assert_eq!(read::<SplitRow>(&p, "splits").unwrap(), rows);
        let problems = vec![ProblemRow {
            problem_id: "kb/L1/1_x".into(),
            level: 1,
            number: 1,
            name: "1_x".into(),
            code: "class Model: ...".into(),
            code_hash: "00".into(),
            op_features: vec!["matmul".into(), "relu".into()],
            source_kind: "bundled".into(),
            source_repo: None,
            source_commit: Some("abc".into()),
            source_path: None,
        }];
        let pp = dir.path().join("problems.parquet");
        write(&pp, &problems).unwrap();
        assert_eq!(read::<ProblemRow>(&pp, "problems").unwrap(), problems);
    }

    #[test]
    fn a_missing_mistyped_or_null_column_is_named_with_its_file() {
        let batch = |cols: Vec<(&str, ArrayRef)>| {
            let schema = Schema::new(
                cols.iter()
                    .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
                    .collect::<Vec<_>>(),
            );
            RecordBatch::try_new(Arc::new(schema), cols.into_iter().map(|c| c.1).collect()).unwrap()
        };
        let s = |v: Vec<Option<&str>>| -> ArrayRef { Arc::new(StringArray::from(v)) };
        let good = || {
            vec![
                ("item_id", s(vec![Some("synth/a")])),
                ("source", s(vec![Some("synthetic")])),
                (
                    "level",
                    Arc::new(Int64Array::from(vec![None::<i64>])) as ArrayRef,
                ),
                ("group", s(vec![Some("a")])),
                ("split", s(vec![Some("rl")])),
                ("extra", s(vec![Some("left out")])),
            ]
        };
        assert_eq!(
            from_batch::<SplitRow>(&batch(good()), "x.parquet")
                .unwrap()
                .len(),
            1
        );
        let msg = |cols| {
            from_batch::<SplitRow>(&batch(cols), "x.parquet")
                .unwrap_err()
                .to_string()
        };
        let mut missing = good();
        missing.remove(3);
        assert_eq!(
            msg(missing),
            "x.parquet: column `group`: required column is missing"
        );
        let mut typed = good();
        typed[2].1 = s(vec![Some("1")]);
        assert_eq!(
            msg(typed),
            "x.parquet: column `level`: expected Int64, found Utf8"
        );
        let mut null = good();
        null[4].1 = s(vec![None]);
        assert_eq!(
            msg(null),
            "x.parquet: column `split`: null in row 0 (the column is required)"
        );
    }
}
