//! Deterministic Parquet writing and checked Parquet reading.
//!
//! Writer options are pinned so the same rows always give the same bytes (the content hash of
//! an output is its identity, and early cutoff depends on it): `created_by` is a fixed string
//! (not the parquet crate's version), ZSTD level 3, row groups of at most
//! [`ROW_GROUP_ROWS`] rows, Parquet format 1.0 (readable by every tool), page-level statistics.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::{DataType, Float64Type, Int64Type, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::{DataError, Result};

/// Maximum rows per row group in files we write.
pub const ROW_GROUP_ROWS: usize = 65_536;

/// The `created_by` string in every file we write.
pub const CREATED_BY: &str = "cudarl-pipe (deterministic writer v1)";

fn writer_props() -> WriterProperties {
    WriterProperties::builder()
        .set_created_by(CREATED_BY.to_string())
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).expect("valid zstd level"),
        ))
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build()
}

/// Writes `batch` to `path` with the pinned options. The batch's schema is the file's schema.
///
/// # Errors
/// [`DataError::Write`] naming the file.
pub fn write_parquet(path: &Path, batch: &RecordBatch) -> Result<()> {
    let werr = |m: String| DataError::Write {
        file: path.display().to_string(),
        message: m,
    };
    let file = File::create(path).map_err(|e| werr(e.to_string()))?;
    let mut w = ArrowWriter::try_new(file, batch.schema(), Some(writer_props()))
        .map_err(|e| werr(e.to_string()))?;
    w.write(batch).map_err(|e| werr(e.to_string()))?;
    let f = w.into_inner().map_err(|e| werr(e.to_string()))?;
    f.sync_all().map_err(|e| werr(e.to_string()))?;
    Ok(())
}

/// Builds a batch from columns, checking them against `schema`.
///
/// # Errors
/// Column count, type or nullability mismatch (a bug in the caller), as [`DataError::Write`].
pub fn batch(schema: &SchemaRef, columns: Vec<ArrayRef>) -> Result<RecordBatch> {
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| DataError::Write {
        file: "(record batch)".into(),
        message: e.to_string(),
    })
}

/// A batch of `schema` from typed rows: each row a struct whose fields are the schema's columns
/// by name (an `Option` for a nullable column), serialized with `serde_arrow`. The batch
/// carries `schema` itself, so rows written this way and column by column are the same bytes.
///
/// # Errors
/// A row's field is missing or does not fit its column's type (the message names it).
pub fn rows_batch<T: serde::Serialize>(schema: &SchemaRef, rows: &[T]) -> Result<RecordBatch> {
    let err = |message: String| DataError::Write {
        file: "(record batch)".into(),
        message,
    };
    let b = serde_arrow::to_record_batch(schema.fields(), &rows).map_err(|e| err(e.to_string()))?;
    RecordBatch::try_new(schema.clone(), b.columns().to_vec()).map_err(|e| err(e.to_string()))
}

/// A whole Parquet file in memory, with typed, checked column access.
#[derive(Debug, Clone)]
pub struct Table {
    /// File as named in messages.
    pub file: String,
    /// The file's Arrow schema.
    pub schema: SchemaRef,
    /// All rows in one batch.
    pub batch: RecordBatch,
}

