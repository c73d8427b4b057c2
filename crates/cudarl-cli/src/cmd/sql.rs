//! `cudarl-pipe sql QUERY`: SQL over the tables of every node that is fresh under the current
//! settings ([`cudarl_sql`]), named `node.table`.

use std::path::Path;

use super::{CliError, Ctx};

/// Runs `query`; prints the result (a table, or JSON Lines with `json`) or writes it to
/// `parquet`. Exit 2 for a query polars refuses (the nodes not built under these settings named
/// beside its message).
#[cfg(feature = "sql")]
pub fn run(ctx: &Ctx, query: &str, json: bool, parquet: Option<&Path>) -> Result<i32, CliError> {
    let engine = ctx.engine_to_read(std::sync::Arc::new(cudarl_core::NullReporter), 1)?;
    let (mut tables, mut missing) = (Vec::new(), Vec::new());
    for node in ctx.pipeline()?.node_names() {
        match engine.fresh_manifest(&node) {
            Ok(m) => tables.extend(
                m.outputs
                    .iter()
                    .filter(|(_, rec)| rec.file_name.ends_with(".parquet"))
                    .map(|(name, rec)| cudarl_sql::Table {
                        name: format!("{node}.{name}"),
                        path: engine.store().blob_path(&rec.hash),
                    }),
            ),
            Err(_) => missing.push(node),
        }
    }
    let mut df = cudarl_sql::query(&tables, query).map_err(|e| {
        let hint = if missing.is_empty() {
            String::new()
        } else {
            format!(
                " (not built under these settings, so not queryable: {}; `cudarl-pipe run NODE` builds one)",
                missing.join(", ")
            )
        };
        CliError::usage(format!("sql: {e}{hint}"))
    })?;
    if let Some(path) = parquet {
        cudarl_sql::write_parquet(&mut df, path).map_err(CliError::failed)?;
        println!("{} rows -> {}", df.height(), path.display());
    } else if json {
        cudarl_sql::write_json_lines(&mut df, std::io::stdout().lock())
            .map_err(CliError::failed)?;
    } else {
        println!("{df}");
    }
    Ok(0)
}

/// Without the `sql` feature: says how to build it (exit 2).
#[cfg(not(feature = "sql"))]
pub fn run(_: &Ctx, _: &str, _: bool, _: Option<&Path>) -> Result<i32, CliError> {
    Err(CliError::usage(
        "sql: this build has no `sql` (polars); build it with `make build FEATURES=sql` or `cargo build --release -p cudarl-cli --features sql`",
    ))
}
