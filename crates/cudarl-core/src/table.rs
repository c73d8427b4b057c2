//! Inspection of Parquet outputs: row count and Arrow schema from the footer, schema hashes,
//! and a readable diff between a declared and an actual schema.

use std::fs::File;
use std::path::Path;

use arrow_schema::{Schema, SchemaRef};
use parquet::arrow::parquet_to_arrow_schema;
use parquet::file::reader::{FileReader, SerializedFileReader};

/// Reads the footer of a Parquet file: (rows, Arrow schema).
///
/// # Errors
/// A message naming the problem (not a Parquet file, truncated footer, unknown types).
pub fn inspect_parquet(path: &Path) -> Result<(u64, SchemaRef), String> {
    let f = File::open(path).map_err(|e| format!("open: {e}"))?;
    let reader =
        SerializedFileReader::new(f).map_err(|e| format!("not a readable Parquet file: {e}"))?;
    let meta = reader.metadata().file_metadata();
    let rows = u64::try_from(meta.num_rows()).unwrap_or(0);
    let schema = parquet_to_arrow_schema(meta.schema_descr(), meta.key_value_metadata())
        .map_err(|e| format!("cannot convert Parquet schema to Arrow: {e}"))?;
    Ok((rows, std::sync::Arc::new(schema)))
}

/// Stable text form of a schema: one `name: type (nullable)` line per field, metadata ignored.
pub fn schema_signature(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| {
            format!(
                "{}: {}{}",
                f.name(),
                f.data_type(),
                if f.is_nullable() { " (nullable)" } else { "" }
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Hash of [`schema_signature`] (first 16 hex chars of BLAKE3).
pub fn schema_hash(schema: &Schema) -> String {
    let mut h = blake3::hash(schema_signature(schema).as_bytes())
        .to_hex()
        .to_string();
    h.truncate(16);
    h
}

/// `None` when `actual` has exactly the fields of `expected` (names, order, types,
/// nullability); otherwise a description of the first differences.
pub fn schema_mismatch(expected: &Schema, actual: &Schema) -> Option<String> {
    let mut problems = Vec::new();
    let n = expected.fields().len().max(actual.fields().len());
    for i in 0..n {
        match (expected.fields().get(i), actual.fields().get(i)) {
            (Some(e), Some(a)) => {
                if e.name() != a.name()
                    || e.data_type() != a.data_type()
                    || e.is_nullable() != a.is_nullable()
                {
                    problems.push(format!(
                        "column {i}: expected `{}` {}{}, found `{}` {}{}",
                        e.name(),
                        e.data_type(),
                        if e.is_nullable() { " nullable" } else { "" },
                        a.name(),
                        a.data_type(),
                        if a.is_nullable() { " nullable" } else { "" }
                    ));
                }
            }
            (Some(e), None) => problems.push(format!("missing column `{}`", e.name())),
            (None, Some(a)) => problems.push(format!("unexpected column `{}`", a.name())),
            (None, None) => {}
        }
    }
    if problems.is_empty() {
        None
    } else {
        let more = problems.len().saturating_sub(3);
        let mut s = problems.into_iter().take(3).collect::<Vec<_>>().join("; ");
        if more > 0 {
            s.push_str(&format!("; and {more} more"));
        }
        Some(s)
    }
}