impl Table {
    /// Reads a whole Parquet file. `display` is the name used in error messages.
    ///
    /// # Errors
    /// [`DataError::BadInput`] if the file is missing, not Parquet, or corrupt.
    pub fn read(path: &Path, display: &str) -> Result<Table> {
        let file = File::open(path)
            .map_err(|e| DataError::bad(display, None, format!("cannot open: {e}")))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file)
            .map_err(|e| DataError::bad(display, None, format!("not a valid Parquet file: {e}")))?;
        let schema = builder.schema().clone();
        let reader = builder
            .with_batch_size(8192)
            .build()
            .map_err(|e| DataError::bad(display, None, format!("cannot read Parquet: {e}")))?;
        let mut batches = Vec::new();
        for b in reader {
            batches.push(b.map_err(|e| {
                DataError::bad(display, None, format!("corrupt Parquet data: {e}"))
            })?);
        }
        let batch = concat_batches(&schema, &batches)
            .map_err(|e| DataError::bad(display, None, format!("cannot assemble batches: {e}")))?;
        Ok(Table {
            file: display.to_string(),
            schema,
            batch,
        })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.batch.num_rows()
    }

    /// Whether a column exists.
    pub fn has(&self, name: &str) -> bool {
        self.schema.index_of(name).is_ok()
    }

    fn col(&self, name: &str) -> Option<&ArrayRef> {
        self.schema
            .index_of(name)
            .ok()
            .map(|i| self.batch.column(i))
    }

    fn cast_to(
        &self,
        name: &str,
        to: &DataType,
        what: &str,
        ok: impl Fn(&DataType) -> bool,
    ) -> Result<Option<ArrayRef>> {
        let Some(c) = self.col(name) else {
            return Ok(None);
        };
        if !ok(c.data_type()) {
            return Err(DataError::bad(
                &self.file,
                Some(name),
                format!("expected {what}, found {}", c.data_type()),
            ));
        }
        cast(c, to).map(Some).map_err(|e| {
            DataError::bad(
                &self.file,
                Some(name),
                format!("cannot read as {what}: {e}"),
            )
        })
    }

    /// A string column (Utf8, LargeUtf8 or Utf8View), `None` if absent.
    ///
    /// # Errors
    /// The column has another type.
    pub fn strings(&self, name: &str) -> Result<Option<StrCol>> {
        let a = self.cast_to(name, &DataType::Utf8, "a string column", |t| {
            matches!(
                t,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
            )
        })?;
        Ok(a.map(StrCol))
    }

    /// An integer column (any integer width), `None` if absent.
    ///
    /// # Errors
    /// The column has another type.
    pub fn ints(&self, name: &str) -> Result<Option<I64Col>> {
        let a = self.cast_to(name, &DataType::Int64, "an integer column", |t| {
            t.is_integer() || *t == DataType::Null
        })?;
        Ok(a.map(I64Col))
    }

    /// A floating-point column (floats or integers), `None` if absent.
    ///
    /// # Errors
    /// The column has another type.
    pub fn floats(&self, name: &str) -> Result<Option<F64Col>> {
        let a = self.cast_to(name, &DataType::Float64, "a numeric column", |t| {
            t.is_floating() || t.is_integer() || *t == DataType::Null
        })?;
        Ok(a.map(F64Col))
    }

    /// A boolean column, `None` if absent.
    ///
    /// # Errors
    /// The column has another type.
    pub fn bools(&self, name: &str) -> Result<Option<BoolCol>> {
        let a = self.cast_to(name, &DataType::Boolean, "a boolean column", |t| {
            matches!(t, DataType::Boolean | DataType::Null)
        })?;
        Ok(a.map(BoolCol))
    }

    /// Like [`Table::strings`] but the column must exist.
    ///
    /// # Errors
    /// Missing column or wrong type.
    pub fn req_strings(&self, name: &str) -> Result<StrCol> {
        self.strings(name)?.ok_or_else(|| self.missing(name))
    }

    /// Like [`Table::ints`] but the column must exist.
    ///
    /// # Errors
    /// Missing column or wrong type.
    pub fn req_ints(&self, name: &str) -> Result<I64Col> {
        self.ints(name)?.ok_or_else(|| self.missing(name))
    }

    /// Like [`Table::floats`] but the column must exist.
    ///
    /// # Errors
    /// Missing column or wrong type.
    pub fn req_floats(&self, name: &str) -> Result<F64Col> {
        self.floats(name)?.ok_or_else(|| self.missing(name))
    }

    /// Like [`Table::bools`] but the column must exist.
    ///
    /// # Errors
    /// Missing column or wrong type.
    pub fn req_bools(&self, name: &str) -> Result<BoolCol> {
        self.bools(name)?.ok_or_else(|| self.missing(name))
    }

    fn missing(&self, name: &str) -> DataError {
        DataError::bad(&self.file, Some(name), "required column is missing")
    }
}

/// A string column.
#[derive(Debug, Clone)]
pub struct StrCol(ArrayRef);
impl StrCol {
    /// Value at row `i` (None for null).
    pub fn get(&self, i: usize) -> Option<&str> {
        let a = self.0.as_string::<i32>();
        if a.is_null(i) { None } else { Some(a.value(i)) }
    }
}

