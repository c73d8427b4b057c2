//! The model stages end to end on CPU with the `tiny` config: `sft-data` -> `tokenizer` ->
//! `pretrain` -> `sft-train` (generator and optimizer) -> `sft-eval` -> `rl-train` -> `eval`
//! through the real trainer process and nvcc, one behaviour per test on one shared store, and
//! bad model configs and RL params are named (exit 2).

mod common;

use common::{Project, repo_root, stdout};
use serde_json::Value;

fn rows(p: &Project, node: &str, output: &str) -> Vec<Value> {
    rows_with(p, node, output, &[])
}

/// `export eval --output report` into `dir` under `--set` overrides; the report's Markdown.
fn export_report(p: &Project, dir: &str, sets: &[&str]) -> String {
    let out = p.path(dir);
    let mut args = vec![
        "export",
        "eval",
        "--build",
        "--output",
        "report",
        "--to",
        out.to_str().unwrap(),
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = p.run(&args);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    std::fs::read_to_string(out.join("eval/report/report.md")).unwrap()
}

/// The rows of `node`'s `output` under `--set` overrides.
fn rows_with(p: &Project, node: &str, output: &str, sets: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "show", node, "--output", output, "--json", "--head", "100000",
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = p.run(&args);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The store the CPU model tests share: one per test run (`NEXTEST_RUN_ID`, else this process),
/// so the SFT checkpoints are trained once and each test reads or extends them; the store's
/// per-node locks make the tests that start together wait for one another's nodes. Stores of
/// earlier runs older than a day are removed.
fn shared_store() -> std::path::PathBuf {
    let base = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let run = std::env::var("NEXTEST_RUN_ID").unwrap_or_else(|_| std::process::id().to_string());
    let dir = base.join(format!("models-store-{run}"));
    if let Ok(entries) = std::fs::read_dir(base) {
        for e in entries.flatten() {
            let old = e.file_name().to_string_lossy().starts_with("models-store-")
                && e.path() != dir
                && e.metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().is_ok_and(|a| a.as_secs() > 86_400));
            if old {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A project for the model stages on the CPU: vector_add and row_sum (held out) and two
/// generated elementwise families reserved for RL, small SFT and RL settings, the `tiny` model
/// with batches of 2, and its store shared with the other tests of this file.
fn cpu_project() -> Project {
    let p = Project::new();
    let pl = p.path("pipelines/default.toml");
    let mut text = std::fs::read_to_string(&pl).unwrap();
    // Every edit must find its text: a default that moved would otherwise change these tests
    // silently.
    for (from, to) in [
        ("per_family = 20 ", "per_family = 40 "),
        // Two generated elementwise families, both reserved for RL (their id hashes, 0.578
        // and 0.424, fall in [holdout_generated, holdout_generated + 0.6)).
        (
            "[stages.synth-tasks]\n",
            "[stages.synth-tasks]\ngenerate = { elementwise = 2, row_reduce = 0, seed = 3 }\n",
        ),
        ("rl_generated = 0.2 ", "rl_generated = 0.6 "),
        (
            r#"holdout_tasks = ["scalar_multiply", "row_max"]"#,
            r#"holdout_tasks = ["row_sum"]"#,
        ),
        // sft-eval's and eval's samples.
        ("samples = 8", "samples = 3"),
        // The copy documents are a test's own, below.
        ("copy_documents = 3000 ", "copy_documents = 0 "),
        ("\nsteps = 5 ", "\nsteps = 2 "),
        ("tasks_per_step = 8", "tasks_per_step = 1"),
        ("group_size = 8 ", "group_size = 2 "),
        // One pass per update here; the `own` run takes two.
        ("\nepochs = 4 ", "\nepochs = 1 "),
        ("max_new_tokens = 2560", "max_new_tokens = 32"),
        // The tiny model earns no reward on the CPU, so signal-only updates would train on
        // nothing; these tests check the update path (one test checks signal-only itself).
        ("\nkl_coef = 0.04", "\nsignal_only = false\nkl_coef = 0.04"),
    ] {
        assert!(
            text.contains(from),
            "pipelines/default.toml has no `{from}`"
        );
        text = text.replace(from, to);
    }
    std::fs::write(&pl, text).unwrap();
    // Two families make few SFT examples: smaller batches, more steps.
    let mc = p.path("configs/model/tiny.toml");
    let t = std::fs::read_to_string(&mc).unwrap();
    std::fs::write(&mc, t.replace("batch_size = 8", "batch_size = 2")).unwrap();
    std::os::unix::fs::symlink(shared_store(), p.store()).unwrap();
    p
}

/// `run targets --set set` must fail with exit 2 and say `says` (a stage's error is in the run
/// summary on stdout, a pipeline error on stderr).
fn fails_with(p: &Project, targets: &[&str], set: &str, says: &str) {
    let mut args = vec!["run"];
    args.extend(targets);
    args.extend(["--set", set]);
    let o = p.run(&args);
    let err = format!("{}{}", stdout(&o), common::stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{set}: {err}");
    assert!(err.contains(says), "{set}: {err}");
}

/// `cudarl-pipe args` with each of `sets` as a `--set` override.
fn run_sets(p: &Project, args: &[&str], sets: &[&str]) -> std::process::Output {
    let mut all = args.to_vec();
    for s in sets {
        all.extend(["--set", s]);
    }
    p.run(&all)
}

/// `run` with `--set` overrides, which must succeed.
fn run_ok(p: &Project, targets: &[&str], sets: &[&str]) {
    let mut args = vec!["run"];
    args.extend(targets);
    let o = run_sets(p, &args, sets);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
}

/// The project with its SFT stages run (cached after the first test that ran them).
fn after_sft() -> Project {
    let p = cpu_project();
    run_ok(&p, &["sft-train", "sft-train-optimizer", "sft-eval"], &[]);
    p
}

/// The project with the default `rl-train` and `eval` run.
fn after_rl() -> Project {
    let p = cpu_project();
    run_ok(&p, &["rl-train", "eval"], &[]);
    p
}

/// The families `sft-data` reserved for RL (the `rl` split).
fn rl_families(p: &Project) -> std::collections::BTreeSet<String> {
    rows(p, "sft-data", "sft_generator")
        .iter()
        .filter(|r| r["split"] == "rl")
        .map(|r| r["task_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn sft_data_is_chat_messages_with_the_holdout_and_rl_families_in_their_own_splits() {
    let p = after_sft();
    let g = rows(&p, "sft-data", "sft_generator");
    assert!(!g.is_empty());
    for r in &g {
        let m = r["messages"].as_array().unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0]["role"], "system");
        assert!(
            m[1]["content"]
                .as_str()
                .unwrap()
                .contains("extern \"C\" void launch(")
        );
        assert!(m[2]["content"].as_str().unwrap().contains("```cuda\n"));
        // No GPU here: every kernel is compile-only validated, and says so.
        assert_eq!(r["validated"], "compile-only");
        // The test project has vector_add and row_sum; row_sum is held out, the generated
        // families are the `rl` split.
        let holdout = r["task_id"] == "row_sum";
        assert_eq!(holdout, r["split"] == "test", "{}", r["task_id"]);
        let reserved = r["task_id"].as_str().unwrap().starts_with("gen_ew_");
        assert_eq!(reserved, r["split"] == "rl", "{}", r["task_id"]);
    }
    assert_eq!(rl_families(&p).len(), 2);
    // `rename_sizes`: some examples name the sizes otherwise than the task does, and their
    // kernel uses the names their prompt declares, never the task's.
    let tasks = rows(&p, "synth-tasks", "tasks");
    let declared = |prompt: &str| -> String {
        let at = prompt
            .find("extern \"C\" void launch(")
            .expect("a declaration");
        prompt[at..at + prompt[at..].find(';').expect("ends")].to_string()
    };
    let sizes = |sig: &str| -> Vec<String> {
        sig.split(['(', ',', ')'])
            .filter_map(|p| p.trim().strip_prefix("int64_t ").map(str::to_string))
            .collect()
    };
    let mut renamed = 0;
    for r in &g {
        let task = tasks.iter().find(|t| t["task_id"] == r["task_id"]).unwrap();
        let own = task["signature"].as_str().unwrap();
        let shown = declared(r["messages"][1]["content"].as_str().unwrap());
        if shown == own {
            continue;
        }
        renamed += 1;
        let answer = r["messages"][2]["content"].as_str().unwrap();
        assert!(answer.contains(&shown), "{shown}\n{answer}");
        for (old, new) in sizes(own).iter().zip(sizes(&shown)) {
            assert_ne!(old, &new);
            let word = regex::Regex::new(&format!(r"\b{old}\b")).unwrap();
            assert!(!word.is_match(&shown), "{old} left in {shown}");
        }
    }
    assert!(renamed > g.len() / 5, "{renamed} of {} renamed", g.len());
    let opt = rows(&p, "sft-data", "sft_optimizer");
    assert!(
        !opt.is_empty()
            && opt
                .iter()
                .all(|r| r["measured"] == Value::Bool(false) && r["speedup"].is_null())
    );
    let optimize: Vec<&Value> = opt.iter().filter(|r| r["kind"] == "optimize").collect();
    assert!(!optimize.is_empty());
    assert!(
        optimize[0]["messages"][1]["content"]
            .as_str()
            .unwrap()
            .contains("not run: compile-only")
    );
}

#[test]
fn archive_kernels_in_the_native_abi_become_kernelbench_sft_examples() {
    let p = cpu_project();
    let sets = ["archive-native.limit=4", "sft-data.archive=true"];
    run_ok(&p, &["sft-data"], &sets);
    run_ok(&p, &["sft-data"], &[]);
    let a = rows_with(&p, "archive-native", "archive_native", &sets);
    assert!(!a.is_empty());
    let mut compiled = 0;
    for r in &a {
        // Only the curriculum's train problems: eval's KernelBench test problems stay unseen.
        assert_eq!(r["split"], "train", "{r}");
        assert!(r["problem_id"].as_str().unwrap().starts_with("kb/L"));
        if r["converted"] == Value::Bool(false) {
            assert!(r["reason"].as_str().is_some_and(|s| !s.is_empty()), "{r}");
            continue;
        }
        let code = r["code"].as_str().unwrap();
        assert!(code.contains("extern \"C\" void launch("), "{code}");
        assert!(
            !code.contains("torch") && !code.contains("PYBIND11"),
            "{code}"
        );
        // Built by nvcc against the problem's launcher; no GPU here, so compile-only.
        if r["compiled"] == Value::Bool(true) {
            compiled += 1;
            assert_eq!(r["validated"], "compile-only", "{r}");
            assert!(r["correct"].is_null());
        }
    }
    assert!(compiled >= 2, "{a:?}");
    let g = rows_with(&p, "sft-data", "sft_generator", &sets);
    let kb: Vec<&Value> = g
        .iter()
        .filter(|r| r["task_id"].as_str().unwrap().starts_with("kb/"))
        .collect();
    assert!(!kb.is_empty());
    let kept: std::collections::BTreeMap<&str, &str> = a
        .iter()
        .filter(|r| r["validated"] == "compile-only")
        .map(|r| {
            (
                r["kernel_id"].as_str().unwrap(),
                r["code"].as_str().unwrap(),
            )
        })
        .collect();
    for r in &kb {
        assert!(["train", "val"].contains(&r["split"].as_str().unwrap()));
        let m = r["messages"].as_array().unwrap();
        // The prompt RL shows for a KernelBench problem: its PyTorch source and the launcher.
        let user = m[1]["content"].as_str().unwrap();
        assert!(user.contains("class Model") && user.contains("extern \"C\" void launch("));
        let code = kept[r["kernel_id"].as_str().unwrap()];
        assert!(m[2]["content"].as_str().unwrap().contains(code.trim_end()));
    }
    // Optimizer pairs need measured times: none without a GPU.
    let o = rows_with(&p, "sft-data", "sft_optimizer", &sets);
    assert!(
        o.iter()
            .all(|r| !r["task_id"].as_str().unwrap().starts_with("kb/"))
    );
    // Off without the setting (these projects turn it off, as the `cpu` profile does).
    let plain = rows(&p, "sft-data", "sft_generator");
    assert!(
        plain
            .iter()
            .all(|r| !r["task_id"].as_str().unwrap().starts_with("kb/"))
    );
}

#[test]
fn optimizer_repair_examples_are_task_kernels_nvcc_rejected_with_its_diagnostics() {
    let p = after_sft();
    let opt = rows(&p, "sft-data", "sft_optimizer");
    let user = |r: &Value| r["messages"][1]["content"].as_str().unwrap().to_string();
    let answer = |r: &Value| r["messages"][2]["content"].as_str().unwrap().to_string();
    // Each task kernel broken once and really compiled by nvcc, whose diagnostics are the
    // feedback; the answer is the kernel it was broken from (a validated one).
    let kernels: std::collections::BTreeMap<String, String> =
        rows(&p, "synth-tasks", "task_kernels")
            .iter()
            .map(|r| {
                (
                    r["kernel_id"].as_str().unwrap().to_string(),
                    r["code"].as_str().unwrap().to_string(),
                )
            })
            .collect();
    let mut kinds = std::collections::BTreeSet::new();
    for r in opt.iter().filter(|r| r["kind"] != "optimize") {
        let kind = r["kind"].as_str().unwrap();
        kinds.insert(kind.to_string());
        let (u, a) = (user(r), answer(r));
        let code = &kernels[r["kernel_id"].as_str().unwrap()];
        assert_eq!(a, format!("```cuda\n{}\n```", code.trim_end()), "{kind}");
        if kind == "repair:no_code" {
            assert!(u.contains("No code block found."), "{u}");
        } else {
            assert!(u.contains("Compilation failed:\n  line "), "{u}");
            assert!(u.contains(": error: "), "{u}");
            assert!(
                !u.contains(code.trim_end()),
                "the prompt holds the broken kernel"
            );
            assert_eq!(
                r["base_kernel_id"].as_str().unwrap(),
                format!("{}#{}", r["kernel_id"].as_str().unwrap(), &kind[7..])
            );
        }
    }
    assert!(
        kinds.contains("repair:no_code") && kinds.len() >= 2,
        "{kinds:?}"
    );
    // `sft-repairs` (beside validate: no verdicts needed): one row per task kernel a breakage
    // applies to, nvcc's verdict on it, and sft-data's repair rows are its rejected ones.
    let rep = rows(&p, "sft-repairs", "repairs");
    assert!(!rep.is_empty() && rep.len() <= kernels.len());
    for r in &rep {
        let k = r["kernel_id"].as_str().unwrap();
        assert!(kernels.contains_key(k), "{k}");
        assert_ne!(r["broken"].as_str().unwrap(), kernels[k], "{k} is broken");
        if r["compiled"] == Value::Bool(false) {
            assert!(r["feedback"].as_str().unwrap().contains(": error: "), "{r}");
        }
    }
    let rejected: std::collections::BTreeSet<String> = rep
        .iter()
        .filter(|r| r["compiled"] == Value::Bool(false))
        .map(|r| {
            format!(
                "{}#{}",
                r["kernel_id"].as_str().unwrap(),
                r["kind"].as_str().unwrap()
            )
        })
        .collect();
    for r in opt
        .iter()
        .filter(|r| r["kind"] != "optimize" && r["kind"] != "repair:no_code")
    {
        let b = r["base_kernel_id"].as_str().unwrap();
        assert!(
            rejected.contains(b),
            "{b} is a rejected breakage of sft-repairs"
        );
    }
    // No repair examples (`repairs_per_base = 0`): sft-data does not read `sft-repairs`, and
    // the optimizer learns from kernel pairs alone.
    let o = p.run(&[
        "run",
        "sft-data",
        "--set",
        "sft-data.repairs_per_base=0",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    let m = common::records(&o);
    assert_eq!(common::status_of(&m, "sft-data"), "ran");
    assert!(!m.contains_key("sft-repairs"), "{:?}", m.keys());
    let opt = rows_with(
        &p,
        "sft-data",
        "sft_optimizer",
        &["sft-data.repairs_per_base=0"],
    );
    assert!(!opt.is_empty() && opt.iter().all(|r| r["kind"] == "optimize"));
}

#[test]
fn pretrain_and_sft_losses_fall_and_checkpoints_are_hugging_face_directories() {
    let p = after_sft();
    for node in ["pretrain", "sft-train", "sft-train-optimizer"] {
        let m = rows(&p, node, "metrics");
        assert!(m.len() >= 10, "{node}: {} steps", m.len());
        assert!(m.iter().all(|r| r["device"] == "cpu"));
        let first = m[0]["loss"].as_f64().unwrap();
        let last = m.last().unwrap()["loss"].as_f64().unwrap();
        assert!(last < first, "{node}: loss {first} -> {last}");
        assert!(m.last().unwrap()["eval_loss"].as_f64().is_some(), "{node}");
        let files: Vec<String> = rows(&p, node, "checkpoint")
            .iter()
            .map(|r| r["file"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            files,
            [
                "config.json",
                "generation_config.json",
                "model.safetensors",
                "tokenizer.json",
                "tokenizer_config.json"
            ],
            "{node}"
        );
    }
    // The exported generator opens in transformers with its chat template (the text the
    // trainer renders, ChatML) and generation settings.
    let out = p.path("hf");
    let o = p.run(&[
        "export",
        "sft-train",
        "--build",
        "--to",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    if let Some(python) = common::python() {
        let o = std::process::Command::new(python)
            .arg(repo_root().join("tests/python/check_chat_template.py"))
            .arg(out.join("sft-train/checkpoint"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", common::stderr(&o));
        let r: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        assert_eq!(
            r["text"],
            "<|im_start|>system\nYou write CUDA kernels.<|im_end|>\n\
             <|im_start|>user\nWrite a kernel that adds two vectors.<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        // `<|im_end|>` ends a turn and generation, `<|endoftext|>` pads and stops too.
        assert_eq!(
            r["generation_eos_token_id"],
            serde_json::json!([r["eos_token_id"], r["pad_token_id"]]),
            "{r}"
        );
        assert_ne!(r["eos_token_id"], r["pad_token_id"], "{r}");
        assert_eq!(r["temperature"], 0.7);
        assert!(r["generated"].as_i64().unwrap() >= 1, "{r}");
    } else {
        eprintln!("SKIPPED: the transformers check (no python)");
    }
    // Cached the second time.
    let o = p.run(&["run", "sft-train", "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let s = stdout(&o);
    assert!(s.contains("\"cached\""), "{s}");
}

#[test]
fn copy_documents_add_pretraining_tokens_and_are_a_pretrain_parameter_only() {
    let p = after_sft();
    let tokens = |m: Vec<Value>| -> i64 { m.iter().map(|r| r["tokens"].as_i64().unwrap()).sum() };
    let base = tokens(rows(&p, "pretrain", "metrics"));
    let more = ["pretrain.copy_documents=24"];
    run_ok(&p, &["pretrain"], &more);
    let more = tokens(rows_with(&p, "pretrain", "metrics", &more));
    assert!(more > base, "{more} vs {base} tokens");
    let o = p.run(&["run", "sft-train", "--set", "sft-train.copy_documents=24"]);
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
    assert!(common::stderr(&o).contains("`pretrain` parameters"));
}

#[test]
fn sft_eval_puts_the_generators_holdout_samples_through_nvcc() {
    let p = after_sft();
    let ev = rows(&p, "sft-eval", "sft_eval");
    let ids: Vec<&str> = ev.iter().map(|r| r["task_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["row_sum"]);
    for r in &ev {
        assert_eq!(r["samples"], 3);
        assert_eq!(r["mode"], "compile-only");
        let rate = r["compile_rate"].as_f64().unwrap();
        assert_eq!(rate, r["compiled"].as_f64().unwrap() / 3.0);
    }
    let s = rows(&p, "sft-eval", "samples");
    assert_eq!(s.len(), 3);
    for r in &s {
        assert!(r["tokens"].as_i64().unwrap() <= 48);
        // A sample without a code block is `no_code`; one with code went through nvcc.
        if r["code"].is_null() {
            assert_eq!(r["failure"], "no_code");
        } else {
            assert!(
                r["compiled"].as_bool().unwrap() || !r["failure"].is_null(),
                "{r}"
            );
        }
    }
}

#[test]
fn rl_train_on_the_cpu_is_compile_only_labelled_and_practises_the_rl_split() {
    let p = after_rl();
    let m = rows(&p, "rl-train", "metrics");
    // Signal-only updates (the default outside these tests): no reward spread, no update.
    let only = ["rl-train.signal_only=true"];
    run_ok(&p, &["rl-train"], &only);
    for r in rows_with(&p, "rl-train", "metrics", &only) {
        assert_eq!(r["signal_groups"], 0.0, "{r}");
        assert_eq!(r["update_steps"], 0, "{r}");
        assert_eq!(r["optimizer_update_steps"], 0, "{r}");
    }
    for r in &m {
        assert!(r["update_steps"].as_i64().unwrap() >= 1, "{r}");
    }
    assert_eq!(m.len(), 2);
    for r in &m {
        assert_eq!(r["mode"], "compile-only");
        assert_eq!(r["device"], "cpu");
        assert_eq!(r["episodes"], 2);
        assert!(r["pass_rate"].is_null(), "nothing ran: no pass rate {r}");
        assert!(r["entropy"].as_f64().unwrap() > 0.0);
        // No target_kl by default: every minibatch stepped; the KL it moved is recorded.
        assert_eq!(r["skipped_minibatches"], 0, "{r}");
        assert!(
            r["optimizer_max_approx_kl"].as_f64().unwrap().is_finite(),
            "{r}"
        );
        assert_eq!(r["algorithm"], "grpo");
        assert!(r["value_loss"].is_null());
        assert!(
            r["control_reward"].is_null(),
            "the control is off by default"
        );
    }
    let t = rows(&p, "rl-train", "turns");
    assert!(!t.is_empty());
    for r in &t {
        assert!(r["tokens"].as_i64().unwrap() <= 32);
        let c: Value = serde_json::from_str(r["components_json"].as_str().unwrap()).unwrap();
        assert_eq!(c["mode"], "compile-only");
        assert_eq!(c["reward"], r["reward"]);
        // The generator writes turn 0, the optimizer the rest.
        let want = if r["turn"] == 0 {
            "generator"
        } else {
            "optimizer"
        };
        assert_eq!(r["role"], want);
    }
    // RL practised on the families SFT never saw (task_pool = "auto": the `rl` split).
    let rl = rl_families(&p);
    assert!(
        t.iter()
            .all(|r| rl.contains(r["task_id"].as_str().unwrap())),
        "rl-train drew a family outside the rl split"
    );
    let tiers = rows(&p, "rl-train", "tiers");
    assert_eq!(tiers[0]["opened_at_step"], 0);
}

#[test]
fn rl_train_metrics_account_for_overlap_signal_groups_tiers_and_harness_phases() {
    let p = after_rl();
    let m = rows(&p, "rl-train", "metrics");
    let t = rows(&p, "rl-train", "turns");
    for r in &m {
        let step = &r["step"];
        // Every kernel that reached the harness was handed to nvcc while the batch decoded.
        let tested = t.iter().any(|x| {
            &x["step"] == step
                && !x["code"].is_null()
                && !x["feedback"]
                    .as_str()
                    .unwrap()
                    .starts_with("This kernel is identical")
        });
        let want = if tested { 1.0 } else { 0.0 };
        assert_eq!(r["compile_overlap"].as_f64(), Some(want), "{r}");
        // Both episodes are tier 0 (the two families' lowest tier opens first): the per-tier
        // mean is the step's mean.
        let bt: Value = serde_json::from_str(r["reward_by_tier_json"].as_str().unwrap()).unwrap();
        assert_eq!(bt.as_object().unwrap().len(), 1, "{bt}");
        assert_eq!(bt["0"].as_f64(), r["mean_reward"].as_f64(), "{bt}");
        // One GRPO group of 2 episodes per step: it carries a signal iff the two generator
        // turns' credits differ.
        let credits: Vec<f64> = t
            .iter()
            .filter(|x| &x["step"] == step && x["role"] == "generator")
            .map(|x| x["credit"].as_f64().unwrap())
            .collect();
        assert_eq!(credits.len(), 2);
        let want = if (credits[0] - credits[1]).abs() > 1e-9 {
            1.0
        } else {
            0.0
        };
        assert_eq!(r["signal_groups"].as_f64(), Some(want), "{r}");
        // The GPU and SASS phases run side by side after the compile phase.
        let ph = |k: &str| r[format!("harness_{k}_seconds")].as_f64().unwrap();
        let phases = ph("compile") + ph("gpu").max(ph("sass"));
        assert!(
            phases <= r["harness_seconds"].as_f64().unwrap() + 1e-3,
            "{r}"
        );
        // No GPU here: no GPU job ran (microseconds of bookkeeping at most).
        assert!(r["harness_gpu_seconds"].as_f64().unwrap() < 1e-2, "{r}");
    }
}

#[test]
fn eval_summarizes_sft_and_rl_and_keeps_every_turn_of_every_episode() {
    let p = after_rl();
    let sum = rows(&p, "eval", "summary");
    let cks: Vec<&str> = sum
        .iter()
        .filter(|r| r["split"] == "test")
        .map(|r| r["checkpoint"].as_str().unwrap())
        .collect();
    assert_eq!(cks, ["sft", "rl"]);
    assert!(sum.iter().all(|r| r["pass_rate"].is_null()), "{sum:?}");
    // KernelBench rows per checkpoint and level: the curriculum's test problems with a native
    // launcher, `kernelbench_samples` (1 here) episodes each, compile-only here.
    let cur = rows(&p, "curriculum", "curriculum");
    let mut want: std::collections::BTreeMap<String, i64> = Default::default();
    for r in &cur {
        if r["source"] == "kernelbench" && r["split"] == "test" && !r["signature"].is_null() {
            *want
                .entry(format!("kernelbench/level{}", r["level"]))
                .or_default() += 1;
        }
    }
    assert!(
        !want.is_empty(),
        "no KernelBench test problem with a launcher"
    );
    for ck in ["sft", "rl"] {
        let got: std::collections::BTreeMap<String, i64> = sum
            .iter()
            .filter(|r| r["checkpoint"] == ck)
            .filter(|r| r["split"].as_str().unwrap().starts_with("kernelbench/"))
            .map(|r| {
                let split = r["split"].as_str().unwrap().to_string();
                (split, r["episodes"].as_i64().unwrap())
            })
            .collect();
        // Each level again by op coverage: its problems with an op no training task uses
        // (`novel_ops`) and the rest (`seen_ops`), the level's episodes between them; RL
        // practised no KernelBench problem, so there is no `kernelbench/practised` row.
        let level = |s: &str| !s.ends_with("_ops");
        let levels: std::collections::BTreeMap<String, i64> = got
            .iter()
            .filter(|(s, _)| level(s))
            .map(|(s, n)| (s.clone(), *n))
            .collect();
        assert_eq!(levels, want, "{ck}");
        for (split, n) in &want {
            let side = |k: &str| got.get(&format!("{split}/{k}_ops")).copied().unwrap_or(0);
            assert_eq!(side("novel") + side("seen"), *n, "{ck} {split}: {got:?}");
        }
    }
    assert!(
        sum.iter()
            .all(|r| r["split"] != "kernelbench/practised" && r["pairs"].is_null()),
        "{sum:?}"
    );
    // Where eval's time went: at most one candidate per turn (an answer without a code block
    // never reaches the harness), at least one if anything compiled; the harness phases inside
    // the harness seconds; decoding took time.
    let eps = rows(&p, "eval", "episodes");
    for r in &sum {
        if r["split"].as_str().unwrap().ends_with("_ops") {
            // An op-coverage row: its seconds are the level row's.
            assert_eq!(r["gen_seconds"].as_f64(), Some(0.0), "{r}");
            continue;
        }
        if let Some((split, _)) = r["split"].as_str().unwrap().split_once("/tier") {
            // A per-tier row counts its split's episodes of that tier; its seconds are the
            // split row's.
            let tier: i64 = r["split"].as_str().unwrap()[split.len() + 5..]
                .parse()
                .unwrap();
            let n = eps
                .iter()
                .filter(|e| e["checkpoint"] == r["checkpoint"] && e["split"] == split)
                .filter(|e| e["tier"].as_i64() == Some(tier))
                .count() as i64;
            assert_eq!(r["episodes"].as_i64(), Some(n), "{r}");
            continue;
        }
        let mine = eps
            .iter()
            .filter(|e| e["checkpoint"] == r["checkpoint"] && e["split"] == r["split"]);
        let turns: i64 = mine.clone().map(|e| e["turns"].as_i64().unwrap()).sum();
        let c = r["candidates"].as_i64().unwrap();
        assert!(c <= turns, "{c} candidates in {turns} turns: {r}");
        if mine.clone().any(|e| e["compiled"] == true) {
            assert!(c >= 1, "{r}");
        }
        let ph = |k: &str| r[format!("harness_{k}_seconds")].as_f64().unwrap();
        let phases = ph("compile") + ph("gpu").max(ph("sass"));
        assert!(
            phases <= r["harness_seconds"].as_f64().unwrap() + 1e-3,
            "{r}"
        );
        assert!(r["gen_seconds"].as_f64().unwrap() > 0.0, "{r}");
    }
    // One row per turn of every episode, keyed to the episodes table; the generator writes
    // turn 0, the optimizer the rest; every turn has the tester's feedback, and the first
    // turn's compile verdict is the episode's `first_compiled`.
    let et = rows(&p, "eval", "turns");
    for e in &eps {
        let mine: Vec<&Value> = et.iter().filter(|t| t["episode"] == e["episode"]).collect();
        assert_eq!(mine.len() as i64, e["turns"].as_i64().unwrap(), "{e}");
        for (k, t) in mine.iter().enumerate() {
            assert_eq!(t["turn"].as_u64(), Some(k as u64), "{t}");
            assert_eq!(t["checkpoint"], e["checkpoint"]);
            assert_eq!(t["task_id"], e["task_id"]);
            let role = if k == 0 { "generator" } else { "optimizer" };
            assert_eq!(t["role"], role, "{t}");
            assert!(!t["feedback"].as_str().unwrap().is_empty(), "{t}");
        }
        let first = mine[0];
        let c: Value = serde_json::from_str(first["components_json"].as_str().unwrap()).unwrap();
        assert_eq!(c["compiled"], e["first_compiled"], "{first}");
    }
}

#[test]
fn eval_report_exports_markdown_with_the_compile_only_comparison_and_plots() {
    let p = after_rl();
    let md = export_report(&p, "exported", &[]);
    assert!(
        md.contains("compile-only")
            && md.contains("**What a run without a GPU shows.**")
            && md.contains("KernelBench problems were only compiled.")
            && md.contains("| sft | test |")
            && md.contains("Tier 0: 2 steps, mean reward")
            && md.contains("First 1 steps: mean reward")
            // compile-only: no pass rate or fast_1 to compare, the compile rate only
            && md.contains("RL - SFT on `test` (")
            && md.contains("two-proportion Wald): compile ")
            && md.contains("not on new ones): compile ")
            && md.contains("(what to expect on new tasks like these): compile ")
            && md.contains(", single-turn compile ")
            && !md.contains(", pass "),
        "{md}"
    );
    assert!(
        std::fs::metadata(p.path("exported/eval/report/reward_curve.png"))
            .unwrap()
            .len()
            > 1000
    );
    // KernelBench per level for both checkpoints, compile-only here: no pass rate or fast_p.
    let kb = md
        .split("## KernelBench")
        .nth(1)
        .unwrap_or_else(|| panic!("no KernelBench section: {md}"));
    for ck in ["sft", "rl"] {
        assert!(kb.contains(&format!("| {ck} | level")), "{kb}");
    }
    assert!(kb.contains("| n/a | n/a | n/a | n/a | n/a |"), "{kb}");
    // ... and against torch.compile, as KernelBench reports fast_p.
    assert!(
        kb.contains(
            "| fast_1 vs compile | fast_1.5 vs compile | fast_2 vs compile | geomean vs compile |"
        ) && kb.contains("| n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a |"),
        "{kb}"
    );
    // The pipeline's pre-registered comparison leads, and comes as JSON for pooling draws.
    assert!(
        md.contains("## Pre-registered comparison")
            && md.contains("named in the pipeline before the run: **fast_naive_1_5**")
            && md.contains("Guardrail pass: "),
        "{md}"
    );
    let c: Value = serde_json::from_str(
        &std::fs::read_to_string(p.path("exported/eval/report/comparison.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(c["primary_metric"], "fast_naive_1_5", "{c}");
    assert_eq!(c["guardrail_metric"], "pass", "{c}");
    // Compile-only: no kernel ran, so neither fast_naive_1_5 nor pass was measured: null in
    // the JSON, "n/a" in the report, never a tie that looks measured.
    for k in [
        "holdout_primary",
        "holdout_guardrail",
        "rl_multi_minus_single_turn",
    ] {
        assert!(c[k].is_null(), "{k}: {c}");
    }
    assert!(
        md.contains("(+- one standard error clustered by task): n/a (not measured). Guardrail pass: n/a (not measured).")
            && md.contains("RL's multi-turn minus single-turn pass on the hold-out (best turn against first turn, same episodes): n/a (not measured)."),
        "{md}"
    );
    // A metric the report does not know is named, exit 2.
    fails_with(
        &p,
        &["eval"],
        "eval.primary_metric=\"speed\"",
        "primary_metric",
    );
}

#[test]
fn ppo_trains_a_critic_and_records_a_value_on_every_turn() {
    let p = after_sft();
    let ppo = [
        "rl-train.algorithm=\"ppo\"",
        "rl-train.group_size=1",
        "rl-train.warmup=2",
    ];
    run_ok(&p, &["rl-train"], &ppo);
    let pm = rows_with(&p, "rl-train", "metrics", &ppo);
    assert_eq!(pm.len(), 2);
    for r in &pm {
        assert_eq!(r["algorithm"], "ppo");
        assert_eq!(r["episodes"], 1);
        assert!(r["value_loss"].as_f64().unwrap() >= 0.0, "{r}");
    }
    let pt = rows_with(&p, "rl-train", "turns", &ppo);
    assert!(pt.iter().all(|r| r["value"].is_f64()), "{pt:?}");
}

#[test]
fn the_frozen_control_samples_what_the_policy_sampled_at_step_one() {
    // The SFT references on each step's tasks with its seeds. Step 1 samples both from
    // identical weights, so their rewards agree exactly; the policy's own episodes are those
    // of the run without the control.
    let p = after_rl();
    let m = rows(&p, "rl-train", "metrics");
    let ctl = ["rl-train.control=true"];
    run_ok(&p, &["rl-train", "eval"], &ctl);
    let cm = rows_with(&p, "rl-train", "metrics", &ctl);
    assert_eq!(cm.len(), m.len());
    for (c, r) in cm.iter().zip(&m) {
        assert_eq!(c["mean_reward"], r["mean_reward"], "{c}");
        assert!(c["control_reward"].is_f64(), "{c}");
        assert!(c["control_compile_rate"].is_f64(), "{c}");
    }
    assert_eq!(cm[0]["control_reward"], cm[0]["mean_reward"], "{}", cm[0]);
    let md = export_report(&p, "exported-control", &ctl);
    assert!(
        md.contains("RL minus the frozen SFT policy") && md.contains("1: +0.000"),
        "{md}"
    );
}

#[test]
fn own_generator_credit_follows_the_generators_rewards_and_epochs_multiply_the_steps() {
    // Step 1 samples what the default run sampled (no update yet) and steps twice as often
    // with two passes; each step's generator advantages follow the generator's own rewards.
    let p = after_rl();
    let m = rows(&p, "rl-train", "metrics");
    let own = ["rl-train.generator_credit=\"own\"", "rl-train.epochs=2"];
    run_ok(&p, &["rl-train"], &own);
    let om = rows_with(&p, "rl-train", "metrics", &own);
    assert_eq!(om[0]["mean_reward"], m[0]["mean_reward"], "{}", om[0]);
    let one = m[0]["update_steps"].as_i64().unwrap();
    assert!(one >= 1, "{}", m[0]);
    assert_eq!(om[0]["update_steps"].as_i64(), Some(2 * one), "{}", om[0]);
    let ot = rows_with(&p, "rl-train", "turns", &own);
    for r in &om {
        let g: Vec<(f64, f64)> = ot
            .iter()
            .filter(|x| x["step"] == r["step"] && x["role"] == "generator")
            .map(|x| {
                (
                    x["reward"].as_f64().unwrap(),
                    x["advantage"].as_f64().unwrap(),
                )
            })
            .collect();
        assert_eq!(g.len(), 2, "one group of two: {g:?}");
        let differ = (g[0].0 - g[1].0).abs() > 1e-9;
        assert_eq!(
            r["signal_groups"].as_f64(),
            Some(if differ { 1.0 } else { 0.0 })
        );
        let want = (g[0].0 - g[1].0).signum();
        assert!(
            if differ {
                (g[0].1 - g[1].1).signum() == want
            } else {
                g[0].1 == 0.0 && g[1].1 == 0.0
            },
            "advantages follow the generator's own rewards: {g:?}"
        );
    }
}

#[test]
fn the_fresh_task_pool_practises_a_new_generated_family_each_step() {
    let p = after_sft();
    let fresh = ["rl-train.task_pool=\"fresh\""];
    run_ok(&p, &["rl-train"], &fresh);
    let ft = rows_with(&p, "rl-train", "turns", &fresh);
    let ids = |step: i64| -> Vec<String> {
        let s: std::collections::BTreeSet<String> = ft
            .iter()
            .filter(|x| x["step"] == step)
            .map(|x| x["task_id"].as_str().unwrap().to_string())
            .collect();
        s.into_iter().collect()
    };
    assert_eq!(ids(1), ["fresh_ew_000"]);
    assert_eq!(ids(2), ["fresh_ew_001"]);
}

#[test]
fn ppo_ptx_records_its_sft_loss_and_ptx_coef_zero_turns_it_off() {
    // On by default: each update also fits the agents' SFT conversations, its cross-entropy in
    // `metrics`; `ptx_coef = 0` turns it off (null), and step 1 samples what the default run
    // sampled (no update yet).
    let p = after_rl();
    let m = rows(&p, "rl-train", "metrics");
    assert!(m[0]["update_steps"].as_i64().unwrap() >= 1, "{}", m[0]);
    for r in &m {
        for (loss, steps) in [
            ("ptx_loss", "update_steps"),
            ("optimizer_ptx_loss", "optimizer_update_steps"),
        ] {
            let l = r[loss].as_f64().unwrap();
            if r[steps].as_i64().unwrap() > 0 {
                assert!(l > 0.0 && l.is_finite(), "{loss}: {r}");
            }
        }
    }
    let off = ["rl-train.ptx_coef=0.0"];
    run_ok(&p, &["rl-train"], &off);
    let xm = rows_with(&p, "rl-train", "metrics", &off);
    assert_eq!(xm[0]["mean_reward"], m[0]["mean_reward"], "{}", xm[0]);
    assert!(xm.iter().all(|r| r["ptx_loss"].is_null()), "{xm:?}");
}

#[test]
fn rl_train_practises_the_curriculums_kernelbench_train_problems_by_tier_with_kernelbench_share() {
    // Every task a KernelBench problem: each step's group is one `train` problem of the
    // curriculum with a native launcher, of an open tier, its turns built against the launcher
    // (compile-only on the CPU).
    let p = after_rl();
    let kb = ["rl-train.kernelbench_share=1.0"];
    let o = p.run(&["run", "rl-train", "--set", kb[0]]);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    let said = common::stderr(&o);
    let cur = rows(&p, "curriculum", "curriculum");
    let train: std::collections::BTreeMap<String, i64> = cur
        .iter()
        .filter(|r| {
            r["source"] == "kernelbench" && r["split"] == "train" && !r["signature"].is_null()
        })
        .map(|r| {
            (
                r["problem_id"].as_str().unwrap().to_string(),
                r["tier"].as_i64().unwrap(),
            )
        })
        .collect();
    assert!(!train.is_empty());
    let turns = rows_with(&p, "rl-train", "turns", &kb);
    let metrics = rows_with(&p, "rl-train", "metrics", &kb);
    assert_eq!(metrics.len(), 2);
    // Plain progress (stderr is not a terminal): under the steps, the episodes and the
    // candidates judged.
    let episodes: std::collections::BTreeSet<(i64, i64)> = turns
        .iter()
        .map(|t| (t["step"].as_i64().unwrap(), t["episode"].as_i64().unwrap()))
        .collect();
    for line in [
        "progress rl-train steps: done, 2 items".to_string(),
        format!("progress rl-train episodes: done, {} items", episodes.len()),
        "progress rl-train candidates judged: done, ".to_string(),
    ] {
        assert!(said.contains(&line), "{line}\n{said}");
    }
    for t in &turns {
        let id = t["task_id"].as_str().unwrap();
        let tier = train
            .get(id)
            .unwrap_or_else(|| panic!("{id} is no train problem"));
        assert_eq!(t["tier"].as_i64(), Some(*tier), "{t}");
        let open = metrics[t["step"].as_i64().unwrap() as usize - 1]["tier"]
            .as_i64()
            .unwrap();
        assert!(*tier <= open, "{t}");
        assert_eq!(
            t["components_json"]
                .as_str()
                .map(|c| c.contains("compile-only")),
            Some(true)
        );
    }
    // group_size 2: each step's first turns are two episodes of one problem.
    let firsts: Vec<&Value> = turns.iter().filter(|t| t["turn"] == 0).collect();
    assert_eq!(firsts.len(), 4);
    assert_eq!(firsts[0]["task_id"], firsts[1]["task_id"]);
    // eval runs both checkpoints on the problems RL practised (`kernelbench_samples`, 1 here,
    // episodes each) and gives RL minus the frozen control paired by problem.
    let practised: std::collections::BTreeSet<&str> = turns
        .iter()
        .map(|t| t["task_id"].as_str().unwrap())
        .collect();
    let md = export_report(&p, "exported_kb_share", &kb);
    let sum = rows_with(&p, "eval", "summary", &kb);
    let at = |ck: &str| {
        sum.iter()
            .find(|r| r["checkpoint"] == ck && r["split"] == "kernelbench/practised")
            .unwrap_or_else(|| panic!("no {ck} row on the practised problems: {sum:?}"))
    };
    for ck in ["sft", "rl"] {
        assert_eq!(at(ck)["episodes"].as_u64(), Some(practised.len() as u64));
    }
    let d = at("rl_minus_sft");
    assert_eq!(d["pairs"].as_u64(), Some(practised.len() as u64), "{d}");
    let reward = |ck: &str| at(ck)["mean_reward"].as_f64().unwrap();
    // One episode per problem: the mean per-problem difference is the difference of means.
    assert!(
        (d["mean_reward"].as_f64().unwrap() - (reward("rl") - reward("sft"))).abs() < 1e-9,
        "{d}"
    );
    // Compile-only: no pass rate.
    assert!(
        d["pass_rate"].is_null() && d["pass_rate_se"].is_null(),
        "{d}"
    );
    let n = practised.len();
    assert!(
        md.contains(&format!(
            "On the KernelBench `train` problems RL practised (`rl-train.kernelbench_share`; {n} problems"
        )) && md.contains(&format!("n = {n}, df = {}", n - 1)),
        "{md}"
    );
    // The share's absence is the run without it: its key and its rows are unchanged.
    let plain = rows(&p, "rl-train", "metrics");
    assert_eq!(plain.len(), 2);
    assert!(
        rows(&p, "rl-train", "turns")
            .iter()
            .all(|t| !t["task_id"].as_str().unwrap().starts_with("kb/"))
    );
}

#[test]
fn optimize_runs_the_rl_agents_on_a_new_problem_and_says_a_cpu_verifies_nothing() {
    // A KernelBench-format file outside KernelBench: its launcher and tests are derived, the RL
    // agents write and revise kernels for it, and without a GPU nothing is verified (exit 1).
    let p = after_rl();
    let out = p.path("optimized");
    let src = p.path("examples/optimize/level1/0_swish.py");
    let optimize = |problem: &str| {
        p.run(&[
            "optimize",
            problem,
            "--out",
            out.to_str().unwrap(),
            "--samples",
            "2",
            "--turns",
            "2",
            "--json",
        ])
    };
    let o = optimize(src.to_str().unwrap());
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["problem_id"], "kb/L1/0_swish", "{v}");
    assert_eq!(
        (v["mode"].as_str(), v["episodes"].as_i64()),
        (Some("compile-only"), Some(2))
    );
    assert_eq!(v["speedup_vs_torch"], Value::Null);
    match v["status"].as_str() {
        Some("compiled") => {
            let dir = out.join("0_swish");
            let cu = std::fs::read_to_string(dir.join("0_swish.cu")).unwrap();
            assert!(cu.contains("launch"), "{cu}");
            let wrapper = std::fs::read_to_string(dir.join("0_swish_model_new.py")).unwrap();
            assert!(wrapper.contains("NOT verified") && wrapper.contains("class ModelNew"));
        }
        Some("none") => assert_eq!(v["dir"], Value::Null),
        s => panic!("status {s:?}"),
    }
    // Its episodes were judged against the launcher kb-specs derived for the file.
    let code = std::fs::read(&src).unwrap();
    let dir = p
        .store()
        .join("optimize-problems")
        .join(&blake3::hash(&code).to_hex()[..16]);
    let set = format!("optimize-problem.path=\"{}\"", dir.display());
    let sets = [set.as_str(), "optimize.samples=2", "optimize.max_turns=2"];
    let specs = rows_with(&p, "optimize-specs", "kb_specs", &sets);
    assert_eq!(specs.len(), 1);
    assert!(
        specs[0]["signature"].as_str().unwrap().contains("launch("),
        "{}",
        specs[0]
    );
    let turns = rows_with(&p, "optimize", "turns", &sets);
    assert!(!turns.is_empty() && turns.len() <= 4);
    assert!(turns.iter().all(|t| t["task_id"] == "kb/L1/0_swish"));
    // `serve`'s POST /v1/optimize answers the same problem as the CLI did (the node is cached
    // now), with the kept kernel's files inline and nothing written outside the store.
    let server = common::server::Server::start(&p, &[]);
    let body = serde_json::json!({
        "problem": std::fs::read_to_string(&src).unwrap(),
        "name": "swish", "samples": 2, "turns": 2,
    });
    let r = server.call("POST", "/v1/optimize", None, Some(&body.to_string()));
    assert_eq!(r.status, 200, "{}", r.body);
    let a = r.json();
    for k in ["problem_id", "status", "mode", "episodes", "candidates"] {
        assert_eq!(a[k], v[k], "{k}: {a}");
    }
    assert_eq!(a["dir"], Value::Null);
    assert_eq!(
        a["code"].is_string(),
        v["status"] != "none",
        "the kept kernel's source, when one was kept: {a}"
    );
    drop(server);
    // A KernelBench problem by id; a file that is not a problem is named (exit 2).
    let o = optimize("kb/L1/19_ReLU");
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["problem_id"], "kb/L1/19_ReLU");
    let bad = p.path("not_a_problem.py");
    std::fs::write(&bad, "print('hello')\n").unwrap();
    let o = optimize(bad.to_str().unwrap());
    assert_eq!(o.status.code(), Some(2));
    assert!(common::stderr(&o).contains("not_a_problem.py: not a KernelBench-format problem"));
}

#[test]
fn bad_rl_train_params_are_named_with_exit_2() {
    let p = cpu_project();
    for (set, says) in [
        ("rl-train.ptx_coef=-1.0", "ptx_coef must be a number >= 0"),
        (
            "rl-train.generator_credit=\"mine\"",
            "expected `episode` or `own`",
        ),
        ("rl-train.algorithm=\"a2c\"", "expected `grpo` or `ppo`"),
        ("rl-train.target_kl=0.0", "target_kl must be a positive"),
        (
            "rl-train.kernelbench_share=1.5",
            "kernelbench_share must be in [0, 1]",
        ),
    ] {
        fails_with(&p, &["rl-train"], set, says);
    }
}

#[test]
fn bad_model_config_is_named() {
    let p = Project::new();
    let cfg = p.path("configs/model/tiny.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("lr = 3e-3", "lr = 3e-3\nlearning_rate = 1"),
    )
    .unwrap();
    let o = p.run(&["run", "pretrain"]);
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
    // The run summary (stdout) carries the node's error.
    let e = format!("{}{}", stdout(&o), common::stderr(&o));
    assert!(
        e.contains("configs/model/tiny.toml: field `pretrain`")
            && e.contains("unknown field `learning_rate`")
            && !e.contains("job.json"),
        "{e}"
    );
    let o = p.run(&["run", "pretrain", "--set", "pretrain.model=\"nope\""]);
    assert_eq!(o.status.code(), Some(2));
    let e = format!("{}{}", stdout(&o), common::stderr(&o));
    assert!(e.contains("configs/model/nope.toml: file not found"), "{e}");
}

/// `scripts/rl_holdout_summary.py` (the RL - SFT table of docs/experiments.md over every committed
/// GPU run) on result files written here: it finds eval summaries at any depth, leaves out runs
/// below
/// `--min-episodes` and the frozen-policy controls, and pools the differences (mean and
/// standard error over runs, hand-computed below).
#[test]
fn rl_holdout_summary_pools_committed_runs() {
    let dir = tempfile::tempdir().unwrap();
    let row = |ck: &str, n: u32, pass: f64, compile: f64| {
        serde_json::json!({"checkpoint": ck, "split": "test", "episodes": n,
            "pass_rate": pass, "compile_rate": compile, "single_turn_pass_rate": pass / 2.0,
            "single_turn_compile_rate": compile, "fast_1": pass, "geomean_speedup_vs_naive": 1.0})
    };
    // RL's metrics with the frozen control: step 1 is left out (identical weights sample alike).
    let steps = serde_json::json!([
        {"step": 1, "mean_reward": 0.2, "control_reward": 0.1},
        {"step": 2, "mean_reward": 0.3, "control_reward": 0.25},
        {"step": 3, "mean_reward": 0.2, "control_reward": 0.25}]);
    let a = serde_json::json!({"run_1": {"eval": [row("sft", 136, 0.5, 0.8), row("rl", 136, 0.6, 0.9)],
        "rl_steps": steps,
        // The same checkpoints' smaller eval, measured again above: listed, not pooled.
        "superseded_eval_summary": [row("sft", 136, 0.5, 0.8), row("rl", 136, 0.1, 0.1)],
        // A control: the frozen SFT policy, identical by construction.
        "variants": {"ctl (rl-train.lr=0.0)": {"eval": [row("sft", 136, 0.5, 0.8), row("rl", 136, 0.5, 0.8)]}}}});
    let b = serde_json::json!({"runs": [{"eval_summary": [
        row("sft", 272, 0.4, 0.9), row("rl", 272, 0.3, 0.85),
        // The train split is not the hold-out.
        {"checkpoint": "rl", "split": "train", "episodes": 9, "pass_rate": 1.0, "compile_rate": 1.0}]},
        // Too few episodes to count.
        {"eval_summary": [row("sft", 52, 0.1, 0.5), row("rl", 52, 0.9, 0.9)]},
        // Without the control (null): not a control run.
        {"rl_steps": [{"step": 2, "mean_reward": 0.9, "control_reward": null}]},
        {"rl_steps": [{"step": 2, "mean_reward": 0.4, "control_reward": 0.3}]}]});
    std::fs::write(dir.path().join("a.json"), a.to_string()).unwrap();
    std::fs::write(dir.path().join("b.json"), b.to_string()).unwrap();
    std::fs::write(dir.path().join("notes.md"), "not a result").unwrap();
    let script = repo_root().join("scripts/rl_holdout_summary.py");
    let o = std::process::Command::new("python3")
        .arg(&script)
        .arg("--results")
        .arg(dir.path())
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["runs"].as_array().unwrap().len(), 5, "{v}");
    let close = |x: &Value, want: f64| (x.as_f64().unwrap() - want).abs() < 1e-9;
    // Pass differences +0.1 and -0.1: mean 0, sd 0.1414, se 0.1.
    let pass = &v["pooled"]["pass_rate"];
    assert_eq!(pass["runs"], 2, "{v}");
    assert!(
        close(&pass["mean"], 0.0) && close(&pass["se"], 0.1),
        "{pass}"
    );
    assert_eq!(
        (pass["above"].clone(), pass["below"].clone()),
        (1.into(), 1.into())
    );
    // Compile differences +0.1 and -0.05: mean 0.025, sd 0.10607, se 0.075.
    let compile = &v["pooled"]["compile_rate"];
    assert!(
        close(&compile["mean"], 0.025) && close(&compile["se"], 0.075),
        "{compile}"
    );
    assert_eq!(
        v["runs_above_sft_in_pass_and_compile"],
        serde_json::json!(["a.json:run_1"])
    );
    // Multi-turn minus single-turn pass of RL: 0.6 - 0.3 and 0.3 - 0.15.
    assert!(close(&v["multi_minus_single_turn_pass_min"], 0.15), "{v}");
    // RL - control per run over steps 2 on: (+0.05, -0.05) -> 0 +- 0.05, and +0.1 (one step,
    // no s.e.); over the two runs 0.05 +- 0.05, one above its control.
    let runs = v["control_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{v}");
    assert!(close(&runs[0]["rl_minus_control"], 0.0) && close(&runs[0]["se_over_steps"], 0.05));
    assert!(close(&runs[1]["rl_minus_control"], 0.1) && runs[1]["se_over_steps"].is_null());
    let c = &v["rl_minus_control"];
    assert!(close(&c["mean"], 0.05) && close(&c["se"], 0.05), "{c}");
    assert_eq!(
        (c["runs"].clone(), c["above"].clone()),
        (2.into(), 1.into())
    );
}

#[test]
fn bench_decode_compares_the_paths_in_one_run_and_a_missing_model_config_is_named() {
    let p = Project::new();
    // `bench decode` of the tiny model on the CPU, without transformers: its JSON.
    let decode = |extra: &[&str]| -> Value {
        let mut args = vec![
            "bench",
            "decode",
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--reps",
            "1",
            "--no-transformers",
        ];
        args.extend_from_slice(extra);
        let o = p.run(&args);
        assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let v = decode(&[
        "--batches",
        "1,3",
        "--prompt-len",
        "12",
        "--gen-tokens",
        "20",
    ]);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        for k in [
            "tokens_per_s",
            "baseline_tokens_per_s",
            "prefill_tokens_per_s",
        ] {
            assert!(r[k].as_f64().is_some_and(|x| x > 0.0), "{k}: {r}");
        }
        assert!(r["transformers_tokens_per_s"].is_null(), "{r}");
    }
    // On the CPU in float32 the three paths decode the same tokens (20 new tokens: more than
    // one read-back interval), and sampled log-probabilities are the training path's.
    for c in v["ours"]["checks"].as_array().unwrap() {
        let b = c["batch"].as_u64().unwrap();
        assert_eq!(c["greedy_rows_equal_static"].as_u64(), Some(b), "{c}");
        assert_eq!(c["greedy_rows_equal_dynamic"].as_u64(), Some(b), "{c}");
        assert!(
            c["sampled_max_log_prob_error_vs_training"]
                .as_f64()
                .unwrap()
                < 1e-4,
            "{c}"
        );
    }
    // One path alone: only its records and checks.
    let v = decode(&[
        "--batches",
        "2",
        "--prompt-len",
        "8",
        "--gen-tokens",
        "4",
        "--paths",
        "graphs",
    ]);
    let paths: Vec<&str> = v["ours"]["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["graphs"]);
    assert!(
        v["rows"][0]["tokens_per_s"]
            .as_f64()
            .is_some_and(|x| x > 0.0)
    );
    assert!(v["rows"][0]["baseline_tokens_per_s"].is_null());
    assert!(v["ours"]["checks"][0]["greedy_rows_equal_dynamic"].is_null());
    let o = p.run(&["bench", "decode", "--model", "tiny", "--paths", "fast"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        common::stderr(&o).contains("`fast`"),
        "{}",
        common::stderr(&o)
    );
    let o = p.run(&["bench", "decode", "--model", "nope", "--device", "cpu"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        common::stderr(&o).contains("configs/model/nope.toml"),
        "{}",
        common::stderr(&o)
    );
}

/// The metrics columns that are not wall-clock measurements (these must repeat exactly).
const DETERMINED: [&str; 14] = [
    "step",
    "tier",
    "episodes",
    "mean_reward",
    "reward_std",
    "compile_rate",
    "first_turn_compile_rate",
    "turns_used",
    "kl",
    "entropy",
    "optimizer_kl",
    "signal_groups",
    "update_steps",
    "ptx_loss",
];

fn sets(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn determined(rows: &[Value]) -> Vec<Vec<Value>> {
    rows.iter()
        .map(|r| DETERMINED.iter().map(|k| r[*k].clone()).collect())
        .collect()
}

/// `run rl-train --set ...` stopped by `signal` when it pauses at `rl-train:<point>`.
fn stopped_at(p: &Project, sets: &[String], point: &str, signal: i32) -> (String, i32) {
    let mut args = vec!["run", "rl-train"];
    for s in sets {
        args.extend(["--set", s.as_str()]);
    }
    common::stop_at_fault(p, &args, &format!("rl-train:{point}"), signal)
}

#[test]
fn a_killed_or_interrupted_rl_run_resumes_from_its_last_saved_step_and_a_longer_run_continues_a_shorter_one()
 {
    let p = after_sft();
    let with = |steps: usize, every: usize| -> Vec<String> {
        vec![
            "rl-train.seed=7".into(),
            format!("rl-train.steps={steps}"),
            format!("rl-train.checkpoint_every={every}"),
        ]
    };
    // The straight run: nothing saved, nothing read.
    let straight = with(4, 0);
    run_ok(&p, &["rl-train"], &sets(&straight));
    let sm = rows_with(&p, "rl-train", "metrics", &sets(&straight));
    assert_eq!(sm.len(), 4);
    // Two steps that save each step: the straight run's first two.
    let short = with(2, 1);
    run_ok(&p, &["rl-train"], &sets(&short));
    let km = rows_with(&p, "rl-train", "metrics", &sets(&short));
    assert_eq!(determined(&km), determined(&sm[..2]));
    // Four steps saving only at the end: continues the two-step run; SIGTERM as step 3 starts
    // ends it after that step, which it saves although no save was due, and says so (130).
    let (said, code) = stopped_at(&p, &with(4, 100), "before-step", libc::SIGTERM);
    assert_eq!(code, 130, "{said}");
    assert!(
        said.contains("resuming from saved step 2 of 4")
            && said.contains("stopped after step 3 of 4; its progress is saved")
            && said.contains("interrupted"),
        "{said}"
    );
    // The step it ran is in its live metrics, written as the step ended.
    let dir = said
        .lines()
        .find_map(|l| l.split("metrics as they happen: ").nth(1))
        .and_then(|r| r.split(" (").next())
        .unwrap_or_else(|| panic!("no metrics folder named:\n{said}"));
    let live = std::fs::read_to_string(format!("{dir}/metrics.jsonl")).unwrap();
    let live: Vec<Value> = live
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0]["step"], 3);
    assert!(live[0]["mean_reward"].is_number(), "{}", live[0]);
    // Again, saving every step: continues from step 3 and is killed right after saving its
    // last step, before anything is published.
    let long = with(4, 1);
    let (said, code) = stopped_at(&p, &long, "after-checkpoint", libc::SIGKILL);
    assert_eq!(code, 128 + libc::SIGKILL, "{said}");
    assert!(said.contains("resuming from saved step 3 of 4"), "{said}");
    // Run again: every step is saved, so it only publishes; every row and the final weights
    // as in the straight run (the AdamW moments and step counts came back too, or step 4's
    // update would differ).
    let mut args = vec!["run", "rl-train"];
    for s in &long {
        args.extend(["--set", s.as_str()]);
    }
    let o = p.run(&args);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    assert!(
        common::stderr(&o).contains("resuming from saved step 4 of 4"),
        "{}",
        common::stderr(&o)
    );
    let lm = rows_with(&p, "rl-train", "metrics", &sets(&long));
    assert_eq!(determined(&lm), determined(&sm));
    let turns = |v: &[String]| -> Vec<(Value, Value, Value)> {
        rows_with(&p, "rl-train", "turns", &sets(v))
            .into_iter()
            .map(|r| (r["step"].clone(), r["text"].clone(), r["reward"].clone()))
            .collect()
    };
    assert_eq!(turns(&long), turns(&straight));
    for agent in ["generator", "optimizer"] {
        let digest = |v: &[String]| -> Vec<Value> {
            rows_with(&p, "rl-train", agent, &sets(v))
                .into_iter()
                .filter(|r| r["file"] == "model.safetensors")
                .map(|r| r["digest"].clone())
                .collect()
        };
        assert_eq!(digest(&long), digest(&straight), "{agent}");
        assert_eq!(digest(&long).len(), 1, "{agent}");
    }
}

#[test]
fn an_sft_seed_or_step_cap_overrides_the_model_file_and_is_not_a_tokenizer_parameter() {
    let p = after_sft();
    let run = |sets: &[&str]| -> (String, String) {
        let mut args = vec!["run", "sft-train", "--json"];
        for s in sets {
            args.extend(["--set", s]);
        }
        let o = p.run(&args);
        assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
        let m = common::records(&o);
        (
            common::status_of(&m, "sft-train"),
            common::out_hash(&m, "sft-train", "checkpoint"),
        )
    };
    let (status, base) = run(&[]);
    assert_eq!(status, "cached");
    let (status, drawn) = run(&["sft-train.seed=7"]);
    assert_eq!(status, "ran");
    assert_ne!(drawn, base, "another example order gives other weights");
    assert_eq!(run(&["sft-train.seed=7"]), ("cached".to_string(), drawn));
    // A step cap in place of the model file's: a shorter run, other weights.
    let (status, capped) = run(&["sft-train.max_steps=2"]);
    assert_eq!(status, "ran");
    assert_ne!(capped, base, "two steps are not the file's steps");
    fails_with(
        &p,
        &["tokenizer"],
        "tokenizer.seed=1",
        "seed, lr, epochs and max_steps are `pretrain` and `sft-train` parameters",
    );
    fails_with(
        &p,
        &["sft-train"],
        "sft-train.max_steps=0",
        "max_steps must be at least 1",
    );
}

/// A Hugging Face checkpoint directory made by `tests/python/make_checkpoint.py` (a tiny random
/// Qwen2 in sharded safetensors, a ChatML tokenizer, `template`'s chat template) at `rel` in the
/// project.
fn hf_checkpoint(p: &Project, python: &str, rel: &str, template: &str) {
    let o = std::process::Command::new(python)
        .arg(repo_root().join("tests/python/make_checkpoint.py"))
        .arg(p.path(rel))
        .args(["--template", template])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::stderr(&o));
}

#[test]
fn sft_train_fine_tunes_a_hugging_face_checkpoint_directory_without_tokenizer_or_pretrain() {
    let Some(python) = common::python() else {
        eprintln!("SKIPPED: a checkpoint made by transformers (no python)");
        return;
    };
    let p = cpu_project();
    hf_checkpoint(&p, &python, "models/qwen-tiny", "system-default");
    let sets = |dir: &str| -> Vec<String> {
        vec![
            format!("sft-train.model={dir}"),
            "sft-train.settings=tiny".into(),
            "sft-train.max_steps=3".into(),
        ]
    };
    // `--json` for records; errors are read from a plain run's summary (stdout) and stderr.
    let run_as = |json: bool, sets: &[String]| -> std::process::Output {
        let mut args = vec!["run", "sft-train"];
        if json {
            args.push("--json");
        }
        for s in sets {
            args.extend(["--set", s.as_str()]);
        }
        p.run(&args)
    };
    let run = |sets: &[String]| run_as(true, sets);
    let fails = |sets: &[String], says: &[&str]| {
        let o = run_as(false, sets);
        let err = format!("{}{}", stdout(&o), common::stderr(&o));
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(says.iter().all(|s| err.contains(s)), "{says:?}: {err}");
    };
    let here = sets("./models/qwen-tiny");
    let o = run(&here);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    let m = common::records(&o);
    assert_eq!(common::status_of(&m, "sft-train"), "ran");
    for skipped in ["tokenizer", "pretrain"] {
        assert!(!m.contains_key(skipped), "{skipped} ran: {:?}", m.keys());
    }
    let hash = common::out_hash(&m, "sft-train", "checkpoint");
    let set_refs: Vec<&str> = here.iter().map(String::as_str).collect();
    let metrics = rows_with(&p, "sft-train", "metrics", &set_refs);
    assert_eq!(metrics.len(), 3);
    assert!(
        metrics
            .iter()
            .all(|r| r["loss"].as_f64().unwrap().is_finite())
    );
    // The fine-tuned checkpoint keeps the directory's tokenizer and chat template, and opens in
    // transformers rendering the pipeline's conversation as the original does.
    let out = p.path("hf-ft");
    let mut args = vec!["export", "sft-train", "--to", out.to_str().unwrap()];
    for s in &set_refs {
        args.extend(["--set", s]);
    }
    let o = p.run(&args);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    let ft = out.join("sft-train/checkpoint");
    let read = |d: &std::path::Path, f: &str| std::fs::read_to_string(d.join(f)).unwrap();
    let base = p.path("models/qwen-tiny");
    assert_eq!(read(&ft, "tokenizer.json"), read(&base, "tokenizer.json"));
    let cfg = |d: &std::path::Path| -> Value {
        serde_json::from_str(&read(d, "tokenizer_config.json")).unwrap()
    };
    assert_eq!(cfg(&ft), cfg(&base));
    let render = |d: &std::path::Path| -> Value {
        let o = std::process::Command::new(&python)
            .arg(repo_root().join("tests/python/check_chat_template.py"))
            .arg(d)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", common::stderr(&o));
        serde_json::from_str(stdout(&o).trim()).unwrap()
    };
    let (a, b) = (render(&base), render(&ft));
    assert_eq!(a["text"], b["text"]);
    assert!(
        a["text"]
            .as_str()
            .unwrap()
            .starts_with("<|im_start|>system\nYou write CUDA")
    );
    // The export is copies: transformers' `save_pretrained` over it, then editing every
    // exported file, leaves the store as it was.
    use std::os::unix::fs::MetadataExt;
    for e in std::fs::read_dir(&ft).unwrap().flatten() {
        assert_eq!(e.metadata().unwrap().nlink(), 1, "{:?} is a link", e.path());
    }
    let o = std::process::Command::new(&python)
        .arg(repo_root().join("tests/python/save_pretrained_over.py"))
        .arg(&ft)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert!(read(&ft, "generation_config.json").contains("\"top_k\": 7"));
    for e in std::fs::read_dir(&ft).unwrap().flatten() {
        let mut bytes = std::fs::read(e.path()).unwrap();
        bytes.extend_from_slice(b"\n");
        std::fs::write(e.path(), bytes).unwrap();
    }
    let mut args = vec!["status", "sft-train", "--verify", "--exit-code"];
    for s in &set_refs {
        args.extend(["--set", s]);
    }
    let o = p.run(&args);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    assert!(
        common::stderr(&o).contains("verify: 0 stored file(s) changed"),
        "{}",
        common::stderr(&o)
    );
    // Where the directory lies is not in the key; what it holds is.
    std::fs::rename(&base, p.path("models/moved")).unwrap();
    let o = run(&sets("./models/moved"));
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    let m = common::records(&o);
    assert_eq!(common::status_of(&m, "sft-train"), "cached");
    assert_eq!(common::out_hash(&m, "sft-train", "checkpoint"), hash);
    let moved = p.path("models/moved");
    let text = read(&moved, "generation_config.json").replace('{', "{\n  \"top_k\": 5,");
    std::fs::write(moved.join("generation_config.json"), text).unwrap();
    let o = run(&sets("./models/moved"));
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    assert_eq!(common::status_of(&common::records(&o), "sft-train"), "ran");
    // A template that is not ChatML, a missing directory or file, and no settings are named.
    hf_checkpoint(&p, &python, "models/inst", "inst");
    fails(
        &sets("./models/inst"),
        &["tokenizer_config.json", "not ChatML", "[INST]"],
    );
    fails(
        &sets("./models/none"),
        &["models/none", "no such checkpoint directory"],
    );
    std::fs::remove_file(p.path("models/inst/tokenizer.json")).unwrap();
    fails(
        &sets("./models/inst"),
        &["models/inst/tokenizer.json", "missing"],
    );
    fails_with(
        &p,
        &["sft-train"],
        "sft-train.model=./models/moved",
        "settings = ",
    );
    fails_with(
        &p,
        &["pretrain"],
        "pretrain.model=./models/moved",
        "a checkpoint directory is a `sft-train` model",
    );
}

/// `cudarl-pipe export <stage> --to <p>/<dir>` with `sets`; the export folder.
fn export_with(p: &Project, stage: &str, dir: &str, sets: &[&str]) -> std::path::PathBuf {
    let out = p.path(dir);
    let o = run_sets(p, &["export", stage, "--to", out.to_str().unwrap()], sets);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    out
}

/// `tests/python/check_peft_adapter.py` on a base checkpoint, PEFT adapters and the merged
/// checkpoint: its JSON answer (`peft_vs_merged`, `adapter_effect`, `lora_tensors`, `r`,
/// `lora_alpha`).
fn peft_check(
    python: &str,
    base: &std::path::Path,
    adapter: &std::path::Path,
    merged: &std::path::Path,
) -> Value {
    let o = std::process::Command::new(python)
        .arg(repo_root().join("tests/python/check_peft_adapter.py"))
        .args([base, adapter, merged])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::stderr(&o));
    serde_json::from_str(stdout(&o).trim()).unwrap()
}

/// `run <stage>` with `<stage>.lora.r=0` exits 2 naming the field.
fn lora_rank_zero_is_refused(p: &Project, stage: &str) {
    let (r, a) = (format!("{stage}.lora.r=0"), format!("{stage}.lora.alpha=8"));
    let o = run_sets(p, &["run", stage], &[r.as_str(), a.as_str()]);
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
    assert!(common::stderr(&o).contains("lora.r must be at least 1"));
}

#[test]
fn sft_train_with_lora_saves_peft_adapters_that_peft_applies_as_the_merged_checkpoint() {
    let Some(python) = common::python() else {
        eprintln!("SKIPPED: a checkpoint made by transformers and PEFT (no python)");
        return;
    };
    let p = cpu_project();
    hf_checkpoint(&p, &python, "models/qwen-tiny", "system-default");
    // The test checkpoint's tokenizer spends a token on about every character: room for a
    // task's module and its kernel, or the kernel is cut off and nothing trains.
    let tiny = p.path("configs/model/tiny.toml");
    let text = std::fs::read_to_string(&tiny).unwrap();
    assert!(
        text.contains("max_len = 768"),
        "configs/model/tiny.toml moved"
    );
    std::fs::write(&tiny, text.replace("max_len = 768", "max_len = 4096")).unwrap();
    let sets = [
        "sft-train.model=./models/qwen-tiny",
        "sft-train.settings=tiny",
        "sft-train.max_steps=4",
        "sft-train.lr=0.01",
        "sft-train.lora.r=4",
        "sft-train.lora.alpha=8",
    ];
    let o = run_sets(&p, &["run", "sft-train", "--json"], &sets);
    let said = format!("{}{}", stdout(&o), common::stderr(&o));
    assert_eq!(o.status.code(), Some(0), "{said}");
    let out = export_with(&p, "sft-train", "lora-export", &sets);
    let v = peft_check(
        &python,
        &p.path("models/qwen-tiny"),
        &out.join("sft-train/adapter"),
        &out.join("sft-train/checkpoint"),
    );
    // 2 layers x 7 projections x (A, B), as PEFT names them.
    assert_eq!(v["lora_tensors"], 28, "{v}");
    assert_eq!(
        (v["r"].as_u64(), v["lora_alpha"].as_f64()),
        (Some(4), Some(8.0))
    );
    assert!(
        v["adapter_effect"].as_f64().unwrap() > 1e-3,
        "untrained: {v}"
    );
    assert!(v["peft_vs_merged"].as_f64().unwrap() < 1e-4, "{v}");
    // A bad adapter config is refused at load, naming the field.
    lora_rank_zero_is_refused(&p, "sft-train");
    let o = run_sets(
        &p,
        &["run", "pretrain"],
        &["pretrain.lora.r=4", "pretrain.lora.alpha=8"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
    assert!(common::stderr(&o).contains("lora is a `sft-train` parameter"));
}

#[test]
fn rl_train_eval_and_sft_eval_start_from_a_hugging_face_checkpoint_directory() {
    let Some(python) = common::python() else {
        eprintln!("SKIPPED: a checkpoint made by transformers (no python)");
        return;
    };
    let p = cpu_project();
    hf_checkpoint(&p, &python, "models/qwen-tiny", "system-default");
    let sets = [
        "rl-train.model=./models/qwen-tiny",
        "eval.model=./models/qwen-tiny",
        "eval.kernelbench_samples=0",
        "sft-eval.model=./models/qwen-tiny",
    ];
    let o = run_sets(
        &p,
        &["run", "rl-train", "eval", "sft-eval", "--json"],
        &sets,
    );
    let said = format!("{}{}", stdout(&o), common::stderr(&o));
    assert_eq!(o.status.code(), Some(0), "{said}");
    let m = common::records(&o);
    for n in ["rl-train", "eval", "sft-eval"] {
        assert!(
            ["ran", "cached"].contains(&common::status_of(&m, n).as_str()),
            "{n}"
        );
    }
    // Nothing of the project's own model is built: the directory is every agent's start.
    for skipped in ["tokenizer", "pretrain", "sft-train", "sft-train-optimizer"] {
        assert!(!m.contains_key(skipped), "{skipped} ran: {:?}", m.keys());
    }
    let metrics = rows_with(&p, "rl-train", "metrics", &sets);
    assert_eq!(metrics.len(), 2, "both RL steps: {metrics:?}");
    // RL's checkpoints keep the directory's tokenizer byte for byte.
    let out = p.path("rl-export");
    let o = run_sets(
        &p,
        &["export", "rl-train", "--to", out.to_str().unwrap()],
        &sets,
    );
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    let read = |d: &std::path::Path| std::fs::read(d.join("tokenizer.json")).unwrap();
    let base = p.path("models/qwen-tiny");
    for agent in ["generator", "optimizer"] {
        assert_eq!(
            read(&out.join("rl-train").join(agent)),
            read(&base),
            "{agent}"
        );
    }
    // eval compares RL with the checkpoint it started from, on the same hold-out episodes.
    let summary = rows_with(&p, "eval", "summary", &sets);
    let cks: std::collections::BTreeSet<&str> = summary
        .iter()
        .map(|r| r["checkpoint"].as_str().unwrap())
        .collect();
    assert_eq!(cks, ["rl", "sft"].into_iter().collect());
    let samples = rows_with(&p, "sft-eval", "samples", &sets);
    assert_eq!(samples.len(), 3, "3 samples of the one hold-out family");
    // A configs/model name is not a directory for these stages.
    fails_with(
        &p,
        &["rl-train"],
        "rl-train.model=qwen2.5-coder-1.5b",
        "a Hugging Face checkpoint directory",
    );
    fails_with(
        &p,
        &["sft-eval"],
        "sft-eval.model=tiny",
        "a Hugging Face checkpoint directory",
    );
    fails_with(
        &p,
        &["rl-train"],
        "rl-train.model=./models/none",
        "no such checkpoint directory",
    );
}

#[test]
fn rl_train_with_lora_saves_merged_agents_and_peft_adapters_of_the_checkpoint() {
    let Some(python) = common::python() else {
        eprintln!("SKIPPED: a checkpoint made by transformers and PEFT (no python)");
        return;
    };
    let p = cpu_project();
    hf_checkpoint(&p, &python, "models/qwen-tiny", "system-default");
    let sets = [
        "rl-train.model=./models/qwen-tiny",
        "rl-train.lora.r=4",
        "rl-train.lora.alpha=8",
        // Every completion in the update, and PPO-ptx's gradient uncapped: it moves the
        // adapters whatever the rewards of the untrained model.
        "rl-train.signal_only=false",
        "rl-train.aux_grad_cap=0",
        "rl-train.lr=0.05",
    ];
    let o = run_sets(&p, &["run", "rl-train", "--json"], &sets);
    let said = format!("{}{}", stdout(&o), common::stderr(&o));
    assert_eq!(o.status.code(), Some(0), "{said}");
    let metrics = rows_with(&p, "rl-train", "metrics", &sets);
    let steps: i64 = metrics
        .iter()
        .map(|r| r["update_steps"].as_i64().unwrap())
        .sum();
    assert!(steps > 0, "the generator stepped: {metrics:?}");
    let out = export_with(&p, "rl-train", "rl-lora-export", &sets);
    // The merged generator is what PEFT makes of the checkpoint and the generator's adapters.
    let v = peft_check(
        &python,
        &p.path("models/qwen-tiny"),
        &out.join("rl-train/generator_adapter"),
        &out.join("rl-train/generator"),
    );
    assert_eq!(v["lora_tensors"], 28, "{v}");
    assert!(
        v["adapter_effect"].as_f64().unwrap() > 1e-4,
        "untrained: {v}"
    );
    assert!(v["peft_vs_merged"].as_f64().unwrap() < 1e-4, "{v}");
    assert!(
        out.join("rl-train/optimizer_adapter/adapter_config.json")
            .is_file()
    );
    // A bad adapter config is refused at load, naming the field.
    lora_rank_zero_is_refused(&p, "rl-train");
}

#[test]
fn sft_train_with_init_random_starts_from_a_fresh_model_of_the_file_without_pretrain() {
    let p = cpu_project();
    let sets = [
        "sft-train.init=random",
        "sft-train.max_steps=2",
        "sft-train.model=tiny",
    ];
    let o = run_sets(&p, &["run", "sft-train", "--json"], &sets);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    let m = common::records(&o);
    assert!(!m.contains_key("pretrain"), "pretrain ran: {:?}", m.keys());
    assert!(m.contains_key("tokenizer"));
    let metrics = rows_with(&p, "sft-train", "metrics", &sets);
    assert_eq!(metrics.len(), 2);
    // A fresh model's first loss is about ln(vocabulary), far above pretrain's start.
    let vocab = 2048f64; // configs/model/tiny.toml [tokenizer]
    let first = metrics[0]["loss"].as_f64().unwrap();
    assert!(
        (first - vocab.ln()).abs() < 1.0,
        "first loss {first} vs ln({vocab})"
    );
    fails_with(
        &p,
        &["sft-train"],
        "pretrain.init=random",
        "init is a `sft-train` parameter",
    );
}

#[test]
fn collab_sft_fine_tunes_both_agents_on_their_verified_turns_beside_replayed_sft_data() {
    let p = after_rl();
    let o = p.run(&["run", "collab-sft", "collab-sft-optimizer", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    let m = common::records(&o);
    let rl = rl_families(&p);
    // Episodes on the families RL practises (the `rl` split), `samples` (4) each.
    let c = rows(&p, "collab-data", "collected");
    let agents: Vec<&str> = c.iter().map(|r| r["agent"].as_str().unwrap()).collect();
    assert_eq!(agents, ["generator", "optimizer"]);
    for r in &c {
        assert_eq!(r["episodes"].as_u64(), Some(4 * rl.len() as u64), "{r}");
        assert_eq!(
            (r["mode"].as_str(), r["device"].as_str()),
            (Some("compile-only"), Some("cpu"))
        );
        assert!(r["pass_rate"].is_null(), "compile-only: no pass rate {r}");
        let kinds: i64 = ["correct", "repairs", "speedups"]
            .iter()
            .map(|k| r[*k].as_i64().unwrap())
            .sum();
        assert_eq!(r["kept"].as_i64(), Some(kinds), "{r}");
        assert_eq!(r["speedups"], 0, "nothing is timed without a GPU: {r}");
    }
    assert_eq!(
        c[0]["turns"], c[0]["episodes"],
        "one generator turn per episode"
    );
    // Each table: the kept turns (kernel `collab:...`, the rl families, labelled
    // compile-only), a tenth of sft-data's train rows and all its val rows.
    for (table, agent) in [("sft_generator", 0), ("sft_optimizer", 1)] {
        let got = rows(&p, "collab-data", table);
        let sft = rows(&p, "sft-data", table);
        let kept: Vec<&Value> = got
            .iter()
            .filter(|r| r["kernel_id"].as_str().unwrap().starts_with("collab:"))
            .collect();
        assert_eq!(
            kept.len() as i64,
            c[agent]["kept"].as_i64().unwrap(),
            "{table}"
        );
        for r in &kept {
            assert!(rl.contains(r["task_id"].as_str().unwrap()), "{r}");
            assert_eq!(
                (r["split"].as_str(), r["validated"].as_str()),
                (Some("train"), Some("compile-only"))
            );
            let msgs: Vec<Value> =
                serde_json::from_str(r["messages_json"].as_str().unwrap()).unwrap();
            assert_eq!(msgs.last().unwrap()["role"], "assistant", "{r}");
        }
        let count = |rs: &[Value], split: &str| rs.iter().filter(|r| r["split"] == split).count();
        let train = count(&sft, "train");
        let replayed = count(&got, "train") - kept.len();
        assert_eq!(replayed, (0.1 * train as f64).round() as usize, "{table}");
        assert_eq!(replayed as i64, c[agent]["replayed"].as_i64().unwrap());
        assert_eq!(count(&got, "val"), count(&sft, "val"), "{table}");
        // Every replayed row is one of sft-data's, unchanged.
        let ids: std::collections::BTreeSet<&str> = sft
            .iter()
            .map(|r| r["example_id"].as_str().unwrap())
            .collect();
        assert!(
            got.iter()
                .filter(|r| r["split"] == "train"
                    && !r["kernel_id"].as_str().unwrap().starts_with("collab:"))
                .all(|r| ids.contains(r["example_id"].as_str().unwrap())),
            "{table}"
        );
    }
    // Both agents fine-tuned from their SFT checkpoints into other weights.
    for (node, base) in [
        ("collab-sft", "sft-train"),
        ("collab-sft-optimizer", "sft-train-optimizer"),
    ] {
        assert_eq!(common::status_of(&m, node), "ran", "{node}");
        let o = p.run(&["run", base, "--json"]);
        let b = common::records(&o);
        assert_ne!(
            common::out_hash(&m, node, "checkpoint"),
            common::out_hash(&b, base, "checkpoint"),
            "{node}"
        );
        assert!(!rows(&p, node, "metrics").is_empty(), "{node}");
    }
    // RL starts from them where the pipeline says so.
    let o = p.run(&[
        "dag",
        "--set",
        "rl-train.inputs.generator=collab-sft.checkpoint",
        "--set",
        "rl-train.inputs.optimizer=collab-sft-optimizer.checkpoint",
    ]);
    let dag = stdout(&o);
    assert!(
        dag.contains(
            "generator <- collab-sft.checkpoint, optimizer <- collab-sft-optimizer.checkpoint"
        ),
        "{dag}"
    );
    fails_with(
        &p,
        &["collab-data"],
        "collab-data.replay=2.0",
        "replay must be a share in [0, 1]",
    );
    // eval takes them as a third checkpoint on the same seeds: collab-SFT - SFT beside RL - SFT.
    let on = ["eval.collab=true"];
    let md = export_report(&p, "exported_collab", &on);
    let cks: Vec<String> = rows_with(&p, "eval", "summary", &on)
        .iter()
        .filter(|r| r["split"] == "test")
        .map(|r| r["checkpoint"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(cks, ["sft", "collab", "rl"]);
    assert!(
        md.contains("collab-SFT - SFT on the same episodes' seeds: "),
        "{md}"
    );
    let c: Value = serde_json::from_str(
        &std::fs::read_to_string(p.path("exported_collab/eval/report/comparison.json")).unwrap(),
    )
    .unwrap();
    // Compile-only: the primary metric was not measured for either side.
    assert!(c["holdout_collab_primary"].is_null(), "{c}");
    assert!(
        md.contains("collab-SFT - SFT on the same episodes' seeds: n/a (not measured)"),
        "{md}"
    );
}

/// The processes whose command line mentions `needle` (from /proc).
fn processes_mentioning(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle))
        .collect()
}

#[test]
fn training_steps_show_and_are_logged_as_they_happen_and_an_interrupt_ends_the_trainer_with_exit_130()
 {
    use std::io::BufRead;
    let p = cpu_project();
    // A pretraining run that would not end by itself.
    let mc = p.path("configs/model/tiny.toml");
    let t = std::fs::read_to_string(&mc).unwrap();
    assert!(t.contains("max_steps = 40"), "{t}");
    let t = t
        .replacen("max_steps = 40", "max_steps = 1000000", 1)
        .replacen("epochs = 1", "epochs = 100000", 1);
    std::fs::write(&mc, t).unwrap();
    run_ok(&p, &["tokenizer"], &[]);
    let mut child = p
        .cmd(&["-v", "run", "pretrain"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A run that shows nothing while training, or does not stop, fails instead of hanging.
    let pid = child.id() as i32;
    let reaped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = reaped.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(120));
        if !r.load(std::sync::atomic::Ordering::SeqCst) {
            // SAFETY: signals the child this test started, not yet reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    });
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut said = Vec::new();
    // Plain output (stderr is not a terminal): a progress line with the steps done so far,
    // printed while the trainer runs.
    for line in lines.by_ref() {
        let line = line.unwrap();
        let progress = line.contains("progress pretrain steps:");
        said.push(line);
        if progress {
            break;
        }
    }
    let last = said.last().cloned().unwrap_or_default();
    assert!(
        last.contains("progress pretrain steps:"),
        "{}",
        said.join("\n")
    );
    let steps: u64 = last
        .split("steps: ")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(steps >= 1, "{last}");
    // `-v`: a line per step through tracing, with its loss.
    assert!(
        said.iter()
            .any(|l| l.contains("pretrain step") && l.contains("step=1 ") && l.contains("loss=")),
        "{}",
        said.join("\n")
    );
    // The trainer's job file lies in the store's scratch space, under the project's path.
    let store = p.store().to_string_lossy().to_string();
    let trainers = || {
        processes_mentioning(&store)
            .into_iter()
            .filter(|c| c.contains("cudarl-pipe-train"))
            .collect::<Vec<_>>()
    };
    assert!(!trainers().is_empty(), "no trainer on a job under {store}");
    // SAFETY: signals the child this test started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    said.extend(lines.map_while(Result::ok));
    let code = child.wait().unwrap().code();
    reaped.store(true, std::sync::atomic::Ordering::SeqCst);
    let said = said.join("\n");
    assert_eq!(code, Some(130), "{said}");
    assert!(said.contains("the trainer was stopped"), "{said}");
    // The trainer went with it, and nothing of pretrain was stored.
    assert!(trainers().is_empty(), "{:?}", trainers());
    // The steps were written as they happened: a line of metrics.jsonl and a TensorBoard scalar
    // per step, in the folder the run named at its start, read back by TensorBoard's own reader.
    let dir = said
        .lines()
        .find_map(|l| l.split("metrics as they happen: ").nth(1))
        .and_then(|r| r.split(" (").next())
        .unwrap_or_else(|| panic!("no metrics folder named:\n{said}"));
    assert!(
        dir.contains("/runs/") && dir.ends_with("/pretrain"),
        "{dir}"
    );
    let jsonl = std::fs::read_to_string(format!("{dir}/metrics.jsonl")).unwrap();
    let logged: Vec<Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(logged.len() as u64 >= steps, "{} < {steps}", logged.len());
    assert_eq!(logged[0]["step"], 1);
    assert!(logged[0]["loss"].as_f64().unwrap() > 0.0);
    if let Some(py) = common::python() {
        let o = std::process::Command::new(py)
            .args([
                "-c",
                "import sys\nfrom tensorboard.backend.event_processing.event_accumulator import EventAccumulator as A\na = A(sys.argv[1]); a.Reload()\nprint(len(a.Scalars('loss')), a.Scalars('loss')[0].step)",
                dir,
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", common::stderr(&o));
        let out = stdout(&o);
        let mut it = out.split_whitespace().map(|x| x.parse::<usize>().unwrap());
        assert!(it.next().unwrap() >= logged.len(), "{out}");
        assert_eq!(it.next(), Some(1), "{out}");
    }
    // (The shared store may hold other settings' pretraining: not fresh is what says that.)
    let (_, st) = p.run_json(&["status", "pretrain"]);
    let status = common::status_of(&st, "pretrain");
    assert!(status == "missing" || status == "stale", "{status}");
}
