//! SQL over the pipeline's Parquet tables (`cudarl-pipe sql`), with polars' SQL context over
//! lazy scans of the store's blobs: only the columns and row groups a query needs are read.
//!
//! Tables are named `node.table` (`eval.episodes`, `curriculum.gates`, `sft-data.sft_generator`).
//! polars resolves a table by the first part of a dotted name, so each is registered under the
//! whole name as one identifier and [`quote_names`] quotes the known names a query writes bare
//! (`FROM eval.episodes` -> `FROM "eval.episodes"`); quoted names pass unchanged.

use std::path::PathBuf;

use polars::prelude::*;
use polars::sql::SQLContext;

/// A table a query can name: `node.table` and its Parquet file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// `node.table`.
    pub name: String,
    /// The Parquet file (a store blob).
    pub path: PathBuf,
}

/// `sql` with every bare occurrence of a name in `names` (not inside quotes, not part of a
/// longer identifier) put in double quotes, longest names first.
pub fn quote_names(sql: &str, names: &[&str]) -> String {
    let mut names: Vec<&str> = names.to_vec();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    let ident = |c: char| c.is_alphanumeric() || c == '_' || c == '-' || c == '.';
    let mut out = String::with_capacity(sql.len() + 16);
    let (mut i, bytes) = (0, sql.as_bytes());
    let mut quote: Option<u8> = None;
    while i < sql.len() {
        let c = bytes[i];
        if let Some(q) = quote {
            if c == q {
                quote = None;
            }
        } else if c == b'"' || c == b'\'' {
            quote = Some(c);
        } else if !sql[..i].chars().next_back().is_some_and(ident)
            && let Some(n) = names.iter().find(|n| {
                sql[i..].starts_with(**n) && !sql[i + n.len()..].chars().next().is_some_and(ident)
            })
        {
            out.push('"');
            out.push_str(n);
            out.push('"');
            i += n.len();
            continue;
        }
        let ch = sql[i..].chars().next().expect("in bounds");
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// Why a query or a write of its result failed.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    /// A table's file is not Parquet polars can scan.
    #[error("{name} ({path}): {source}")]
    Table {
        /// The table's name in the query.
        name: String,
        /// Its file.
        path: String,
        /// polars' error.
        source: PolarsError,
    },
    /// polars cannot parse or run the query (an unknown table or column is named there).
    #[error(transparent)]
    Query(PolarsError),
    /// The result could not be written (the file, when there is one, is named).
    #[error("{0}")]
    Write(String),
}

/// Runs `sql` over `tables` and collects the result.
///
/// # Errors
/// A file that is not Parquet, or polars' own message for a query it cannot parse or run (an
/// unknown table or column is named there).
pub fn query(tables: &[Table], sql: &str) -> Result<DataFrame, SqlError> {
    let ctx = SQLContext::new();
    for t in tables {
        let lf = LazyFrame::scan_parquet(
            PlRefPath::from(t.path.to_string_lossy().as_ref()),
            ScanArgsParquet::default(),
        )
        .map_err(|source| SqlError::Table {
            name: t.name.clone(),
            path: t.path.display().to_string(),
            source,
        })?;
        ctx.register(&t.name, lf);
    }
    let names: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
    let mut ctx = ctx;
    ctx.execute(&quote_names(sql, &names))
        .and_then(|lf| lf.collect())
        .map_err(SqlError::Query)
}

/// Writes `df` as JSON Lines to `w`: one object per row, every column present, nulls as
/// `null`, the same writer and conventions as `show --json` (docs/json.md). The frame goes
/// through Parquet into Arrow (arrow-rs's JSON writer); polars' own JSON writer would bring in
/// serde_json's `preserve_order` feature for the whole build, which changes key order in the
/// pipeline's canonical JSON.
///
/// # Errors
/// The frame cannot be written as Parquet, or a write fails.
pub fn write_json_lines(df: &mut DataFrame, w: impl std::io::Write) -> Result<(), SqlError> {
    let e = |e: &dyn std::fmt::Display| SqlError::Write(e.to_string());
    let mut f = tempfile::tempfile().map_err(|x| e(&x))?;
    ParquetWriter::new(&mut f).finish(df).map_err(|x| e(&x))?;
    let batches = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .and_then(|b| b.build())
        .map_err(|x| e(&x))?;
    let mut jw = arrow::json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow::json::writer::LineDelimited>(w);
    for b in batches {
        jw.write(&b.map_err(|x| e(&x))?).map_err(|x| e(&x))?;
    }
    jw.finish().map_err(|x| e(&x))
}

/// Writes `df` as a Parquet file at `path`.
///
/// # Errors
/// The file cannot be created or written.
pub fn write_parquet(df: &mut DataFrame, path: &std::path::Path) -> Result<(), SqlError> {
    let e = |e: &dyn std::fmt::Display| SqlError::Write(format!("{}: {e}", path.display()));
    let f = std::fs::File::create(path).map_err(|x| e(&x))?;
    ParquetWriter::new(f)
        .finish(df)
        .map(|_| ())
        .map_err(|x| e(&x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_names_are_quoted_once_and_nothing_else_is() {
        let names = ["eval.episodes", "eval.summary", "sft-data.sft_generator"];
        assert_eq!(
            quote_names(
                "SELECT tier, avg(pass) FROM eval.episodes e JOIN \"eval.summary\" s ON e.x = s.x WHERE e.note = 'eval.episodes' GROUP BY tier",
                &names
            ),
            "SELECT tier, avg(pass) FROM \"eval.episodes\" e JOIN \"eval.summary\" s ON e.x = s.x WHERE e.note = 'eval.episodes' GROUP BY tier"
        );
        assert_eq!(
            quote_names("select * from sft-data.sft_generator", &names),
            "select * from \"sft-data.sft_generator\""
        );
        // Part of a longer identifier: left alone.
        assert_eq!(
            quote_names("select * from my_eval.episodes2", &names),
            "select * from my_eval.episodes2"
        );
    }

    #[test]
    fn queries_run_over_parquet_files_by_node_and_table_name() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("t.parquet");
        let mut df = df!(
            "tier" => [0i64, 0, 1, 1, 1],
            "pass" => [Some(1.0f64), Some(0.0), Some(1.0), None, Some(1.0)],
        )
        .unwrap();
        write_parquet(&mut df, &path).unwrap();
        let tables = [Table {
            name: "eval.episodes".into(),
            path,
        }];
        let mut out = query(
            &tables,
            "SELECT tier, avg(pass) AS pass, count(*) AS n FROM eval.episodes GROUP BY tier ORDER BY tier",
        )
        .unwrap();
        assert_eq!(out.height(), 2);
        let mut buf = Vec::new();
        write_json_lines(&mut out, &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(rows[0], r#"{"tier":0,"pass":0.5,"n":2}"#);
        assert_eq!(rows[1], r#"{"tier":1,"pass":1.0,"n":3}"#);
        let e = query(&tables, "SELECT * FROM eval.nope").unwrap_err();
        assert!(
            matches!(&e, SqlError::Query(_)) && e.to_string().contains("eval"),
            "{e}"
        );
    }
}
