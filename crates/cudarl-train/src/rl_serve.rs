//! The trainer side of `rl-train`: a long-lived trainer process holding the generator and the
//! optimizer as [`TrainableAgent`]s plus frozen copies of their starting checkpoints (the KL
//! reference). The `rl-train` stage drives it with one JSON request per stdin line and reads
//! one JSON response per stdout line, while it runs episodes through the kernel harness itself.
//!
//! Requests (`op`):
//! - `generate` {agent, conversations: [[{role, content}]], max_new_tokens, temperature, top_p,
//!   seed} -> {completions: [{id, text, tokens, finish, mean_log_prob}], seconds}; the tokens
//!   are kept under `id` for a later update.
//! - `update` {agent, samples: [{id, advantage}]} -> {loss, pg_loss, kl, clip_frac, entropy,
//!   tokens, grad_norm, seconds}: the clipped-ratio loss with the KL penalty
//!   ([`crate::rl::clipped_pg_loss`]) over minibatches; the old log-probabilities are
//!   recomputed with the training forward pass before the first minibatch (so sampling-time
//!   numerics do not bias the ratio). Every kept completion of that agent is dropped after.
//! - `save` {dir} -> writes `dir/generator` and `dir/optimizer` (Hugging Face layout).
//! - `quit`.
//!
//! A failed request answers `{"ok": false, "error": ...}` and the process goes on.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tch::{Kind, Tensor};

use crate::agent::{AgentOptim, Completion, Role, TrainableAgent};
use crate::rl::{PgConfig, clipped_pg_loss};
use crate::tokenizer::Message;
use crate::train::Precision;
use crate::{ModelError, Qwen2, SampleParams};

/// Settings of the RL trainer process (the `rl-serve` job).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlServe {
    /// The generator's starting checkpoint (Hugging Face directory with `tokenizer.json`).
    pub generator: PathBuf,
    /// The optimizer's starting checkpoint.
    pub optimizer: PathBuf,
    /// The generator's system prompt.
    pub generator_system: String,
    /// The optimizer's system prompt.
    pub optimizer_system: String,
    /// `auto`, `cpu` or `cuda`.
    pub device: String,
    /// Compute dtype.
    #[serde(default)]
    pub precision: Precision,
    /// AdamW learning rate.
    pub lr: f64,
    /// Loss settings.
    pub pg: PgConfig,
    /// Completions per optimizer step.
    pub minibatch: usize,
}

struct Kept {
    role: Role,
    completion: Completion,
    temperature: f64,
}

struct Server {
    agents: [TrainableAgent; 2],
    refs: [Qwen2; 2],
    kept: BTreeMap<u64, Kept>,
    next_id: u64,
    job: RlServe,
}

fn idx(role: Role) -> usize {
    match role {
        Role::Generator => 0,
        Role::Optimizer => 1,
    }
}

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
enum Request {
    Generate {
        agent: Role,
        conversations: Vec<Vec<Message>>,
        max_new_tokens: usize,
        temperature: f64,
        top_p: f64,
        seed: i64,
    },
    Update {
        agent: Role,
        samples: Vec<Sample>,
    },
    Save {
        dir: PathBuf,
    },
    Quit,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Sample {
    id: u64,
    advantage: f64,
}

impl Server {
    fn new(job: RlServe) -> Result<Server, ModelError> {
        let dev = crate::job::device(&job.device)?;
        let optim = AgentOptim {
            lr: job.lr,
            ..Default::default()
        };
        let load = |dir: &PathBuf, role, system: &str| {
            TrainableAgent::load(dir, role, system, dev, job.precision, optim)
        };
        let g = load(&job.generator, Role::Generator, &job.generator_system)?;
        let o = load(&job.optimizer, Role::Optimizer, &job.optimizer_system)?;
        let frozen = |dir: &PathBuf| -> Result<Qwen2, ModelError> {
            let mut m = Qwen2::load(dir, dev, Kind::Float)?;
            m.set_compute_kind(job.precision.compute_kind(dev));
            for (_, mut v) in m.vs.variables() {
                let _ = v.requires_grad_(false);
            }
            Ok(m)
        };
        let refs = [frozen(&job.generator)?, frozen(&job.optimizer)?];
        Ok(Server {
            agents: [g, o],
            refs,
            kept: BTreeMap::new(),
            next_id: 0,
            job,
        })
    }

    fn handle(&mut self, req: Request) -> Result<Option<Value>, ModelError> {
        let t0 = Instant::now();
        Ok(Some(match req {
            Request::Generate {
                agent,
                conversations,
                max_new_tokens,
                temperature,
                top_p,
                seed,
            } => {
                let p = SampleParams {
                    max_new_tokens,
                    temperature,
                    top_p,
                    seed: Some(seed),
                    use_cache: true,
                };
                let comps = self.agents[idx(agent)].generate_with_log_probs(&conversations, &p)?;
                let mut out = Vec::new();
                for c in comps {
                    let id = self.next_id;
                    self.next_id += 1;
                    let lp = &c.log_probs;
                    out.push(json!({"id": id, "text": c.text, "tokens": c.ids.len(),
                        "finish": format!("{:?}", c.finish),
                        "mean_log_prob": lp.iter().map(|x| f64::from(*x)).sum::<f64>() / lp.len().max(1) as f64}));
                    self.kept.insert(
                        id,
                        Kept {
                            role: agent,
                            completion: c,
                            temperature,
                        },
                    );
                }
                json!({"ok": true, "completions": out, "seconds": t0.elapsed().as_secs_f64()})
            }
            Request::Update { agent, samples } => {
                let mut v =
                    serde_json::to_value(self.update(agent, &samples)?).expect("stats serialize");
                self.kept.retain(|_, k| k.role != agent);
                v["ok"] = true.into();
                v["seconds"] = t0.elapsed().as_secs_f64().into();
                v
            }
            Request::Save { dir } => {
                self.agents[0].save(&dir.join("generator"))?;
                self.agents[1].save(&dir.join("optimizer"))?;
                json!({"ok": true, "seconds": t0.elapsed().as_secs_f64()})
            }
            Request::Quit => return Ok(None),
        }))
    }

