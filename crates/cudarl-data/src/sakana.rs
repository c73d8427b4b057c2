//! The SakanaAI AI-CUDA-Engineer-Archive: its exact 19-column schema and its ingestion into
//! the `kernels` table.
//!
//! Dataset: `SakanaAI/AI-CUDA-Engineer-Archive` on the Hugging Face hub (CC-BY-4.0), files
//! `level_1.parquet`, `level_2.parquet`, `level_3.parquet` (30,615 rows). Column list and order
//! from the dataset card; see `datasets/sakana_ai_cuda_engineer_archive_sample/README.md`.

use rayon::prelude::*;

use crate::error::{DataError, Result};
use crate::kernelbench::{ProblemIndex, problem_id};
use crate::kernels::{KernelRow, blake3_hex, clang_tidy_warnings, detect_format, parse_ncu};
use crate::parquet_io::{BoolCol, F64Col, I64Col, StrCol, Table};

/// Logical type of an archive column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColType {
    /// String.
    Str,
    /// Integer.
    Int,
    /// Float.
    Float,
    /// Boolean.
    Bool,
}

/// One column of the archive schema.
#[derive(Debug, Clone, Copy)]
pub struct ColumnSpec {
    /// Column name, exactly as in the archive.
    pub name: &'static str,
    /// Logical type.
    pub ty: ColType,
    /// Whether ingestion fails without it (optional columns are read as null, with a warning).
    pub required: bool,
}

const fn col(name: &'static str, ty: ColType, required: bool) -> ColumnSpec {
    ColumnSpec { name, ty, required }
}

/// The archive's 19 columns in the dataset card's order. Required: everything a `kernels` row
/// needs (identity, code, reference, verdict and timings). Optional: diagnostics and the two
/// columns the bundled sample lacks (`PyTorch_Code_Functional`, `Torch_Profile`), plus the
/// pandas index.
pub const SAKANA_COLUMNS: [ColumnSpec; 19] = [
    col("Op_Name", ColType::Str, true),
    col("Level_ID", ColType::Int, true),
    col("Task_ID", ColType::Int, true),
    col("Kernel_Name", ColType::Str, true),
    col("CUDA_Runtime", ColType::Float, true),
    col("PyTorch_Native_Runtime", ColType::Float, true),
    col("PyTorch_Compile_Runtime", ColType::Float, true),
    col("CUDA_Speedup_Native", ColType::Float, true),
    col("CUDA_Speedup_Compile", ColType::Float, true),
    col("CUDA_Code", ColType::Str, true),
    col("PyTorch_Code_Module", ColType::Str, true),
    col("PyTorch_Code_Functional", ColType::Str, false),
    col("Correct", ColType::Bool, true),
    col("Max_Diff", ColType::Float, false),
    col("Error", ColType::Str, false),
    col("NCU_Profile", ColType::Str, false),
    col("Torch_Profile", ColType::Str, false),
    col("Clang_Tidy", ColType::Str, false),
    col("__index_level_0__", ColType::Int, false),
];

/// One archive file to ingest.
#[derive(Debug, Clone)]
pub struct SakanaFile {
    /// Split name (`level_1`, ..., or `sample`), used in row ids.
    pub split: String,
    /// File name for messages (the path as the user knows it).
    pub display: String,
    /// File name inside the dataset (for provenance), e.g. `level_1.parquet`.
    pub name: String,
    /// Path on disk.
    pub path: std::path::PathBuf,
    /// Provenance prefix (dataset and revision).
    pub provenance: String,
}

/// Rows and warnings from an ingestion.
#[derive(Debug, Clone, Default)]
pub struct Ingested {
    /// Rows in file order.
    pub rows: Vec<KernelRow>,
    /// Warnings for the user (missing optional columns, unparseable cells, unknown problems).
    pub warnings: Vec<String>,
}

