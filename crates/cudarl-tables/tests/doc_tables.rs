//! Every row struct's doc table names exactly its table's columns, in order: the table a reader
//! sees in the docs is the schema the crate writes.

use cudarl_tables::TableRow;
use cudarl_tables::{
    archive, curriculum, eval, kb_specs, problems, rl, sft, sft_eval, splits, tasks, train, turns,
    validate,
};

/// The columns the doc table above `pub struct {ty}` in `src` lists (a cell may name several,
/// `a, b`), in order, after those of the row struct a "The columns of [`Other`], then:" line
/// names.
fn documented(src: &str, ty: &str) -> Vec<String> {
    let at = src
        .find(&format!("pub struct {ty} "))
        .or_else(|| src.find(&format!("pub struct {ty}<")))
        .unwrap_or_else(|| panic!("no `pub struct {ty}`"));
    let doc: Vec<&str> = src[..at]
        .lines()
        .rev()
        .skip_while(|l| l.trim().starts_with("#["))
        .take_while(|l| l.trim_start().starts_with("///"))
        .collect();
    let base = doc.iter().find_map(|l| {
        let rest = l.split("The columns of [`").nth(1)?;
        Some(rest.split('`').next()?.to_string())
    });
    let mut cols = base.map_or_else(Vec::new, |b| documented(src, &b));
    // A row whose own columns come first, then another type's: "then [`Base`]".
    let after = doc.iter().find_map(|l| {
        let rest = l.split("then [`").nth(1)?;
        Some(rest.split('`').next()?.to_string())
    });
    cols.extend(
        doc.into_iter()
            .rev()
            .filter_map(|l| l.trim_start().strip_prefix("/// |"))
            .filter(|l| !l.starts_with(" column ") && !l.starts_with("---"))
            .flat_map(|l| {
                l.split('|')
                    .next()
                    .unwrap_or("")
                    .split(',')
                    .map(|c| c.trim().trim_matches('`').to_string())
                    .collect::<Vec<_>>()
            }),
    );
    cols.extend(after.map_or_else(Vec::new, |a| documented(src, &a)));
    cols
}

fn check<T: TableRow>(src: &str, ty: &str) {
    let want: Vec<String> = T::schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(documented(src, ty), want, "`{}` ({ty})", T::NAME);
}

#[test]
fn every_doc_table_lists_its_schemas_columns_in_order() {
    check::<eval::EvalEpisodeRow>(include_str!("../src/eval.rs"), "EvalEpisodeRow");
    let train = include_str!("../src/train.rs");
    check::<train::TrainMetricsRow>(train, "TrainMetricsRow");
    check::<train::CorpusRow>(train, "CorpusRow");
    let rl = include_str!("../src/rl.rs");
    check::<rl::RlMetricsRow>(rl, "RlMetricsRow");
    check::<rl::RlTierRow>(rl, "RlTierRow");
    let sft_eval = include_str!("../src/sft_eval.rs");
    check::<sft_eval::SftSampleRow>(sft_eval, "SftSampleRow");
    check::<sft_eval::SftEvalRow>(sft_eval, "SftEvalRow");
    let archive = include_str!("../src/archive.rs");
    check::<archive::ArchiveNativeRow>(archive, "ArchiveNativeRow");
    check::<archive::ArchiveSummaryRow>(archive, "ArchiveSummaryRow");
    let curriculum = include_str!("../src/curriculum.rs");
    check::<curriculum::CurriculumRow>(curriculum, "CurriculumRow");
    check::<curriculum::GateRow>(curriculum, "GateRow");
    check::<curriculum::ValidatedKernelRow>(curriculum, "ValidatedKernelRow");
    let kb = include_str!("../src/kb_specs.rs");
    check::<kb_specs::KbSpecRow>(kb, "KbSpecRow");
    check::<kb_specs::CoverageRow>(kb, "CoverageRow");
    check::<kb_specs::KbTestgenRow>(kb, "KbTestgenRow");
    check::<kb_specs::KbTestRow>(kb, "KbTestRow");
    check::<problems::ProblemRow>(include_str!("../src/problems.rs"), "ProblemRow");
    let sft = include_str!("../src/sft.rs");
    check::<sft::SftGeneratorRow>(sft, "SftGeneratorRow");
    check::<sft::SftOptimizerRow>(sft, "SftOptimizerRow");
    check::<splits::SplitRow>(include_str!("../src/splits.rs"), "SplitRow");
    let tasks = include_str!("../src/tasks.rs");
    check::<tasks::TaskRow>(tasks, "TaskRow");
    check::<tasks::TaskKernelRow>(tasks, "TaskKernelRow");
    let validate = include_str!("../src/validate.rs");
    check::<validate::ValidationRow>(validate, "ValidationRow");
    check::<validate::AgreementRow>(validate, "AgreementRow");
    let turns = include_str!("../src/turns.rs");
    check::<turns::RlTurnRow>(turns, "RlTurnRow");
    check::<turns::EvalTurnRow>(turns, "EvalTurnRow");
    check::<turns::OptimizeTurnRow>(turns, "OptimizeTurnRow");
}

#[test]
fn a_doc_table_cell_may_name_several_columns() {
    let src = "/// One row.\n///\n/// | column | type | meaning |\n/// |---|---|---|\n/// | a | utf8 | x |\n/// | `b`, c | int64 | y, z |\n#[derive(Debug)]\npub struct R {\n";
    assert_eq!(documented(src, "R"), ["a", "b", "c"]);
}
