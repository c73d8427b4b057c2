//! `splits`: which KernelBench problems and which synthetic task families are held out, drawn
//! once, upstream of everything that trains (docs/architecture.md, "Splits").
//!
//! It reads only `ingest-kernelbench`'s `problems` and `synth-tasks`' `tasks` (no verdicts), so
//! `tokenizer` and `pretrain`, which run beside `validate`, can leave the hold-out out of their
//! corpus; `curriculum` copies these splits into its `split` column, which `sft-data`, `eval` and
//! `archive-native` follow. The draw is [`cudarl_curriculum::holdout`]; a family is generated
//! when its id starts with [`cudarl_rl::families::PREFIX`].
//!
//! Its table, `splits`, is [`cudarl_tables::splits::SplitRow`]; readers use
//! [`cudarl_tables::splits::SplitMap`].

use cudarl_core::{InputDecl, OutputDecl, ParamsError, Stage, StageContext, StageError};
use cudarl_cuda::task::TaskSpec;
use cudarl_curriculum::holdout::{Family, HoldOut};
use cudarl_tables::TableRow;
use cudarl_tables::problems::ProblemRow;
use cudarl_tables::splits::SplitRow;

use crate::common::{data_err, rl_err, write_rows};

/// The stage kind, as pipeline files name it.
pub const KIND: &str = "splits";

/// The stage.
#[derive(Debug)]
pub struct Splits {
    params: HoldOut,
}

impl Splits {
    /// Builds the stage from its params table ([`HoldOut`], `[stages.splits]`).
    ///
    /// # Errors
    /// Unknown or mistyped params, fractions out of range ([`HoldOut::check`]).
    pub fn from_table(t: toml::Table) -> Result<Self, ParamsError> {
        let params: HoldOut = crate::common::parse_params(t)?;
        params.check()?;
        Ok(Splits { params })
    }

    /// The rows of the KernelBench problems (`(problem_id, level)`, in order) of the split's
    /// levels, drawn stratified by level ([`HoldOut::kernelbench`]).
    pub fn kernelbench(&self, problems: &[(String, i64)]) -> Vec<SplitRow> {
        self.params
            .kernelbench(problems)
            .into_iter()
            .map(|(id, lv, s)| SplitRow {
                item_id: id.to_string(),
                source: "kernelbench".into(),
                level: Some(lv),
                group: id.to_string(),
                split: s.as_str().into(),
            })
            .collect()
    }

    /// The rows of the task families of `specs`, in order, split by group
    /// ([`HoldOut::families`]).
    pub fn families(&self, specs: &[TaskSpec]) -> Vec<SplitRow> {
        let families: Vec<Family<'_>> = specs
            .iter()
            .map(|s| Family {
                id: &s.id,
                group: s.group.as_deref(),
                generated: s.id.starts_with(cudarl_rl::families::PREFIX),
            })
            .collect();
        self.params
            .families(&families)
            .into_iter()
            .zip(specs)
            .map(|((group, split), s)| SplitRow {
                item_id: format!("synth/{}", s.id),
                source: "synthetic".into(),
                level: None,
                group,
                split: split.as_str().into(),
            })
            .collect()
    }
}

impl Stage for Splits {
    stage_identity!(KIND, 1);
    fn inputs(&self) -> Vec<InputDecl> {
        vec![
            InputDecl::node("problems", "ingest-kernelbench", "problems"),
            InputDecl::node("tasks", "synth-tasks", "tasks"),
        ]
    }
    fn outputs(&self) -> Vec<OutputDecl> {
        vec![OutputDecl::table("splits", SplitRow::schema())]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let problems: Vec<(String, i64)> =
            cudarl_tables::read::<ProblemRow>(ctx.input_path("problems")?, "problems")
                .map_err(data_err)?
                .into_iter()
                .map(|r| (r.problem_id, r.level))
                .collect();
        let specs = cudarl_rl::tasks::read_specs(ctx.input_path("tasks")?).map_err(rl_err)?;
        let unknown: Vec<&str> = self
            .params
            .holdout_tasks
            .iter()
            .filter(|h| !specs.iter().any(|s| &s.id == *h))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            ctx.warn(format!(
                "holdout_tasks names no task family of `tasks`: {}",
                unknown.join(", ")
            ));
        }
        let mut rows = self.kernelbench(&problems);
        rows.extend(self.families(&specs));
        let count = |src: &str, split: &str| {
            rows.iter()
                .filter(|r| r.source == src && r.split == split)
                .count()
        };
        ctx.note(&format!(
            "KernelBench: {} train, {} val, {} test; task families: {} train, {} rl, {} test",
            count("kernelbench", "train"),
            count("kernelbench", "val"),
            count("kernelbench", "test"),
            count("synthetic", "train"),
            count("synthetic", "rl"),
            count("synthetic", "test"),
        ));
        write_rows(ctx, "splits", &SplitRow::schema(), &rows)
    }
}
