//! `synth-tasks`: task families from `datasets/tasks/` (specs and kernels written in this
//! project), plus the generated families of `generate` ([`cudarl_rl::families`]), into the `tasks`
//! and `task_kernels` tables.

use std::sync::{Arc, LazyLock};

use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cudarl_core::{
    ExternalFiles, InputDecl, OutputDecl, ResolveContext, Stage, StageContext, StageError,
};
use cudarl_cuda::task::load_tasks;
use serde::{Deserialize, Serialize};

use crate::common::{data_err, params_json, rooted, write_output};
use cudarl_rl::families::GenerateParams;

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "synth-tasks";

/// `tasks`: one row per task.
///
/// | column | type | meaning |
/// |---|---|---|
/// | task_id | utf8 | e.g. `vector_add` |
/// | tier | int64 | 0..3 |
/// | description | utf8 | what `launch` computes |
/// | dtype | utf8 | `f32` |
/// | signature | utf8 | the exact `extern "C"` launcher declaration |
/// | train_shapes, holdout_shapes | utf8 | JSON lists of size maps |
/// | atol, rtol | float64 | tolerance (see datasets/tasks/README.md) |
/// | bytes, flops | utf8 | formulas over the sizes (bytes moved, FLOP) |
/// | spec_json | utf8 | the full spec (what the harness runs) |
/// | problem | utf8 | the task as a KernelBench-style problem (a PyTorch `Model`, its constants, `get_inputs`): what every prompt shows ([`cudarl_cuda::task::TaskSpec::problem_source`]) |
/// | group | utf8 | the template instance of a generated family (its op structure), else the task id; splits are drawn per group |
pub static TASKS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("task_id", DataType::Utf8, false),
        Field::new("tier", DataType::Int64, false),
        Field::new("description", DataType::Utf8, false),
        Field::new("dtype", DataType::Utf8, false),
        Field::new("signature", DataType::Utf8, false),
        Field::new("train_shapes", DataType::Utf8, false),
        Field::new("holdout_shapes", DataType::Utf8, false),
        Field::new("atol", DataType::Float64, false),
        Field::new("rtol", DataType::Float64, false),
        Field::new("bytes", DataType::Utf8, false),
        Field::new("flops", DataType::Utf8, false),
        Field::new("spec_json", DataType::Utf8, false),
        Field::new("problem", DataType::Utf8, false),
        Field::new("group", DataType::Utf8, false),
    ]))
});

/// `task_kernels`: the project's reference kernels, one row per kernel.
///
/// | column | type | meaning |
/// |---|---|---|
/// | kernel_id | utf8 | BLAKE3 hex of `code` |
/// | task_id | utf8 | task |
/// | role | utf8 | `naive` or `optimized` |
/// | file | utf8 | file in the task folder |
/// | code | utf8 | source (native ABI) |
pub static TASK_KERNELS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("kernel_id", DataType::Utf8, false),
        Field::new("task_id", DataType::Utf8, false),
        Field::new("role", DataType::Utf8, false),
        Field::new("file", DataType::Utf8, false),
        Field::new("code", DataType::Utf8, false),
    ]))
});

/// Params of `synth-tasks`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Task folder, relative to the project root; not in the key (its files are).
    #[serde(default, skip_serializing)]
    pub path: Option<String>,
    /// Generated families added to the folder's ([`cudarl_rl::families`]); none by default.
    #[serde(default, skip_serializing_if = "is_default")]
    pub generate: GenerateParams,
}

fn is_default(g: &GenerateParams) -> bool {
    g == &GenerateParams::default()
}

/// The stage.
#[derive(Debug)]
pub struct SynthTasks {
    params: Params,
}

impl SynthTasks {
    /// Default task folder.
    pub const DIR: &'static str = "datasets/tasks";

    /// Builds the stage from its params table.
    ///
    /// # Errors
    /// Unknown or mistyped params.
    pub fn from_table(t: toml::Table) -> Result<Self, String> {
        Ok(SynthTasks {
            params: crate::common::parse_params(t)?,
        })
    }

    fn dir(&self, root: &std::path::Path) -> std::path::PathBuf {
        rooted(root, self.params.path.as_deref().unwrap_or(Self::DIR))
    }
}

fn walk(base: &std::path::Path, d: &std::path::Path, out: &mut Vec<(String, std::path::PathBuf)>) {
    let Ok(rd) = std::fs::read_dir(d) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(base, &p, out);
        } else {
            out.push((p.strip_prefix(base).unwrap_or(&p).display().to_string(), p));
        }
    }
}

