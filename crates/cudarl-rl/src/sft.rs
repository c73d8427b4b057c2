//! SFT examples for the two agents, in the prompt format RL uses
//! ([`cudarl_curriculum::prompts`]; docs/architecture.md, "Stages": `sft-data`):
//!
//! - generator: task prompt -> a kernel of that task that `validate` found correct (on a GPU)
//!   or compiled (compile-only machines). Templated variants (opening and closing phrasings,
//!   which train shapes are shown and in what order, whether the answer has a lead-in line,
//!   sizes renamed) give about `per_family` distinct examples per family
//!   ([`TaskExamples::generator`]);
//! - optimizer: task prompt + a slower kernel + the tester's feedback for it -> a faster kernel
//!   of the same task, for every validated (naive, optimized) pair; or a broken kernel
//!   ([`crate::repair`]) with nvcc's diagnostics -> the correct one ([`repairs`]);
//! - KernelBench problems: the archives' kernels that `archive-native` judged
//!   ([`archive_examples`]).
//!
//! An example's id is the BLAKE3 of its messages as JSON; its split is the family's hold-out
//! split (`test` or `rl`) when the curriculum keeps the family out of SFT ([`kept_out`]), else
//! `val` for a `val_fraction` of ids by hash, else `train` ([`Settings::split_of`]). The
//! `sft-data` stage reads the tables and writes [`SftRows`] as `sft_generator` and
//! `sft_optimizer` ([`cudarl_tables::sft`]).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use cudarl_cuda::task::TaskSpec;
use cudarl_curriculum::prompts::{
    self, CLOSINGS, ChatMessage, GENERATOR_SYSTEM, INTROS, OPTIMIZER_SYSTEM, TaskView,
};
use cudarl_curriculum::rename::Namer;
use cudarl_curriculum::sample::{hash_fraction, order, shape_variants};
use cudarl_data::{DataError, Table};
use cudarl_tables::archive::ArchiveNativeRow;
use cudarl_tables::sft::{SftGeneratorRow, SftOptimizerRow};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The minimum measured speedup of an archive optimizer pair (timing noise is not a lesson).
pub const ARCHIVE_MIN_SPEEDUP: f64 = 1.1;

fn d_per_family() -> usize {
    1000
}
fn d_per_pair() -> usize {
    INTROS.len() * CLOSINGS.len()
}
fn d_val() -> f64 {
    0.05
}
fn d_repairs() -> usize {
    8
}

/// What SFT examples are built and how (the `sft-data` stage's params, `[stages.sft-data]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Generator examples per task family (at most; fewer when the templates run out).
    #[serde(default = "d_per_family")]
    pub per_family: usize,
    /// Optimizer examples per (slower, faster) kernel pair: prompt phrasings taken in a seeded
    /// order, at most `INTROS x CLOSINGS` (24, the default).
    #[serde(default = "d_per_pair")]
    pub optimizer_per_pair: usize,
    /// Repair examples per broken kernel (prompt phrasings, seeded order): every validated
    /// task kernel's breakage from `sft-repairs` that nvcc rejected, with its real diagnostics,
    /// plus one "no code block" case per family. `0`: none, and `sft-repairs` is not an input
    /// (not built for this stage).
    #[serde(default = "d_repairs")]
    pub repairs_per_base: usize,
    /// Fraction of the other examples in `val`.
    #[serde(default = "d_val")]
    pub val_fraction: f64,
    /// Seed of the order in which template variants are taken.
    #[serde(default)]
    pub seed: u64,
    /// Also learn from the archives' kernels for the curriculum's KernelBench train problems
    /// that `archive-native` put in the native ABI and judged: generator examples (KernelBench
    /// prompts, `per_family` per problem) and optimizer examples from each measured kernel to
    /// the problem's fastest, where that is at least 1.1x faster (GPU only).
    #[serde(default)]
    pub archive: bool,
    /// Half of each task's generator examples with the launcher's sizes renamed
    /// ([`cudarl_curriculum::rename`]: the same new names in the module, the declaration, the
    /// example shapes and the kernel), so the model copies the sizes the prompt names instead of
    /// recalling a memorized kernel's. The task kernels only, not the archives'. Absent: off,
    /// and left out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rename_sizes: Option<bool>,
}

