//! Tokenizer training, the chat template's loss mask, and a tiny model whose SFT loss falls on
//! a fixed small set (CPU, float32).

use std::path::Path;

use cudarl_train::tokenizer::{ChatMessage, ChatTokenizer, train_bpe};
use cudarl_train::train::{Example, TrainConfig, evaluate, train_lm};
use cudarl_train::{Qwen2, Qwen2Config};
use tch::Device;

/// The project's own kernels and task specs: a real corpus.
fn corpus() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets/tasks");
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let d = e.unwrap().path();
        if !d.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&d).unwrap() {
            let p = f.unwrap().path();
            out.push(std::fs::read_to_string(&p).unwrap());
        }
    }
    out.sort();
    out
}

#[test]
fn bpe_is_deterministic_round_trips_and_masks_assistant_tokens() {
    let d = tempfile::tempdir().unwrap();
    let texts = corpus();
    let (a, b) = (d.path().join("a.json"), d.path().join("b.json"));
    train_bpe(&texts, 600, &a).unwrap();
    train_bpe(&texts, 600, &b).unwrap();
    assert_eq!(
        std::fs::read(&a).unwrap(),
        std::fs::read(&b).unwrap(),
        "same corpus, same tokenizer.json"
    );
    let t = ChatTokenizer::load(&a).unwrap();
    assert_eq!(t.vocab_size(), 600);
    let src = "__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; } // ünïcode";
    let ids = t.encode(src).unwrap();
    // Merges learned from the corpus: well under one token per byte.
    assert!(
        ids.len() * 3 < src.len() * 2,
        "BPE merges: {} tokens",
        ids.len()
    );
    assert_eq!(t.decode(&ids).unwrap(), src);
    let msgs = [
        ChatMessage::new("system", "You write CUDA kernels."),
        ChatMessage::new("user", "Write relu."),
        ChatMessage::new("assistant", "__global__ void relu() {}"),
    ];
    let (ids, mask) = t.render(&msgs, false).unwrap();
    assert_eq!(ids.len(), mask.len());
    // The trained tokens are exactly the assistant's content and its <|im_end|>.
    let trained: Vec<i64> = ids
        .iter()
        .zip(&mask)
        .filter(|(_, m)| **m)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(*trained.last().unwrap(), t.im_end);
    assert_eq!(
        t.decode(&trained[..trained.len() - 1]).unwrap(),
        "__global__ void relu() {}"
    );
    assert_eq!(ids.iter().filter(|&&i| i == t.im_start).count(), 3);
    let (gp, _) = t.render(&msgs[..2], true).unwrap();
    let head = t.encode("assistant\n").unwrap();
    assert!(gp.ends_with(&head));
    assert_eq!(gp[gp.len() - head.len() - 1], t.im_start);
}

