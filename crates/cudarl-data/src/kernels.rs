//! The normalized `kernels` table (see [`crate::schemas::KERNELS`]): row type, NCU profile
//! parsing, and the batch builder shared by the SakanaAI and CUDA-L1 ingesters.

use std::collections::HashMap;

use arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, ListBuilder, RecordBatch,
    StringBuilder, StructBuilder,
};
use arrow::datatypes::{DataType, Fields};

use crate::error::Result;
use crate::parquet_io::batch;
use crate::pyrepr::{self, PyValue};
use crate::schemas::{KERNELS, NCU_TYPED, ncu_metric_struct, ncu_rule_struct};

/// One raw NCU metric.
#[derive(Debug, Clone, PartialEq)]
pub struct NcuMetric {
    /// Metric name as in the archive (e.g. `Achieved Occupancy`).
    pub name: String,
    /// Unit string as in the archive (e.g. `%`, `Gbyte/second`).
    pub unit: Option<String>,
    /// Average over profiled launches, in `unit`.
    pub avg_value: Option<f64>,
    /// Variance over launches, in `unit`².
    pub variance: Option<f64>,
    /// Number of profiled launches.
    pub n: Option<i64>,
}

/// One NCU rule result.
#[derive(Debug, Clone, PartialEq)]
pub struct NcuRule {
    /// Rule name (e.g. `Occupancy`).
    pub name: String,
    /// `WRN`, `INF`, `OPT`...
    pub kind: Option<String>,
    /// The rule's text.
    pub description: Option<String>,
}

/// A parsed `NCU_Profile` cell.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NcuProfile {
    /// Typed values, in the order of [`NCU_TYPED`], normalized to the column's unit.
    pub typed: Vec<Option<f64>>,
    /// Every metric, sorted by name.
    pub metrics: Vec<NcuMetric>,
    /// Every rule, sorted by name.
    pub rules: Vec<NcuRule>,
}

fn si_scale(prefix: &str) -> Option<f64> {
    Some(match prefix {
        "" => 1.0,
        "K" | "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "m" => 1e-3,
        "u" => 1e-6,
        "n" => 1e-9,
        _ => return None,
    })
}

/// Converts `value` in `unit` to `target` unit: exact match, or an SI prefix (K, M, G, T, m,
/// u, n) on the same base unit (NCU prints e.g. `Gbyte/second` or `Kbyte/second` per row).
pub fn normalize_unit(value: f64, unit: &str, target: &str) -> Option<f64> {
    if unit == target {
        return Some(value);
    }
    if target.is_empty() {
        return None;
    }
    let prefix = unit.strip_suffix(target)?;
    si_scale(prefix).map(|s| value * s)
}