impl Settings {
    /// Checks the settings.
    ///
    /// # Errors
    /// `val_fraction` outside [0, 1).
    pub fn check(&self) -> Result<(), String> {
        if !(0.0..1.0).contains(&self.val_fraction) {
            return Err("val_fraction must be in [0, 1)".into());
        }
        Ok(())
    }

    /// The split of example `id`: `reserved` when given (a family kept out), else `val` for a
    /// `val_fraction` of ids by hash ([`hash_fraction`]), else `train`.
    pub fn split_of(&self, id: &str, reserved: Option<&'static str>) -> String {
        match reserved {
            Some(r) => r.into(),
            None if hash_fraction(id) < self.val_fraction => "val".into(),
            None => "train".into(),
        }
    }
}

/// SFT examples as a stage adds them, for `sft_generator` and `sft_optimizer`
/// ([`cudarl_tables::sft`]); the optimizer's columns are unused in the generator's table.
#[derive(Debug, Default)]
pub struct SftRows {
    rows: Vec<SftOptimizerRow>,
}

impl SftRows {
    /// One example of task `task` on `tier`: its id is the blake3 of `messages` as JSON, its
    /// split `split(id)`; `kernel` and `validated` name the answer; `base`, `speedup` and
    /// `kind` are the optimizer table's (`""`, `None`, `""` for the generator's).
    pub fn add(
        &mut self,
        (task, tier): (&str, i64),
        split: impl FnOnce(&str) -> String,
        (kernel, validated): (&str, &str),
        messages: Vec<ChatMessage>,
        (base, speedup, kind): (&str, Option<f64>, &str),
    ) {
        let json = serde_json::to_string(&messages).expect("json");
        let id = blake3::hash(json.as_bytes()).to_hex().to_string();
        self.rows.push(SftOptimizerRow {
            split: split(&id),
            example_id: id,
            task_id: task.to_string(),
            tier,
            kernel_id: kernel.to_string(),
            validated: validated.to_string(),
            messages,
            messages_json: json,
            base_kernel_id: base.to_string(),
            speedup,
            measured: speedup.is_some(),
            kind: kind.to_string(),
        });
    }

    /// Examples so far.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The examples, in the order they were added, as `sft_optimizer` rows.
    pub fn rows(&self) -> &[SftOptimizerRow] {
        &self.rows
    }

    /// The examples as `sft_generator` rows (the optimizer's columns dropped), in order.
    pub fn into_generator_rows(self) -> Vec<SftGeneratorRow> {
        self.rows.into_iter().map(Into::into).collect()
    }
}

/// A validated kernel of a task (or of a KernelBench problem), an example's answer or base.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// Its kernel id.
    pub id: String,
    /// `naive`, `optimized`, ... (`task_kernels.role`), or `archive`.
    pub role: String,
    /// Its CUDA source.
    pub code: String,
    /// `correct` (passed on a GPU) or `compile-only` (compiled; no GPU judged it).
    pub validated: &'static str,
    /// Its measured median time (ms), when timed.
    pub median_ms: Option<f64>,
    /// The tester's feedback on it ([`crate::episode::validation_feedback`]).
    pub feedback: String,
}

/// The columns of one `validations` row the examples use, by name (JSON values).
pub type Validation = BTreeMap<&'static str, Value>;

/// One task's SFT examples: its row of the `tasks` table (or a KernelBench problem's) and the
/// settings.
#[derive(Debug, Clone)]
pub struct TaskExamples<'a> {
    /// How many examples, their seed and their split.
    pub settings: &'a Settings,
    /// The task (or problem) id.
    pub id: &'a str,
    /// Its curriculum tier.
    pub tier: i64,
    /// Its description as prompts show it ([`prompts::module_description`]).
    pub description: &'a str,
    /// Its element type (`f32`, ...).
    pub dtype: &'a str,
    /// The launcher's declaration the kernel must define.
    pub signature: &'a str,
    /// The hold-out split this task is kept for, if any.
    pub kept_out: Option<&'static str>,
    /// Its training shapes (JSON objects of sizes).
    pub shapes: Vec<String>,
    /// Its generator examples may have their sizes renamed ([`Settings::rename_sizes`]).
    pub renamable: bool,
}

