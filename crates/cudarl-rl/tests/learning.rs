//! RL that learns, on the CPU, through the real episode, credit and update path: a tiny model is
//! pretrained and fine-tuned 50/50 on the two `vector_add` kernels of the task set (`naive.cu`
//! and `vec4.cu`), then GRPO steps run the real `run_episodes` (prompts, code extraction, turn
//! credit) and `step::update` against the real trainer process, with a scripted tester that pays
//! `vec4.cu` a 2x speedup and `naive.cu` 1x (any other answer does not compile). RL must push
//! `vec4.cu`'s share of the samples above 0.9 within 40 steps (held for three steps), while a
//! frozen control (the same run with learning rate 0) stays near the fine-tuned 0.5. Measured
//! on a 2-core CPU: 0.38 -> 0.81 -> 0.94 -> 1.00 -> 0.94 in five steps, the control 0.44 over 20;
//! about 130 s beside other tests.
//!
//! Its episodes are one generator turn, so the seeds' credit (`CreditMode::Seed`:
//! `0.3 r_t + 0.7 * 0.9^(T-1-t) r_{T-1}`) equals returns-to-go here and cannot change the result;
//! where the two differ, on an optimizer turn that breaks or repairs the kernel it was given,
//! `credit.rs`'s unit tests say what each does. The k3 clamp (`KL_CLAMP`) has no switch, so no
//! run here shows RL without it.

use std::path::{Path, PathBuf};

use cudarl_cuda::Verdict;
use cudarl_cuda::task::TaskSpec;
use cudarl_curriculum::prompts::{self, ChatMessage};
use cudarl_protocol::rl::PgConfig;
use cudarl_protocol::{Algorithm, Device, Document, Job, RlServe, TrainConfig};
use cudarl_rl::episode::{EpisodeSettings, Tester, generator_conversation, run_episodes};
use cudarl_rl::reward::RewardConfig;
use cudarl_rl::step::{GeneratorCredit, UpdateSettings, update};
use cudarl_rl::trainer::{Sampling, TrainerClient, run_job};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Pays the kernel `fast` a 2x speedup and `plain` 1x, both correct on every test; anything
/// else does not compile. A kernel is told by its first line, where the two differ (the
/// choice the policy makes): the model is fine-tuned on the kernels' first lines and samples
/// stop after [`MAX_NEW_TOKENS`], which keeps the test to minutes on two cores.
struct Scripted {
    fast: String,
    plain: String,
}

/// Tokens sampled per answer: the fence and the kernel's first line.
const MAX_NEW_TOKENS: usize = 48;

/// Steps of the frozen control (320 samples: a standard error of about 0.03 on its share).
const CONTROL_STEPS: usize = 20;

/// Lines of each kernel in the fine-tuning answers (its header comment).
const HEAD_LINES: usize = 3;

impl Scripted {
    /// 2.0 for `fast`, 1.0 for `plain`, `None` for anything else: the code's first line must
    /// be a kernel's first line, or its beginning when the sample stopped at
    /// [`MAX_NEW_TOKENS`], past the point where the two kernels' first lines differ.
    fn speedup(&self, code: &str) -> Option<f64> {
        let first = |c: &str| {
            c.trim_start()
                .lines()
                .next()
                .unwrap_or("")
                .trim_end()
                .to_string()
        };
        let (line, fast, plain) = (first(code), first(&self.fast), first(&self.plain));
        let common = fast
            .chars()
            .zip(plain.chars())
            .take_while(|(a, b)| a == b)
            .count();
        if line.chars().count() <= common {
            None
        } else if fast.starts_with(&line) {
            Some(2.0)
        } else if plain.starts_with(&line) {
            Some(1.0)
        } else {
            None
        }
    }
}