/// Why an `NCU_Profile` text is not a profile.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NcuError {
    /// Not a Python literal.
    #[error(transparent)]
    Literal(#[from] pyrepr::ParseError),
    /// A literal, but not a dict of the profile's shape (what is not).
    #[error("{0}")]
    Shape(&'static str),
}

/// Parses the archive's `NCU_Profile` Python-repr dict.
///
/// # Errors
/// [`NcuError`]: the text is not a Python literal, or not one of the expected shape.
pub fn parse_ncu(text: &str) -> std::result::Result<NcuProfile, NcuError> {
    let v = pyrepr::parse(text)?;
    let d = v.as_dict().ok_or(NcuError::Shape("not a dict"))?;
    let mut metrics = Vec::new();
    if let Some(m) = d.get("metrics") {
        let m = m
            .as_dict()
            .ok_or(NcuError::Shape("`metrics` is not a dict"))?;
        for (name, mv) in m {
            let md = mv.as_dict();
            let get = |k: &str| md.and_then(|d| d.get(k));
            metrics.push(NcuMetric {
                name: name.clone(),
                unit: get("unit").and_then(PyValue::as_str).map(str::to_string),
                avg_value: get("avg_value").and_then(PyValue::as_f64),
                variance: get("variance").and_then(PyValue::as_f64),
                n: get("n").and_then(PyValue::as_i64),
            });
        }
    }
    let mut rules = Vec::new();
    if let Some(r) = d.get("rules")
        && let Some(r) = r.as_dict()
    {
        for (name, rv) in r {
            let rd = rv.as_dict();
            let get = |k: &str| {
                rd.and_then(|d| d.get(k))
                    .and_then(PyValue::as_str)
                    .map(str::to_string)
            };
            rules.push(NcuRule {
                name: name.clone(),
                kind: get("type"),
                description: get("description"),
            });
        }
    }
    let by_name: HashMap<&str, &NcuMetric> = metrics.iter().map(|m| (m.name.as_str(), m)).collect();
    let typed = NCU_TYPED
        .iter()
        .map(|(name, _, target)| {
            let m = by_name.get(name)?;
            normalize_unit(m.avg_value?, m.unit.as_deref().unwrap_or(""), target)
        })
        .collect();
    Ok(NcuProfile {
        typed,
        metrics,
        rules,
    })
}

/// Counts `warning:` diagnostics in the archive's `Clang_Tidy` cell (a repr dict with
/// `stdout`); `None` if it cannot be parsed.
pub fn clang_tidy_warnings(text: &str) -> Option<i64> {
    let v = pyrepr::parse(text).ok()?;
    let out = v.as_dict()?.get("stdout")?.as_str()?;
    Some(out.matches(": warning:").count() as i64)
}

/// Detects the source format of an archive kernel.
pub fn detect_format(code: &str) -> &'static str {
    if code.contains("PYBIND11_MODULE") {
        "torch-extension"
    } else if code.contains("class ModelNew") {
        "kernelbench-modelnew"
    } else {
        "cuda-source"
    }
}

/// Code normalized for comparison: trailing whitespace removed, blank lines dropped.
pub fn normalize_code(code: &str) -> String {
    code.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// BLAKE3 hex of a string (kernel ids, code hashes).
pub fn blake3_hex(s: &str) -> String {
    blake3::hash(s.as_bytes()).to_hex().to_string()
}

/// One row of the `kernels` table.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KernelRow {
    /// See [`KERNELS`] for every field's meaning and unit.
    pub kernel_id: String,
    #[allow(missing_docs)]
    pub row_id: String,
    #[allow(missing_docs)]
    pub source: String,
    #[allow(missing_docs)]
    pub problem_id: Option<String>,
    #[allow(missing_docs)]
    pub level: i64,
    #[allow(missing_docs)]
    pub task_id: i64,
    #[allow(missing_docs)]
    pub op_name: Option<String>,
    #[allow(missing_docs)]
    pub kernel_name: Option<String>,
    #[allow(missing_docs)]
    pub abi: String,
    #[allow(missing_docs)]
    pub format: String,
    #[allow(missing_docs)]
    pub has_cuda_kernel: bool,
    #[allow(missing_docs)]
    pub code: String,
    #[allow(missing_docs)]
    pub reference_code: Option<String>,
    #[allow(missing_docs)]
    pub reference_matches_problem: Option<bool>,
    #[allow(missing_docs)]
    pub claimed_correct: Option<bool>,
    #[allow(missing_docs)]
    pub claimed_speedup_native: Option<f64>,
    #[allow(missing_docs)]
    pub claimed_speedup_compile: Option<f64>,
    #[allow(missing_docs)]
    pub claimed_runtime_ms: Option<f64>,
    #[allow(missing_docs)]
    pub torch_native_ms: Option<f64>,
    #[allow(missing_docs)]
    pub torch_compile_ms: Option<f64>,
    #[allow(missing_docs)]
    pub claimed_max_diff: Option<f64>,
    #[allow(missing_docs)]
    pub error: Option<String>,
    #[allow(missing_docs)]
    pub gpu: Option<String>,
    #[allow(missing_docs)]
    pub clang_tidy_warnings: Option<i64>,
    /// Parsed NCU profile, if the archive had one.
    pub ncu: Option<NcuProfile>,
    #[allow(missing_docs)]
    pub provenance: String,
}

fn struct_fields(dt: &DataType) -> Fields {
    match dt {
        DataType::Struct(f) => f.clone(),
        _ => unreachable!("struct type"),
    }
}