    fn update(&mut self, agent: Role, samples: &[Sample]) -> Result<UpdateStats, ModelError> {
        let mut items = Vec::new();
        for s in samples {
            let k = self.kept.get(&s.id).ok_or_else(|| {
                ModelError::Generate(format!("update: no kept completion with id {}", s.id))
            })?;
            if k.role != agent {
                return Err(ModelError::Generate(format!(
                    "update: completion {} belongs to the other agent",
                    s.id
                )));
            }
            if !k.completion.ids.is_empty() {
                items.push((s.id, s.advantage));
            }
        }
        let mut st = UpdateStats::default();
        if items.is_empty() {
            return Ok(st);
        }
        let mb = self.job.minibatch.max(1);
        let (a, r) = (&mut self.agents[idx(agent)], &self.refs[idx(agent)]);
        let mut n_mb = 0.0;
        // The minibatches once: (prompt, completion) pairs, sampling temperature, advantages.
        let kept = &self.kept;
        let batches: Vec<Minibatch<'_>> = items
            .chunks(mb)
            .map(|chunk| {
                let seqs = chunk
                    .iter()
                    .map(|(id, _)| {
                        let c = &kept[id].completion;
                        (c.prompt_ids.as_slice(), c.ids.as_slice())
                    })
                    .collect();
                let adv: Vec<f32> = chunk.iter().map(|(_, a)| *a as f32).collect();
                let adv = Tensor::from_slice(&adv).to_device(a.model.device());
                (seqs, kept[&chunk[0].0].temperature, adv)
            })
            .collect();
        // Old and reference log-probabilities first, for every minibatch, without gradients.
        let mut fixed = Vec::new();
        for (seqs, temp, _) in &batches {
            let _g = tch::no_grad_guard();
            let (old, _, ent) = TrainableAgent::completion_log_probs(&a.model, seqs, *temp)?;
            let (rf, mask, _) = TrainableAgent::completion_log_probs(r, seqs, *temp)?;
            st.entropy +=
                (ent.sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0)).double_value(&[]);
            fixed.push((old, rf));
        }
        for (ci, (seqs, temp, adv)) in batches.iter().enumerate() {
            let (logp, mask, _) = TrainableAgent::completion_log_probs(&a.model, seqs, *temp)?;
            let (old, rf) = &fixed[ci];
            let (loss, s) = clipped_pg_loss(&logp, old, Some(rf), adv, &mask, &self.job.pg);
            st.grad_norm += a.step(&loss)?;
            st.loss += s.loss;
            st.pg_loss += s.pg_loss;
            st.kl += s.kl;
            st.clip_frac += s.clip_frac;
            st.tokens += s.tokens;
            n_mb += 1.0;
        }
        for x in [
            &mut st.loss,
            &mut st.pg_loss,
            &mut st.kl,
            &mut st.clip_frac,
            &mut st.entropy,
            &mut st.grad_norm,
        ] {
            *x /= n_mb;
        }
        st.samples = items.len();
        Ok(st)
    }
}

/// One minibatch of an update: (prompt, completion) token pairs, the sampling temperature,
/// the advantages `[b]`.
type Minibatch<'a> = (Vec<(&'a [i64], &'a [i64])>, f64, Tensor);

/// What one `update` did (means over its minibatches; `tokens` summed).
#[derive(Debug, Clone, Default, Serialize)]
pub struct UpdateStats {
    /// Total loss.
    pub loss: f64,
    /// Clipped-surrogate part.
    pub pg_loss: f64,
    /// k3 KL to the reference, per token.
    pub kl: f64,
    /// Fraction of clipped tokens.
    pub clip_frac: f64,
    /// Mean per-token entropy of the policy (nats) before the update.
    pub entropy: f64,
    /// Tokens trained on.
    pub tokens: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Completions trained on.
    pub samples: usize,
}

/// Runs the request loop on stdin/stdout until `quit` or end of input.
///
/// # Errors
/// The agents cannot be loaded (bad checkpoint, named).
pub fn serve(job: &RlServe) -> Result<(), ModelError> {
    let mut server = Server::new(job.clone())?;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", json!({"ok": true, "ready": true}));
    let _ = out.flush();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let resp = match serde_json::from_str::<Request>(&line) {
            Err(e) => json!({"ok": false, "error": format!("bad request: {e}")}),
            Ok(req) => match server.handle(req) {
                Ok(Some(v)) => v,
                Ok(None) => break,
                Err(e) => json!({"ok": false, "error": e.to_string()}),
            },
        };
        let _ = writeln!(out, "{resp}");
        let _ = out.flush();
    }
    Ok(())
}