impl Tester for Scripted {
    fn test(
        &mut self,
        task: &TaskSpec,
        code: &str,
    ) -> Result<(Verdict, Option<String>), cudarl_rl::RlError> {
        let speedup = self.speedup(code);
        let v: Verdict = serde_json::from_value(serde_json::json!({
            "task_id": task.id, "abi": "native", "mode": "full", "compiled": speedup.is_some(),
            "static_flags": [], "diagnostics": [], "resources": [],
            "executed": speedup.is_some(), "correct": speedup.map(|_| true),
            "failure": if speedup.is_some() { None } else { Some("compile_error") },
            "failure_detail": null, "hack_flags": [], "tests": [], "max_abs_err": null,
            "max_rel_err": null, "timing": null, "naive_timing": null,
            "speedup_vs_naive": speedup, "speedup_vs_torch": null, "roofline_ms": null,
            "dram_fraction_of_peak": null, "signature": "", "cache_hit": false,
            "compile_seconds": 0.0, "nvcc_version": "", "arch": "sm_90", "gpu": null
        }))
        .map_err(|e| cudarl_rl::RlError::Failed(e.to_string()))?;
        Ok((v, None))
    }
}

/// The tiny model config's `[model]`, `[pretrain]` or `[sft]` table as `T`.
fn section<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let text = std::fs::read_to_string(root().join("configs/model/tiny.toml")).unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap();
    v[name].clone().try_into().unwrap()
}

fn write_lines<T: serde::Serialize>(path: &Path, rows: &[T]) {
    let text: String = rows
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    std::fs::write(path, text).unwrap();
}

/// A tiny model pretrained, then fine-tuned, on `chats` (each kernel equally often).
fn fine_tuned(dir: &Path, chats: &[Vec<ChatMessage>]) -> PathBuf {
    let corpus = dir.join("corpus.jsonl");
    let docs: Vec<Document> = chats.iter().cloned().map(Document::Chat).collect();
    write_lines(&corpus, &docs);
    let out = |name: &str| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    };
    let (tok, pre, sft) = (out("tok"), out("pre"), out("sft"));
    let texts = dir.join("texts.jsonl");
    let contents: Vec<&str> = chats.iter().flatten().map(|m| m.content.as_str()).collect();
    write_lines(&texts, &contents);
    run_job(
        &Job::Tokenizer {
            corpus: texts,
            vocab_size: 512,
            out: tok.clone(),
        },
        &tok,
    )
    .unwrap();
    let mut pretrain: TrainConfig = section("pretrain");
    (pretrain.epochs, pretrain.max_steps, pretrain.lr) = (20, None, 1e-2);
    run_job(
        &Job::Pretrain {
            tokenizer: tok.join("tokenizer.json"),
            model: section("model"),
            corpus,
            train: pretrain,
            device: Device::Cpu,
            out: pre.clone(),
        },
        &pre,
    )
    .unwrap();
    let data = dir.join("sft.jsonl");
    write_lines(&data, chats);
    let mut ft: TrainConfig = section("sft");
    (ft.epochs, ft.max_steps, ft.lr) = (15, None, 1e-2);
    run_job(
        &Job::Sft {
            base: pre.join("model"),
            init: None,
            lora: None,
            data: data.clone(),
            eval_data: data,
            train: ft,
            device: Device::Cpu,
            out: sft.clone(),
        },
        &sft,
    )
    .unwrap();
    sft.join("model")
}