/// Checks a table's columns against [`SAKANA_COLUMNS`]: a missing required column is an error
/// naming it; missing optional and unknown extra columns are warnings.
///
/// # Errors
/// [`DataError::BadInput`] naming the file and the first missing required column.
pub fn check_columns(t: &Table) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    let missing_opt: Vec<&str> = SAKANA_COLUMNS
        .iter()
        .filter(|c| !t.has(c.name))
        .map(|c| {
            if c.required {
                Err(DataError::bad(
                    &t.file,
                    Some(c.name),
                    "required column of the SakanaAI archive schema is missing",
                ))
            } else {
                Ok(c.name)
            }
        })
        .collect::<Result<_>>()?;
    if !missing_opt.is_empty() {
        warnings.push(format!(
            "{}: optional archive columns missing (read as null): {}",
            t.file,
            missing_opt.join(", ")
        ));
    }
    let extra: Vec<String> = t
        .schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| !SAKANA_COLUMNS.iter().any(|c| c.name == n))
        .collect();
    if !extra.is_empty() {
        warnings.push(format!(
            "{}: columns not in the archive schema were ignored: {}",
            t.file,
            extra.join(", ")
        ));
    }
    Ok(warnings)
}

/// Reads archive files into `kernels` rows. Rows with null `CUDA_Code` are skipped with a
/// warning. An unparseable `NCU_Profile` is an error when `strict`, else a null profile and a
/// warning that counts them.
///
/// # Errors
/// Unreadable file, missing required column, wrong column type, null identity field.
pub fn ingest(files: &[SakanaFile], problems: &ProblemIndex, strict: bool) -> Result<Ingested> {
    let mut out = Ingested::default();
    for f in files {
        let t = Table::read(&f.path, &f.display)?;
        out.warnings.extend(check_columns(&t)?);
        // Type-check every present column (errors name the column).
        for c in SAKANA_COLUMNS {
            match c.ty {
                ColType::Str => t.strings(c.name).map(|_| ())?,
                ColType::Int => t.ints(c.name).map(|_| ())?,
                ColType::Float => t.floats(c.name).map(|_| ())?,
                ColType::Bool => t.bools(c.name).map(|_| ())?,
            }
        }
        let cols = Columns::read(&t)?;
        let rows: Vec<RowResult> = (0..t.rows())
            .into_par_iter()
            .map(|i| cols.row(i, f, problems, strict))
            .collect();
        collect_rows(rows, f, &mut out)?;
    }
    Ok(out)
}

/// One archive row's outcome: `None` for a row with null `CUDA_Code` (skipped), else the row,
/// the NCU profile's parse error (kept with a null profile) and whether its problem is known.
type RowResult = std::result::Result<Option<(KernelRow, Option<String>, bool)>, DataError>;

/// The archive columns a `kernels` row is made of, read from one file (optional ones `None`
/// when absent).
struct Columns {
    op: StrCol,
    level: I64Col,
    task: I64Col,
    kname: StrCol,
    rt: F64Col,
    nat: F64Col,
    comp: F64Col,
    sp_n: F64Col,
    sp_c: F64Col,
    code: StrCol,
    refc: StrCol,
    correct: BoolCol,
    maxd: Option<F64Col>,
    err: Option<StrCol>,
    ncu: Option<StrCol>,
    tidy: Option<StrCol>,
    idx: Option<I64Col>,
}

impl Columns {
    /// The columns of `t`.
    ///
    /// # Errors
    /// A required column missing, a column of the wrong type.
    fn read(t: &Table) -> Result<Columns> {
        Ok(Columns {
            op: t.req_strings("Op_Name")?,
            level: t.req_ints("Level_ID")?,
            task: t.req_ints("Task_ID")?,
            kname: t.req_strings("Kernel_Name")?,
            rt: t.req_floats("CUDA_Runtime")?,
            nat: t.req_floats("PyTorch_Native_Runtime")?,
            comp: t.req_floats("PyTorch_Compile_Runtime")?,
            sp_n: t.req_floats("CUDA_Speedup_Native")?,
            sp_c: t.req_floats("CUDA_Speedup_Compile")?,
            code: t.req_strings("CUDA_Code")?,
            refc: t.req_strings("PyTorch_Code_Module")?,
            correct: t.req_bools("Correct")?,
            maxd: t.floats("Max_Diff")?,
            err: t.strings("Error")?,
            ncu: t.strings("NCU_Profile")?,
            tidy: t.strings("Clang_Tidy")?,
            idx: t.ints("__index_level_0__")?,
        })
    }

