//! `synth-tasks`: task families from `datasets/tasks/` (specs and kernels written in this
//! project), plus the generated families of `generate` ([`cudarl_rl::families`]), into the `tasks`
//! and `task_kernels` tables.

use cudarl_core::{
    ExternalFiles, InputDecl, OutputDecl, ParamsError, ResolveContext, Stage, StageContext,
    StageError,
};
use cudarl_cuda::task::load_tasks;
use cudarl_tables::TableRow;
use cudarl_tables::tasks::{TaskKernelRow, TaskRow};
use serde::{Deserialize, Serialize};

use crate::common::{data_err, rooted, write_output};
use cudarl_rl::families::GenerateParams;

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "synth-tasks";

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
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
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
    // Code versions:
    // Bump when the templates of `cudarl_rl::families` change (they are code, not inputs).
    // 6: row-reduction maps are drawn trees, with two of three optimized kernels each;
    // naive row sums accumulate in double.
    // 7: operator families (KernelBench-style modules, tiers 0-3); `problem` and `group`.
    // 8: 3D and transposed 2D convolution families.
    // 9: asymmetric convolution windows (`kernel_size = (3, 7)`).
    // 10: pooling with padding and dilation; 3D pooling.
    // 11: dilated 1D and 2D convolutions, strided 1D ones.
    // 12: exclusive and reverse cumulative sums.
    // 13: modules written in KernelBench's styles (docstrings, annotations, inline inputs).
    // 14: elementwise steps in kernels quote their module statement in a comment.
    stage_identity!(KIND, 14);
    fn inputs(&self) -> Vec<InputDecl> {
        vec![InputDecl::external("families")]
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![
            OutputDecl::table("tasks", TaskRow::schema()),
            OutputDecl::table("task_kernels", TaskKernelRow::schema()),
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
        let mut rows = Vec::with_capacity(all.len());
        let mut krows = Vec::new();
        for t in &all {
            let s = &t.spec;
            rows.push(TaskRow {
                task_id: s.id.clone(),
                tier: s.tier,
                description: s.description.clone(),
                dtype: s.dtype.clone(),
                signature: s.signature(),
                train_shapes: serde_json::to_string(&s.train_shapes).expect("json"),
                holdout_shapes: serde_json::to_string(&s.holdout_shapes).expect("json"),
                atol: s.atol,
                rtol: s.rtol,
                bytes: s.bytes.clone(),
                flops: s.flops.clone(),
                spec_json: serde_json::to_string(s).expect("json"),
                problem: s.problem_source(),
                group: s.group.clone().unwrap_or_else(|| s.id.clone()),
            });
            let kernel = |role: &str, file: &str, code: &str| TaskKernelRow {
                kernel_id: blake3::hash(code.as_bytes()).to_hex().to_string(),
                task_id: s.id.clone(),
                role: role.into(),
                file: file.into(),
                code: code.into(),
            };
            krows.push(kernel("naive", &s.naive, &t.naive));
            for (f, code) in &t.optimized {
                krows.push(kernel("optimized", f, code));
            }
        }
        write_output(
            ctx,
            "tasks",
            &cudarl_tables::to_batch(&rows).map_err(data_err)?,
        )?;
        write_output(
            ctx,
            "task_kernels",
            &cudarl_tables::to_batch(&krows).map_err(data_err)?,
        )
    }
}