impl TaskExamples<'_> {
    /// The task as prompts show it, with `shapes`.
    fn view<'s>(&'s self, shapes: &'s [String]) -> TaskView<'s> {
        TaskView {
            tier: self.tier,
            description: self.description,
            dtype: self.dtype,
            signature: self.signature,
            shapes,
        }
    }

    /// An example answered by `k`; `opt`: the optimizer table's base, speedup and kind.
    fn push(
        &self,
        rows: &mut SftRows,
        k: &Kernel,
        m: Vec<ChatMessage>,
        opt: (&str, Option<f64>, &str),
    ) {
        rows.add(
            (self.id, self.tier),
            |id| self.settings.split_of(id, self.kept_out),
            (&k.id, k.validated),
            m,
            opt,
        );
    }

    /// Generator examples: every (intro, closing, shapes, kernel, lead-in, names) combination,
    /// in an order seeded by the task, `per_family` of them; `names` 1 renames the sizes (when
    /// the task is [`TaskExamples::renamable`]).
    pub fn generator(&self, rows: &mut SftRows, kerns: &[Kernel]) {
        let p = self.settings;
        let variants = shape_variants(&self.shapes);
        let seed = p.seed ^ blake3::hash(self.id.as_bytes()).as_bytes()[0] as u64;
        let texts: Vec<&str> = std::iter::once(self.description)
            .chain(kerns.iter().map(|k| k.code.as_str()))
            .collect();
        // Read once per task; without a renaming, no variant repeats the plain examples.
        let namer = if self.renamable {
            Namer::new(self.signature, &texts)
        } else {
            None
        };
        let names = if namer.is_some() { 2 } else { 1 };
        let n = INTROS.len() * CLOSINGS.len() * variants.len() * kerns.len() * 2 * names;
        for c in order(n, seed).into_iter().take(p.per_family) {
            let (intro, r) = (c % INTROS.len(), c / INTROS.len());
            let (closing, r) = (r % CLOSINGS.len(), r / CLOSINGS.len());
            let (sv, r) = (r % variants.len(), r / variants.len());
            let (ki, r) = (r % kerns.len(), r / kerns.len());
            let (lead, renamed) = (r % 2, r / 2);
            let k = &kerns[ki];
            let rename = namer
                .as_ref()
                .filter(|_| renamed == 1)
                .map(|n| n.draw(seed ^ c as u64));
            let (description, signature, shapes, code) = match &rename {
                Some(r) => (
                    r.python(self.description),
                    r.c(self.signature),
                    variants[sv].iter().map(|s| r.shapes_json(s)).collect(),
                    r.c(&k.code),
                ),
                None => (
                    self.description.to_string(),
                    self.signature.to_string(),
                    variants[sv].clone(),
                    k.code.clone(),
                ),
            };
            let view = TaskView {
                description: &description,
                signature: &signature,
                ..self.view(&shapes)
            };
            let answer = if lead == 1 {
                format!("Here is the kernel:\n\n{}", prompts::fenced(&code))
            } else {
                prompts::fenced(&code)
            };
            let m = vec![
                ChatMessage::new("system", GENERATOR_SYSTEM),
                ChatMessage::new("user", prompts::task_prompt(&view, intro, closing)),
                ChatMessage::new("assistant", answer),
            ];
            self.push(rows, k, m, ("", None, ""));
        }
    }

    /// Optimizer examples: the task, a kernel (`current`) and the tester's words on it (`fb`)
    /// -> `target`, in `n` prompt phrasings taken in an order seeded by `seed_key`.
    pub fn optimizer(
        &self,
        rows: &mut SftRows,
        (seed_key, n): (&str, usize),
        (current, fb): (&str, &str),
        target: &Kernel,
        (base_id, speedup, kind): (&str, Option<f64>, String),
    ) {
        let view = self.view(&self.shapes);
        let seed = self.settings.seed ^ blake3::hash(seed_key.as_bytes()).as_bytes()[0] as u64;
        for c in order(INTROS.len() * CLOSINGS.len(), seed)
            .into_iter()
            .take(n)
        {
            let (intro, closing) = (c % INTROS.len(), c / INTROS.len());
            let m = vec![
                ChatMessage::new("system", OPTIMIZER_SYSTEM),
                ChatMessage::new(
                    "user",
                    prompts::optimizer_prompt(&view, current, fb, intro, closing),
                ),
                ChatMessage::new("assistant", prompts::fenced(&target.code)),
            ];
            self.push(rows, target, m, (base_id, speedup, &kind));
        }
    }

    /// All of the task's examples answered by its validated kernels `kerns`: the generator's
    /// ([`TaskExamples::generator`]); the optimizer's for each (naive, other) pair, `speedup`
    /// the naive kernel's median time over the other's, skipped when measured and not above 1
    /// (`optimizer_per_pair` phrasings); and the optimizer's repairs (a broken kernel and the
    /// tester's words on it -> the correct one, `repairs_per_base` phrasings).
    pub fn examples(
        &self,
        (gen_rows, opt_rows): (&mut SftRows, &mut SftRows),
        kerns: &[Kernel],
        repairs: &[Repair],
    ) {
        let p = self.settings;
        self.generator(gen_rows, kerns);
        // Optimizer: each naive -> optimized pair, faster when measured.
        for base in kerns.iter().filter(|k| k.role == "naive") {
            for better in kerns.iter().filter(|k| k.role != "naive") {
                let speedup = match (base.median_ms, better.median_ms) {
                    (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                    _ => None,
                };
                if speedup.is_some_and(|s| s <= 1.0) {
                    continue;
                }
                self.optimizer(
                    opt_rows,
                    (&better.id, p.optimizer_per_pair),
                    (&base.code, &base.feedback),
                    better,
                    (&base.id, speedup, "optimize".into()),
                );
            }
        }
        // Optimizer repairs: a broken kernel and the tester's words on it -> the correct one.
        for r in repairs {
            self.optimizer(
                opt_rows,
                (&r.base_id, p.repairs_per_base),
                (&r.broken, &r.feedback),
                &r.target,
                (&r.base_id, None, format!("repair:{}", r.kind)),
            );
        }
    }
}