    /// Row `i` of file `f` as a `kernels` row (see [`RowResult`]).
    ///
    /// # Errors
    /// A null identity field; with `strict`, an unparseable `NCU_Profile`.
    fn row(&self, i: usize, f: &SakanaFile, problems: &ProblemIndex, strict: bool) -> RowResult {
        let null =
            |field: &str| DataError::bad(&f.display, Some(field), format!("null in row {i}"));
        let Some(code) = self.code.get(i) else {
            return Ok(None);
        };
        let op_name = self.op.get(i).ok_or_else(|| null("Op_Name"))?;
        let level = self.level.get(i).ok_or_else(|| null("Level_ID"))?;
        let task_id = self.task.get(i).ok_or_else(|| null("Task_ID"))?;
        let pid = problem_id(level, op_name);
        let reference = self.refc.get(i);
        let known = problems.contains(&pid);
        let source_row = self.idx.as_ref().and_then(|c| c.get(i)).unwrap_or(i as i64);
        let mut ncu_err = None;
        let profile = match self.ncu.as_ref().and_then(|c| c.get(i)) {
            None => None,
            Some(text) => match parse_ncu(text) {
                Ok(p) => Some(p),
                Err(e) => {
                    if strict {
                        return Err(DataError::bad(
                            &f.display,
                            Some("NCU_Profile"),
                            format!("row {i}: {e}"),
                        ));
                    }
                    ncu_err = Some(format!("row {i}: {e}"));
                    None
                }
            },
        };
        let row = KernelRow {
            kernel_id: blake3_hex(code),
            row_id: format!("sakana/{}/{}", f.split, i),
            source: "sakana".into(),
            problem_id: known.then(|| pid.clone()),
            level,
            task_id,
            op_name: Some(op_name.to_string()),
            kernel_name: self.kname.get(i).map(str::to_string),
            abi: "torch".into(),
            format: detect_format(code).into(),
            has_cuda_kernel: code.contains("__global__"),
            code: code.to_string(),
            reference_code: reference.map(str::to_string),
            reference_matches_problem: reference.and_then(|r| problems.reference_matches(&pid, r)),
            claimed_correct: self.correct.get(i),
            claimed_speedup_native: self.sp_n.get(i),
            claimed_speedup_compile: self.sp_c.get(i),
            claimed_runtime_ms: self.rt.get(i),
            torch_native_ms: self.nat.get(i),
            torch_compile_ms: self.comp.get(i),
            claimed_max_diff: self.maxd.as_ref().and_then(|c| c.get(i)),
            error: self.err.as_ref().and_then(|c| c.get(i)).map(str::to_string),
            gpu: None,
            clang_tidy_warnings: self
                .tidy
                .as_ref()
                .and_then(|c| c.get(i))
                .and_then(clang_tidy_warnings),
            ncu: profile,
            provenance: format!("{} {} row {}", f.provenance, f.name, source_row),
        };
        Ok(Some((row, ncu_err, known)))
    }
}

/// Appends file `f`'s rows to `out.rows` in file order, with a warning each for the rows
/// skipped, the unparseable NCU profiles and the unknown problems.
///
/// # Errors
/// The first row that failed.
fn collect_rows(rows: Vec<RowResult>, f: &SakanaFile, out: &mut Ingested) -> Result<()> {
    let (mut skipped, mut bad_ncu, mut unknown) = (0usize, Vec::new(), 0usize);
    for r in rows {
        match r? {
            None => skipped += 1,
            Some((row, e, known)) => {
                if let Some(e) = e {
                    bad_ncu.push(e);
                }
                if !known {
                    unknown += 1;
                }
                out.rows.push(row);
            }
        }
    }
    if skipped > 0 {
        out.warnings.push(format!(
            "{}: {skipped} rows with null CUDA_Code skipped",
            f.display
        ));
    }
    if !bad_ncu.is_empty() {
        out.warnings.push(format!(
            "{}: {} rows have an unparseable NCU_Profile (kept with null NCU columns; first: {})",
            f.display,
            bad_ncu.len(),
            bad_ncu[0]
        ));
    }
    if unknown > 0 {
        out.warnings.push(format!(
            "{}: {unknown} rows name a problem not in `problems` (problem_id left null)",
            f.display
        ));
    }
    Ok(())
}