impl Stage for SynthTasks {
    fn kind(&self) -> &str {
        KIND
    }
    fn code_version(&self) -> u32 {
        // Bump when the templates of `cudarl_rl::families` change (they are code, not inputs).
        // 6: row-reduction maps are drawn trees, with two of three optimized kernels each;
        // naive row sums accumulate in double.
        // 7: operator families (KernelBench-style modules, tiers 0-3); `problem` and `group`.
        7
    }
    fn params(&self) -> serde_json::Value {
        params_json(&self.params)
    }
    fn inputs(&self) -> Vec<InputDecl> {
        vec![InputDecl::external("families")]
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::table("tasks", TASKS.clone()),
            OutputDecl::table("task_kernels", TASK_KERNELS.clone()),
        ]
    }
    fn resolve_external(
        &self,
        _input: &str,
        ctx: &ResolveContext,
    ) -> Result<ExternalFiles, StageError> {
        let dir = self.dir(&ctx.root);
        if !dir.is_dir() {
            return Err(StageError::bad_input(
                dir.display().to_string(),
                None,
                "task folder not found",
            ));
        }
        let mut files = Vec::new();
        walk(&dir, &dir, &mut files);
        files.sort();
        Ok(ExternalFiles {
            source: "task families".into(),
            files,
        })
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let dir = self.dir(ctx.root());
        let tasks = load_tasks(&dir).map_err(|e| StageError::bad_input(e.file, None, e.message))?;
        let mut all: Vec<cudarl_rl::families::Family> = Vec::new();
        for t in &tasks {
            if t.spec.id.starts_with(cudarl_rl::families::PREFIX) {
                return Err(StageError::bad_input(
                    t.dir.join("task.toml").display().to_string(),
                    Some("id"),
                    format!(
                        "`{}`: ids starting with `{}` are reserved for generated families",
                        t.spec.id,
                        cudarl_rl::families::PREFIX
                    ),
                ));
            }
            all.push(cudarl_rl::families::Family {
                spec: t.spec.clone(),
                naive: t
                    .naive_source()
                    .map_err(|e| StageError::bad_input(e.file, None, e.message))?,
                optimized: t
                    .optimized_sources()
                    .map_err(|e| StageError::bad_input(e.file, None, e.message))?,
            });
        }
        let exclude = tasks
            .iter()
            .flat_map(|t| t.spec.reference.values().cloned())
            .collect();
        all.extend(cudarl_rl::families::generate(
            &self.params.generate,
            &exclude,
        ));
        let mut cols: Vec<Vec<String>> = vec![Vec::new(); 8];
        let (mut tier, mut atol, mut rtol) = (Vec::new(), Vec::new(), Vec::new());
        let mut krows: Vec<[String; 5]> = Vec::new();
        for t in &all {
            let s = &t.spec;
            cols[0].push(s.id.clone());
            cols[1].push(s.description.clone());
            cols[2].push(s.dtype.clone());
            cols[3].push(s.signature());
            cols[4].push(serde_json::to_string(&s.train_shapes).expect("json"));
            cols[5].push(serde_json::to_string(&s.holdout_shapes).expect("json"));
            cols[6].push(s.bytes.clone());
            cols[7].push(s.flops.clone());
            tier.push(s.tier);
            atol.push(s.atol);
            rtol.push(s.rtol);
            krows.push([
                blake3::hash(t.naive.as_bytes()).to_hex().to_string(),
                s.id.clone(),
                "naive".into(),
                s.naive.clone(),
                t.naive.clone(),
            ]);
            for (f, code) in &t.optimized {
                krows.push([
                    blake3::hash(code.as_bytes()).to_hex().to_string(),
                    s.id.clone(),
                    "optimized".into(),
                    f.clone(),
                    code.clone(),
                ]);
            }
        }
        let spec_json: Vec<String> = all
            .iter()
            .map(|t| serde_json::to_string(&t.spec).expect("json"))
            .collect();
        let problem: Vec<String> = all.iter().map(|t| t.spec.problem_source()).collect();
        let group: Vec<String> = all
            .iter()
            .map(|t| t.spec.group.clone().unwrap_or_else(|| t.spec.id.clone()))
            .collect();
        let sa = |v: &Vec<String>| -> ArrayRef { Arc::new(StringArray::from(v.clone())) };
        let batch = cudarl_data::parquet_io::batch(
            &TASKS.clone(),
            vec![
                sa(&cols[0]),
                Arc::new(Int64Array::from(tier)),
                sa(&cols[1]),
                sa(&cols[2]),
                sa(&cols[3]),
                sa(&cols[4]),
                sa(&cols[5]),
                Arc::new(Float64Array::from(atol)),
                Arc::new(Float64Array::from(rtol)),
                sa(&cols[6]),
                sa(&cols[7]),
                sa(&spec_json),
                sa(&problem),
                sa(&group),
            ],
        )
        .map_err(data_err)?;
        write_output(ctx, "tasks", &batch)?;
        let kc = |i: usize| -> ArrayRef {
            Arc::new(StringArray::from(
                krows.iter().map(|r| r[i].clone()).collect::<Vec<_>>(),
            ))
        };
        let kb = cudarl_data::parquet_io::batch(&TASK_KERNELS.clone(), (0..5).map(kc).collect())
            .map_err(data_err)?;
        write_output(ctx, "task_kernels", &kb)
    }
}