/// Validation rows by kernel id, as JSON values of the columns the examples use.
///
/// # Errors
/// A required column of `validations` is missing or has the wrong type
/// ([`DataError::BadInput`], named).
pub fn validation_rows(vt: &Table) -> Result<BTreeMap<String, Validation>, DataError> {
    let mut val: BTreeMap<String, Validation> = BTreeMap::new();
    let kid = vt.req_strings("kernel_id")?;
    let compiled = vt.req_bools("compiled")?;
    let executed = vt.req_bools("executed")?;
    let correct = vt.bools("correct")?;
    let fcols = [
        "median_ms",
        "speedup_vs_torch",
        "dram_fraction_of_peak",
        "speedup_vs_naive",
    ];
    let icols = [
        "tests",
        "tests_passed",
        "registers",
        "shared_mem_bytes",
        "spill_bytes",
    ];
    let fs: Vec<_> = fcols
        .iter()
        .map(|c| vt.floats(c))
        .collect::<Result<_, _>>()?;
    let is: Vec<_> = icols.iter().map(|c| vt.ints(c)).collect::<Result<_, _>>()?;
    for i in 0..vt.rows() {
        let Some(k) = kid.get(i) else { continue };
        let mut m: BTreeMap<&str, Value> = BTreeMap::new();
        m.insert("compiled", compiled.get(i).unwrap_or(false).into());
        m.insert("executed", executed.get(i).unwrap_or(false).into());
        m.insert(
            "correct",
            correct
                .as_ref()
                .and_then(|c| c.get(i))
                .map_or(Value::Null, Value::from),
        );
        for (c, col) in fcols.iter().zip(&fs) {
            if let Some(v) = col.as_ref().and_then(|c| c.get(i)) {
                m.insert(c, v.into());
            }
        }
        for (c, col) in icols.iter().zip(&is) {
            if let Some(v) = col.as_ref().and_then(|c| c.get(i)) {
                m.insert(c, v.into());
            }
        }
        val.insert(k.to_string(), m);
    }
    Ok(val)
}