/// `vec4.cu`'s share of the generator's kernels per step over `steps` GRPO steps of two groups
/// of 8 episodes at learning rate `lr` (stopping early once three steps in a row are at 0.9
/// or more when `stop_early`), and the share of answers that were neither kernel.
fn shares(
    dir: &Path,
    model: &Path,
    task: &TaskSpec,
    tester: &mut Scripted,
    (lr, steps, stop_early): (f64, usize, bool),
) -> (Vec<f64>, f64) {
    std::fs::create_dir_all(dir).unwrap();
    let job = RlServe {
        generator: model.to_path_buf(),
        optimizer: model.to_path_buf(),
        generator_system: prompts::GENERATOR_SYSTEM.into(),
        optimizer_system: prompts::OPTIMIZER_SYSTEM.into(),
        device: Device::Cpu,
        precision: Default::default(),
        lr,
        generator_lr: None,
        // The pipeline's default: the KL gradient capped at the policy gradient's norm.
        pg: PgConfig {
            aux_grad_cap: Some(1.0),
            ..PgConfig::default()
        },
        minibatch: 8,
        algorithm: Algorithm::Grpo,
        warmup: 0,
        value_lr: 1e-3,
        target_kl: None,
        epochs: 1,
        ptx: None,
        lora: None,
        gradient_checkpointing: false,
        sample_only: false,
    };
    let sampling = Sampling {
        max_new_tokens: MAX_NEW_TOKENS,
        temperature: 1.0,
        top_p: 1.0,
        seed: 7,
        constrain_launcher: false,
    };
    let mut tc = TrainerClient::start(&job, dir, sampling).unwrap();
    let cfg = RewardConfig::load(
        &root().join("configs/reward/default.toml"),
        "configs/reward/default.toml",
    )
    .unwrap();
    let settings = UpdateSettings {
        algorithm: Algorithm::Grpo,
        group_size: 8,
        std_floor: 0.1,
        generator_credit: GeneratorCredit::Episode,
        credit: cfg.credit,
        gamma: 1.0,
        gae_lambda: 1.0,
        signal_only: true,
    };
    let episodes = EpisodeSettings {
        max_turns: 1,
        public_seeds: vec![0],
    };
    let tasks: Vec<&TaskSpec> = vec![task; 16];
    let (mut per_step, mut other, mut n) = (Vec::new(), 0usize, 0usize);
    for _ in 0..steps {
        let eps = run_episodes(&tasks, &mut tc, tester, &cfg, &episodes).unwrap();
        let paid: Vec<Option<f64>> = eps
            .iter()
            .map(|e| e.turns[0].code.as_deref().and_then(|c| tester.speedup(c)))
            .collect();
        let fast = paid.iter().filter(|x| **x == Some(2.0)).count();
        let plain = paid.iter().filter(|x| **x == Some(1.0)).count();
        let codes = &paid;
        other += codes.len() - fast - plain;
        n += codes.len();
        per_step.push(fast as f64 / codes.len() as f64);
        update(&mut tc, &eps, &settings).unwrap();
        let last3 = &per_step[per_step.len().saturating_sub(3)..];
        if stop_early && last3.len() == 3 && last3.iter().all(|s| *s >= 0.9) {
            break;
        }
    }
    tc.quit();
    (per_step, other as f64 / n as f64)
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

#[test]
fn grpo_moves_a_fine_tuned_fifty_fifty_policy_to_the_faster_kernel_and_a_frozen_one_stays() {
    let root = root();
    let task = TaskSpec::load(&root.join("datasets/tasks/vector_add")).unwrap();
    let read = |f: &str| std::fs::read_to_string(root.join("datasets/tasks/vector_add").join(f));
    let (fast, plain) = (read("vec4.cu").unwrap(), read("naive.cu").unwrap());
    let prompt = generator_conversation(&task);
    let chats: Vec<Vec<ChatMessage>> = (0..32)
        .map(|i| {
            let code = if i % 2 == 0 { &fast } else { &plain };
            let head: String = code.lines().take(HEAD_LINES).collect::<Vec<_>>().join("\n");
            let mut c = prompt.clone();
            c.push(ChatMessage::new("assistant", prompts::fenced(&head)));
            c
        })
        .collect();
    let d = tempfile::tempdir().unwrap();
    let model = fine_tuned(d.path(), &chats);
    let mut tester = Scripted { fast, plain };

    let (rl, rl_other) = shares(
        &d.path().join("rl"),
        &model,
        &task,
        &mut tester,
        (1e-3, 40, true),
    );
    eprintln!("RL: vec4.cu share per step {rl:.2?}, neither kernel {rl_other:.2}");
    let steps = rl.len();
    let (control, control_other) = shares(
        &d.path().join("control"),
        &model,
        &task,
        &mut tester,
        (0.0, CONTROL_STEPS, false),
    );
    eprintln!("frozen control: {control:.2?}, neither kernel {control_other:.2}");

    // The fine-tuned policy writes one of the two kernels and picks each about half the time.
    assert!(
        control_other < 0.2,
        "the fine-tuned model writes the kernels"
    );
    let c = mean(&control);
    assert!(
        (0.25..=0.75).contains(&c),
        "the frozen control stays near 0.5: {c:.2}"
    );
    // RL reaches 0.9 within 40 steps and holds it for three steps.
    let last3 = mean(&rl[steps.saturating_sub(3)..]);
    assert!(
        last3 >= 0.9,
        "RL's vec4.cu share over its last three steps of {steps}: {last3:.2}"
    );
    assert!(rl[0] < 0.8, "RL started near the control: {rl:.2?}");
}