/// Builds the `kernels` record batch from rows (in the given order).
///
/// # Errors
/// Only on an internal schema mismatch.
pub fn kernels_batch(rows: &[KernelRow]) -> Result<RecordBatch> {
    let n = rows.len();
    let s = |f: &dyn Fn(&KernelRow) -> Option<&str>| -> ArrayRef {
        let mut b = StringBuilder::with_capacity(n, n * 16);
        for r in rows {
            b.append_option(f(r));
        }
        std::sync::Arc::new(b.finish())
    };
    let mut cols: Vec<ArrayRef> = vec![
        s(&|r| Some(&r.kernel_id)),
        s(&|r| Some(&r.row_id)),
        s(&|r| Some(&r.source)),
        s(&|r| r.problem_id.as_deref()),
    ];
    let ints = |f: &dyn Fn(&KernelRow) -> Option<i64>| -> ArrayRef {
        let mut b = Int64Builder::with_capacity(n);
        for r in rows {
            b.append_option(f(r));
        }
        std::sync::Arc::new(b.finish())
    };
    let floats = |f: &dyn Fn(&KernelRow) -> Option<f64>| -> ArrayRef {
        let mut b = Float64Builder::with_capacity(n);
        for r in rows {
            b.append_option(f(r));
        }
        std::sync::Arc::new(b.finish())
    };
    let bools = |f: &dyn Fn(&KernelRow) -> Option<bool>| -> ArrayRef {
        let mut b = BooleanBuilder::with_capacity(n);
        for r in rows {
            b.append_option(f(r));
        }
        std::sync::Arc::new(b.finish())
    };
    cols.push(ints(&|r| Some(r.level)));
    cols.push(ints(&|r| Some(r.task_id)));
    cols.push(s(&|r| r.op_name.as_deref()));
    cols.push(s(&|r| r.kernel_name.as_deref()));
    cols.push(s(&|r| Some(&r.abi)));
    cols.push(s(&|r| Some(&r.format)));
    cols.push(bools(&|r| Some(r.has_cuda_kernel)));
    cols.push(s(&|r| Some(&r.code)));
    cols.push(s(&|r| r.reference_code.as_deref()));
    cols.push(bools(&|r| r.reference_matches_problem));
    cols.push(bools(&|r| r.claimed_correct));
    cols.push(floats(&|r| r.claimed_speedup_native));
    cols.push(floats(&|r| r.claimed_speedup_compile));
    cols.push(floats(&|r| r.claimed_runtime_ms));
    cols.push(floats(&|r| r.torch_native_ms));
    cols.push(floats(&|r| r.torch_compile_ms));
    cols.push(floats(&|r| r.claimed_max_diff));
    cols.push(s(&|r| r.error.as_deref()));
    cols.push(s(&|r| r.gpu.as_deref()));
    cols.push(ints(&|r| r.clang_tidy_warnings));
    for i in 0..NCU_TYPED.len() {
        cols.push(floats(&|r| {
            r.ncu
                .as_ref()
                .and_then(|p| p.typed.get(i).copied().flatten())
        }));
    }
    cols.push(ncu_metrics_column(rows));
    cols.push(ncu_rules_column(rows));
    cols.push(s(&|r| Some(&r.provenance)));
    // The list builders use a default item field; align with the declared schema's fields.
    let schema = KERNELS.clone();
    let cols = cols
        .into_iter()
        .zip(schema.fields().iter())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                c
            } else {
                arrow::compute::cast(&c, f.data_type()).expect("list item field cast")
            }
        })
        .collect();
    batch(&schema, cols)
}

/// The `ncu_metrics` column: per row, its NCU profile's metrics (name, unit, average,
/// variance, count), null without a profile.
fn ncu_metrics_column(rows: &[KernelRow]) -> ArrayRef {
    ncu_list_column(
        rows,
        &ncu_metric_struct(),
        |p| &p.metrics,
        |sb, m| {
            sb.field_builder::<StringBuilder>(0)
                .expect("name")
                .append_value(&m.name);
            sb.field_builder::<StringBuilder>(1)
                .expect("unit")
                .append_option(m.unit.as_deref());
            sb.field_builder::<Float64Builder>(2)
                .expect("avg")
                .append_option(m.avg_value);
            sb.field_builder::<Float64Builder>(3)
                .expect("var")
                .append_option(m.variance);
            sb.field_builder::<Int64Builder>(4)
                .expect("n")
                .append_option(m.n);
        },
    )
}