/// Kernels per task that validated (correct on a GPU, or compiled compile-only), with their
/// validation in `val`.
///
/// # Errors
/// A required column of `task_kernels` is missing or has the wrong type
/// ([`DataError::BadInput`], named).
pub fn validated_kernels(
    kt: &Table,
    val: &BTreeMap<String, Validation>,
) -> Result<BTreeMap<String, Vec<Kernel>>, DataError> {
    let mut by_task: BTreeMap<String, Vec<Kernel>> = BTreeMap::new();
    let kid = kt.req_strings("kernel_id")?;
    let task = kt.req_strings("task_id")?;
    let role = kt.req_strings("role")?;
    let code = kt.req_strings("code")?;
    for i in 0..kt.rows() {
        let (Some(k), Some(t), Some(r), Some(c)) =
            (kid.get(i), task.get(i), role.get(i), code.get(i))
        else {
            continue;
        };
        let Some(v) = val.get(k) else { continue };
        let validated = match (
            v["compiled"].as_bool(),
            v["executed"].as_bool(),
            v["correct"].as_bool(),
        ) {
            (_, Some(true), Some(true)) => "correct",
            (Some(true), Some(false), _) => "compile-only",
            _ => continue,
        };
        by_task.entry(t.to_string()).or_default().push(Kernel {
            id: k.to_string(),
            role: r.to_string(),
            code: c.to_string(),
            validated,
            median_ms: v.get("median_ms").and_then(Value::as_f64),
            feedback: crate::episode::validation_feedback(v),
        });
    }
    Ok(by_task)
}

/// `test` or `rl` for a task family the curriculum keeps out of SFT, else `None`.
///
/// # Errors
/// The family has no row in the curriculum, or a split other than `train`, `rl` or `test`
/// ([`DataError::BadInput`] of file `curriculum`).
pub fn kept_out(
    splits: &BTreeMap<String, String>,
    task: &str,
) -> Result<Option<&'static str>, DataError> {
    match splits.get(task).map(String::as_str) {
        Some("test") => Ok(Some("test")),
        Some("rl") => Ok(Some("rl")),
        Some("train") => Ok(None),
        Some(other) => Err(DataError::bad(
            "curriculum",
            Some("split"),
            format!("synth/{task}: split `{other}` (expected train, rl or test)"),
        )),
        None => Err(DataError::bad(
            "curriculum",
            Some("problem_id"),
            format!("no row synth/{task} for task family {task}"),
        )),
    }
}

/// One repair example's base: a broken kernel, the tester's feedback on it, the answer.
#[derive(Debug, Clone)]
pub struct Repair {
    /// `<kernel_id>#<breakage>` (the example's base kernel id).
    pub base_id: String,
    /// The breakage ([`crate::repair::Breakage::name`]) or `no_code`.
    pub kind: &'static str,
    /// The broken source (empty for `no_code`).
    pub broken: String,
    /// The tester's feedback on it.
    pub feedback: String,
    /// The correct kernel, the answer.
    pub target: Kernel,
}

/// The repair bases of every task of `by_task` (its validated kernels) that `specs` has (see
/// [`Settings::repairs_per_base`]): each validated kernel's breakage from `sft-repairs`' table
/// `rt` that nvcc really rejected, with its diagnostics; plus one "no code block" base per
/// task whose answer is its fastest kernel (else its first non-naive one, else its first).
///
/// # Errors
/// A `repairs` table without its columns, or a breakage of unknown kind
/// ([`DataError::BadInput`], file and field named).
pub fn repairs(
    specs: &BTreeMap<String, TaskSpec>,
    rt: &Table,
    by_task: &BTreeMap<String, Vec<Kernel>>,
) -> Result<BTreeMap<String, Vec<Repair>>, DataError> {
    let mut out: BTreeMap<String, Vec<Repair>> = BTreeMap::new();
    // Rejected breakages by kernel id: (kind, broken code, feedback).
    let mut broken: BTreeMap<&str, Vec<(&'static str, &str, &str)>> = BTreeMap::new();
    let (kid, kind) = (rt.req_strings("kernel_id")?, rt.req_strings("kind")?);
    let (code, fb) = (rt.req_strings("broken")?, rt.req_strings("feedback")?);
    let compiled = rt.req_bools("compiled")?;
    for i in 0..rt.rows() {
        // A breakage nvcc accepts teaches nothing about repairs.
        if compiled.get(i) != Some(false) {
            continue;
        }
        let (Some(k), Some(n), Some(c), Some(f)) =
            (kid.get(i), kind.get(i), code.get(i), fb.get(i))
        else {
            continue;
        };
        let Some(n) = crate::repair::Breakage::ALL
            .iter()
            .map(|b| b.name())
            .find(|b| *b == n)
        else {
            return Err(DataError::bad(
                "repairs",
                Some("kind"),
                format!("kernel `{k}`: unknown breakage `{n}`"),
            ));
        };
        broken.entry(k).or_default().push((n, c, f));
    }
    for (t, kerns) in by_task {
        let Some(spec) = specs.get(t) else { continue };
        for k in kerns {
            for (n, c, f) in broken.get(k.id.as_str()).into_iter().flatten() {
                out.entry(t.clone()).or_default().push(Repair {
                    base_id: format!("{}#{n}", k.id),
                    kind: n,
                    feedback: f.to_string(),
                    broken: c.to_string(),
                    target: k.clone(),
                });
            }
        }
        // No code block: the answer is the task's fastest kernel.
        let best = kerns
            .iter()
            .filter_map(|k| k.median_ms.map(|m| (m, k)))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, k)| k)
            .or_else(|| kerns.iter().find(|k| k.role != "naive"))
            .or(kerns.first());
        if let Some(b) = best {
            out.entry(t.clone()).or_default().push(Repair {
                base_id: format!("{}#no_code", b.id),
                kind: "no_code",
                broken: String::new(),
                feedback: crate::episode::feedback(spec.tier, None, None, &[]),
                target: b.clone(),
            });
        }
    }
    Ok(out)
}