/// An integer column.
#[derive(Debug, Clone)]
pub struct I64Col(ArrayRef);
impl I64Col {
    /// Value at row `i` (None for null).
    pub fn get(&self, i: usize) -> Option<i64> {
        let a = self.0.as_primitive::<Int64Type>();
        if a.is_null(i) { None } else { Some(a.value(i)) }
    }
}

/// A float column.
#[derive(Debug, Clone)]
pub struct F64Col(ArrayRef);
impl F64Col {
    /// Value at row `i` (None for null).
    pub fn get(&self, i: usize) -> Option<f64> {
        let a = self.0.as_primitive::<Float64Type>();
        if a.is_null(i) { None } else { Some(a.value(i)) }
    }
}

/// A boolean column.
#[derive(Debug, Clone)]
pub struct BoolCol(ArrayRef);
impl BoolCol {
    /// Value at row `i` (None for null).
    pub fn get(&self, i: usize) -> Option<bool> {
        let a = self.0.as_boolean();
        if a.is_null(i) { None } else { Some(a.value(i)) }
    }
}

/// Shorthand: an `Arc`'d array.
pub fn arc<A: Array + 'static>(a: A) -> ArrayRef {
    Arc::new(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_rows_give_the_bytes_of_the_same_columns_and_a_misfit_row_is_named() {
        use arrow::array::Float64Array;
        #[derive(serde::Serialize)]
        struct Key {
            step: i64,
        }
        #[derive(serde::Serialize)]
        struct Row<'a> {
            #[serde(flatten)]
            key: Key,
            name: &'a str,
            rate: Option<f64>,
        }
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("step", DataType::Int64, false),
            Field::new("name", DataType::Utf8, false),
            Field::new("rate", DataType::Float64, true),
        ]));
        let rows = [
            Row {
                key: Key { step: 1 },
                name: "a",
                rate: Some(0.5),
            },
            Row {
                key: Key { step: 2 },
                name: "b",
                rate: None,
            },
        ];
        let typed = rows_batch(&schema, &rows).unwrap();
        let cols = batch(
            &schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec!["a", "b"])),
                Arc::new(Float64Array::from(vec![Some(0.5), None])),
            ],
        )
        .unwrap();
        assert_eq!(typed, cols);
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a.parquet"), d.path().join("b.parquet"));
        write_parquet(&a, &typed).unwrap();
        write_parquet(&b, &cols).unwrap();
        assert_eq!(std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        // A null in a non-nullable column is refused, naming the column.
        #[derive(serde::Serialize)]
        struct Bad {
            step: i64,
            name: Option<&'static str>,
            rate: f64,
        }
        let e = rows_batch(
            &schema,
            &[Bad {
                step: 1,
                name: None,
                rate: 0.0,
            }],
        )
        .unwrap_err();
        assert!(e.to_string().contains("name"), "{e}");
    }
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};

    fn sample() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        batch(
            &schema,
            vec![
                arc(Int64Array::from(vec![1, 2, 3])),
                arc(StringArray::from(vec![Some("a"), None, Some("c")])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn writes_identical_bytes_twice_and_reads_back() {
        let d = tempfile::tempdir().unwrap();
        let (p1, p2) = (d.path().join("a.parquet"), d.path().join("b.parquet"));
        write_parquet(&p1, &sample()).unwrap();
        write_parquet(&p2, &sample()).unwrap();
        assert_eq!(std::fs::read(&p1).unwrap(), std::fs::read(&p2).unwrap());
        let t = Table::read(&p1, "a.parquet").unwrap();
        assert_eq!(t.rows(), 3);
        assert_eq!(t.req_ints("id").unwrap().get(2), Some(3));
        assert_eq!(t.req_strings("name").unwrap().get(1), None);
        let e = t.req_floats("nope").unwrap_err().to_string();
        assert!(e.contains("a.parquet") && e.contains("nope"), "{e}");
        let e = t.req_bools("name").unwrap_err().to_string();
        assert!(e.contains("column `name`") && e.contains("boolean"), "{e}");
    }

    #[test]
    fn malformed_file_names_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("bad.parquet");
        std::fs::write(&p, b"PAR1 this is not parquet").unwrap();
        let e = Table::read(&p, "datasets/bad.parquet")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("datasets/bad.parquet"), "{e}");
    }
}