/// The `ncu_rules` column: per row, its NCU profile's rule results (name, type, description),
/// null without a profile.
fn ncu_rules_column(rows: &[KernelRow]) -> ArrayRef {
    ncu_list_column(
        rows,
        &ncu_rule_struct(),
        |p| &p.rules,
        |sb, x| {
            sb.field_builder::<StringBuilder>(0)
                .expect("name")
                .append_value(&x.name);
            sb.field_builder::<StringBuilder>(1)
                .expect("type")
                .append_option(x.kind.as_deref());
            sb.field_builder::<StringBuilder>(2)
                .expect("desc")
                .append_option(x.description.as_deref());
        },
    )
}

/// A list column of structs of type `item` (a `DataType::Struct`): per row, one struct per
/// element of `items` of its NCU profile, its fields filled by `fill`; null without a profile.
fn ncu_list_column<T>(
    rows: &[KernelRow],
    item: &DataType,
    items: impl Fn(&NcuProfile) -> &[T],
    fill: impl Fn(&mut StructBuilder, &T),
) -> ArrayRef {
    let mut lb = ListBuilder::new(StructBuilder::from_fields(struct_fields(item), 0));
    for r in rows {
        match &r.ncu {
            None => lb.append(false),
            Some(p) => {
                let sb = lb.values();
                for x in items(p) {
                    fill(sb, x);
                    sb.append(true);
                }
                lb.append(true);
            }
        }
    }
    std::sync::Arc::new(lb.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_normalize_with_si_prefixes() {
        assert_eq!(
            normalize_unit(2.0, "Gbyte/second", "byte/second"),
            Some(2e9)
        );
        assert_eq!(
            normalize_unit(5.0, "Kbyte/second", "byte/second"),
            Some(5e3)
        );
        assert_eq!(normalize_unit(5.0, "%", "%"), Some(5.0));
        assert_eq!(normalize_unit(5.0, "warp", "block"), None);
        assert_eq!(normalize_unit(5.0, "Xbyte/second", "byte/second"), None);
    }

    #[test]
    fn ncu_profile_to_typed_columns() {
        let p = parse_ncu(
            "{'metrics': {'Memory Throughput': {'unit': 'Gbyte/second', 'avg_value': 1.5, 'variance': 0.0, 'n': 5}, \
             'Achieved Occupancy': {'unit': '%', 'avg_value': 98.3, 'variance': 1e-4, 'n': 5}}, \
             'rules': {'Occupancy': {'type': 'WRN', 'description': 'low'}}}",
        )
        .unwrap();
        let idx = |c: &str| NCU_TYPED.iter().position(|t| t.1 == c).unwrap();
        assert_eq!(
            p.typed[idx("ncu_memory_throughput_bytes_per_s")],
            Some(1.5e9)
        );
        assert_eq!(p.typed[idx("ncu_achieved_occupancy_pct")], Some(98.3));
        assert_eq!(p.typed[idx("ncu_sm_busy_pct")], None);
        assert_eq!(p.metrics.len(), 2);
        assert_eq!(p.rules[0].kind.as_deref(), Some("WRN"));
        assert!(parse_ncu("[1, 2]").is_err());
    }

    #[test]
    fn batch_matches_schema() {
        let row = KernelRow {
            kernel_id: blake3_hex("x"),
            row_id: "sakana/x/0".into(),
            source: "sakana".into(),
            abi: "torch".into(),
            format: "torch-extension".into(),
            code: "x".into(),
            ncu: Some(parse_ncu("{'metrics': {}, 'rules': {}}").unwrap()),
            provenance: "test".into(),
            ..Default::default()
        };
        let b = kernels_batch(&[row.clone(), KernelRow { ncu: None, ..row }]).unwrap();
        assert_eq!(b.num_rows(), 2);
        assert_eq!(b.schema(), KERNELS.clone());
    }
}