/// The examples of the archive kernels `rows` (`archive-native`'s table; see
/// [`Settings::archive`]) added to `gen_rows` and `opt_rows`: per problem, generator examples
/// from its kernels that passed (or compiled, compile-only), and each measured kernel -> the
/// problem's fastest where that is at least [`ARCHIVE_MIN_SPEEDUP`] times faster. Says how many
/// kernels of each source they use (`"<n> <source> kernels, ..."`).
pub fn archive_examples(
    settings: &Settings,
    rows: &[ArchiveNativeRow],
    gen_rows: &mut SftRows,
    opt_rows: &mut SftRows,
) -> String {
    // Problem -> (tier, split, description, signature, kernels).
    type Problem<'a> = (i64, &'a str, &'a str, &'a str, Vec<Kernel>);
    let mut problems: BTreeMap<&str, Problem<'_>> = BTreeMap::new();
    let mut used: BTreeMap<&str, usize> = BTreeMap::new();
    for r in rows {
        let v = match r.validated.as_str() {
            "correct" => "correct",
            "compile-only" => "compile-only",
            _ => continue,
        };
        let Some(c) = &r.code else {
            continue;
        };
        *used.entry(r.source.as_str()).or_default() += 1;
        let e = problems
            .entry(&r.problem_id)
            .or_insert_with(|| (r.tier, &r.split, &r.description, &r.signature, Vec::new()));
        e.4.push(Kernel {
            id: r.kernel_id.clone(),
            role: "archive".into(),
            code: c.clone(),
            validated: v,
            median_ms: r.median_ms,
            feedback: r.feedback.clone().unwrap_or_default(),
        });
    }
    for (id, (tier, split, description, signature, kerns)) in &problems {
        let task = TaskExamples {
            settings,
            id,
            tier: *tier,
            description,
            dtype: prompts::signature_dtype(signature),
            signature,
            kept_out: match *split {
                "train" => None,
                "val" => Some("val"),
                _ => Some("test"),
            },
            shapes: vec![],
            renamable: false,
        };
        task.generator(gen_rows, kerns);
        // Each measured kernel -> the fastest one, where that is at least 1.1x faster.
        let fastest = kerns
            .iter()
            .filter(|k| k.median_ms.is_some_and(|m| m > 0.0))
            .min_by(|a, b| {
                a.median_ms
                    .partial_cmp(&b.median_ms)
                    .unwrap_or(Ordering::Equal)
            });
        for base in kerns {
            let Some(best) = fastest else { break };
            let Some(s) = base.median_ms.zip(best.median_ms).map(|(a, b)| a / b) else {
                continue;
            };
            if s < ARCHIVE_MIN_SPEEDUP || !s.is_finite() {
                continue;
            }
            task.optimizer(
                opt_rows,
                (&best.id, settings.optimizer_per_pair),
                (&base.code, &base.feedback),
                best,
                (&base.id, Some(s), "optimize".into()),
            );
        }
    }
    used.iter()
        .map(|(s, n)| format!("{n} {s} kernels"))
        .collect::<Vec<_>>()
        .join(", ")
}