#[test]
fn tiny_model_sft_loss_falls() {
    let d = tempfile::tempdir().unwrap();
    let texts = corpus();
    let tp = d.path().join("tokenizer.json");
    train_bpe(&texts, 512, &tp).unwrap();
    let t = ChatTokenizer::load(&tp).unwrap();
    // 16 prompt -> kernel pairs from the project's task folders.
    let examples: Vec<Example> = texts
        .iter()
        .filter(|s| s.contains("extern \"C\" void launch"))
        .take(16)
        .enumerate()
        .map(|(i, k)| {
            let msgs = [
                ChatMessage::new("user", format!("Write kernel number {i}.")),
                ChatMessage::new("assistant", k.chars().take(400).collect::<String>()),
            ];
            let (ids, mask) = t.render(&msgs, false).unwrap();
            Example { ids, mask }
        })
        .collect();
    assert_eq!(examples.len(), 16);
    tch::manual_seed(0);
    let mut m = Qwen2::new(cfg_of(&t), Device::Cpu).unwrap();
    let tc = TrainConfig {
        epochs: 12,
        batch_size: 4,
        max_len: 256,
        lr: 3e-3,
        warmup: 4.0,
        eval_every: 0,
        ..Default::default()
    };
    let before = evaluate(&m, &examples, &tc).unwrap();
    let mut seen = 0;
    let steps = train_lm(&mut m, &examples, &examples, &tc, &mut |_| seen += 1).unwrap();
    assert_eq!(steps.len(), 48);
    assert_eq!(seen, 48);
    let after = steps.last().unwrap().eval_loss.unwrap();
    // Uniform over 512 tokens is ln 512 = 6.24 nats; the model must get well below it.
    assert!(before > 5.0, "untrained loss {before}");
    assert!(after < 0.6 * before, "loss {before} -> {after}");
    let first: f64 = steps[..4].iter().map(|s| s.loss).sum::<f64>() / 4.0;
    let last: f64 = steps[44..].iter().map(|s| s.loss).sum::<f64>() / 4.0;
    assert!(last < first, "training loss {first} -> {last}");
    assert!(
        steps
            .iter()
            .all(|s| s.tokens_per_s > 0.0 && s.grad_norm.is_finite())
    );
    // Length-grouped batches: the same steps over the same examples, and it learns as well.
    tch::manual_seed(0);
    let mut g = Qwen2::new(cfg_of(&t), Device::Cpu).unwrap();
    let tg = TrainConfig {
        group_by_length: true,
        ..tc
    };
    let gs = train_lm(&mut g, &examples, &examples, &tg, &mut |_| {}).unwrap();
    assert_eq!(gs.len(), 48);
    let trained =
        |v: &[cudarl_train::train::StepMetrics]| v.iter().map(|s| s.tokens).sum::<usize>();
    assert_eq!(trained(&gs), trained(&steps), "every example, 12 times");
    let after_g = gs.last().unwrap().eval_loss.unwrap();
    assert!(
        after_g < 0.6 * before,
        "grouped: loss {before} -> {after_g}"
    );
}

fn cfg_of(t: &ChatTokenizer) -> Qwen2Config {
    Qwen2Config::new(t.vocab_size() as i64, 64, 128, 2, 4, 2, 512, true)
}

#[test]
fn bf16_autocast_keeps_float32_master_weights_and_tracks_float32_logits() {
    tch::manual_seed(1);
    let cfg = Qwen2Config::new(300, 64, 128, 2, 4, 2, 128, false);
    let mut m = Qwen2::new(cfg, Device::Cpu).unwrap();
    let ids = tch::Tensor::randint(300, [2, 24], (tch::Kind::Int64, Device::Cpu));
    let f32_logits = m.forward(&ids, None, None, None).unwrap();
    m.set_compute_kind(Some(tch::Kind::BFloat16));
    assert_eq!(m.compute_kind(), tch::Kind::BFloat16);
    let bf = m.forward(&ids, None, None, None).unwrap();
    assert_eq!(
        bf.kind(),
        tch::Kind::Float,
        "logits are returned in float32"
    );
    let rel = (&bf - &f32_logits).norm().double_value(&[]) / f32_logits.norm().double_value(&[]);
    // bf16 has an 8-bit mantissa (relative rounding 2^-9 = 0.002 per operation).
    assert!(rel > 0.0 && rel < 0.03, "bf16 vs f32 relative error {rel}");
    // Gradients reach the float32 parameters through the casts.
    bf.mean(tch::Kind::Float).backward();
    for (name, p) in m.vs.variables() {
        assert_eq!(p.kind(), tch::Kind::Float, "{name} stays float32");
        assert!(p.grad().defined(), "{name} has a gradient");
        assert_eq!(p.grad().kind(), tch::Kind::Float);
    }
    // The compute kind equal to the parameters' is no autocast at all.
    m.set_compute_kind(Some(tch::Kind::Float));
    let again = tch::no_grad(|| m.forward(&ids, None, None, None).unwrap());
    assert_eq!((&again - &f32_logits).abs().max().double_value(&[]), 0.0);
}
