//! The trainer side of `rl-train`: a long-lived trainer process holding the generator and the
//! optimizer as [`TrainableAgent`]s plus frozen copies of their starting checkpoints in the
//! compute dtype (the KL reference; with LoRA ([`RlServe::lora`]) the frozen base itself,
//! shared, adapters off). The `rl-train` stage drives it with one JSON request per stdin line
//! and reads one JSON response per stdout line, while it runs episodes through the kernel
//! harness itself.
//!
//! Requests (`op`):
//! - `generate` {agent, conversations: [[{role, content}]], max_new_tokens, temperature, top_p,
//!   seed, stream?, launchers?} -> {completions: [{id, text, tokens, finish, mean_log_prob,
//!   value?, forced_tokens?}], seconds}; the tokens are kept under `id` for a later update.
//!   `value` (PPO only) is the value head's estimate of the prompt's state. `launchers` (one
//!   declaration per conversation) turns on constrained decoding of the launcher
//!   ([`TrainableAgent::generate_streaming_with`]); `forced_tokens` counts the tokens it wrote,
//!   which an update leaves out. With `stream: true`, each answer is also
//!   sent as soon as it is finished, as a line `{ok, partial: {index, text}}` before the final
//!   response (the stage compiles finished kernels while the batch decodes on).
//! - `update` {agent, samples: [{id, advantage, return?}]} -> {loss, pg_loss, kl, clip_frac,
//!   entropy, tokens, grad_norm, value_loss, max_approx_kl, skipped_minibatches, steps,
//!   seconds}: the clipped-ratio loss with the KL penalty ([`crate::rl::clipped_pg_loss`]) over
//!   minibatches, `epochs` passes over them ([`RlServe::epochs`]); with `pg.aux_grad_cap`, the
//!   gradient of the KL and PPO-ptx terms is scaled to at most that multiple of the policy
//!   gradient's norm ([`crate::rl::cap_auxiliary`]; `aux_scale`, `max_aux_grad_ratio`
//!   report it); the old log-probabilities
//!   are recomputed with the training forward pass before the first minibatch (so
//!   sampling-time numerics do not bias the ratio). With `target_kl`, the update
//!   stops early once the policy has moved too far ([`RlServe::target_kl`]). With PPO, the
//!   value head is fitted to `return` (mean squared error) in the same minibatches. Every kept
//!   completion of that agent is dropped after.
//! - `save` {dir} -> writes `dir/generator` and `dir/optimizer` (Hugging Face layout; with
//!   LoRA, merged, and the adapters in PEFT's layout in `dir/<agent>_adapter`).
//! - `quit`.
//!
//! On a GPU, `generate` and `update` replies also carry `gpu_memory`: libtorch's allocator
//! over the request (`cudarl_protocol::GpuMemory`). After each request the allocator's cached,
//! unused memory goes back to the driver ([`crate::cuda_graph::release_cached_memory`]).
//!
//! An update scores each minibatch through [`crate::score::Scored`]: the LM head over chunks of
//! completion positions, and with [`RlServe::gradient_checkpointing`] each layer's input only.
//! One pass of the head both scores and differentiates a minibatch: the loss's gradient with
//! respect to each token's log-probability is taken in closed form as the chunk is scored
//! ([`crate::rl::clipped_pg_grads`]); with `pg.aux_grad_cap` the KL's gradient then takes a
//! second pass.
//!
//! A failed request answers `{"ok": false, "error": ...}` and the process goes on.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use cudarl_protocol::{Generated, Reply, Request, Sample, UpdateStats};
use tch::{Kind, Tensor};

use tch::nn::{self, Module};

use crate::adamw::{AdamW, AdamWConfig};
use crate::agent::{AgentOptim, Completion, Role, TrainableAgent};
use crate::rl::clipped_pg_loss;
use crate::score::{ScorePass, Scored};
use crate::tokenizer::ChatMessage;
use crate::train::{ComputeKind, Example};
use crate::{ModelError, Qwen2};

pub use cudarl_protocol::rl::TARGET_KL_MARGIN;
pub use cudarl_protocol::{Algorithm, Ptx, RlServe};

/// The AdamW settings of the generator and of the optimizer of `job`: `generator_lr` (else
/// `lr`) and `lr`, the same warmup.
pub fn agent_optims(job: &RlServe) -> [AgentOptim; 2] {
    let optim = |lr| AgentOptim {
        lr,
        warmup: job.warmup,
        ..Default::default()
    };
    [optim(job.generator_lr.unwrap_or(job.lr)), optim(job.lr)]
}

/// The files of `role`'s training state in a `save_state` directory: the agent's and its
/// critic's (PPO).
fn state_files(dir: &Path, role: Role) -> (PathBuf, PathBuf) {
    let r = role.as_str();
    (
        dir.join(format!("{r}.safetensors")),
        dir.join(format!("critic_{r}.safetensors")),
    )
}

/// PPO's critic for one agent: a two-layer MLP `h -> h -> 1` (tanh) on the policy's last
/// hidden state at the prompt's last token, detached (the critic does not move the policy's
/// trunk), with its own AdamW. Estimates the turn's return (reward units, about 0..1).
struct ValueHead {
    _vs: nn::VarStore,
    net: nn::Sequential,
    opt: AdamW,
}

impl ValueHead {
    fn new(hidden: i64, device: tch::Device, lr: f64) -> Result<ValueHead, ModelError> {
        let vs = nn::VarStore::new(device);
        let r = vs.root();
        let net = nn::seq()
            .add(nn::linear(&r / "fc", hidden, hidden, Default::default()))
            .add_fn(|x| x.tanh())
            .add(nn::linear(&r / "out", hidden, 1, Default::default()));
        let opt = AdamW::new(&vs, AdamWConfig::default(), lr);
        Ok(ValueHead { _vs: vs, net, opt })
    }

    /// Values `[b]` of states `[b, h]` (detached from the policy, float32).
    fn values(&self, states: &Tensor) -> Tensor {
        self.net
            .forward(&states.detach().to_kind(Kind::Float))
            .squeeze_dim(-1)
    }
}

struct Kept {
    role: Role,
    completion: Completion,
    temperature: f64,
}

struct Server {
    agents: [TrainableAgent; 2],
    refs: [Qwen2; 2],
    critics: Option<[ValueHead; 2]>,
    kept: BTreeMap<u64, Kept>,
    next_id: u64,
    job: RlServe,
    /// PPO-ptx's SFT conversations per agent, in the seed's order (empty when off), and the
    /// next one to use; each is rendered when a minibatch takes it (a run of five 64-episode
    /// steps uses about 320 per agent of some 7,000).
    ptx: [(Vec<Vec<ChatMessage>>, usize); 2],
}

impl Server {
    /// Where the agents run.
    fn device(&self) -> tch::Device {
        self.agents[0].model.device()
    }
}

impl Server {
    fn new(job: RlServe) -> Result<Server, ModelError> {
        let dev = crate::job::device(job.device)?;
        let [go, oo] = agent_optims(&job);
        let (g, o, refs) = match &job.lora {
            _ if job.sample_only => {
                // Each checkpoint once, in the compute dtype, decoding from its own weights;
                // the "references" are shares of the agents (never sampled: see `handle`).
                let kind = job.precision.compute_kind(dev).unwrap_or(Kind::Float);
                let load = |dir: &PathBuf, role, system: &str, optim| {
                    let m = Qwen2::load_for_sampling(dir, dev, kind)?;
                    TrainableAgent::with_model(dir, role, system, m, optim)
                };
                let g = load(&job.generator, Role::Generator, &job.generator_system, go)?;
                let o = load(&job.optimizer, Role::Optimizer, &job.optimizer_system, oo)?;
                let refs = [g.model.share()?, o.model.share()?];
                (g, o, refs)
            }
            None => {
                let load = |dir: &PathBuf, role, system: &str, optim| {
                    TrainableAgent::load(dir, role, system, dev, job.precision, optim)
                };
                let g = load(&job.generator, Role::Generator, &job.generator_system, go)?;
                let o = load(&job.optimizer, Role::Optimizer, &job.optimizer_system, oo)?;
                // The references in the compute dtype: a float32 model computing in bf16 casts
                // each weight to bf16 as it reads it, so the logits are the same, at half the
                // memory and without the casts.
                let kind = job.precision.compute_kind(dev).unwrap_or(Kind::Float);
                let frozen = |dir: &PathBuf| -> Result<Qwen2, ModelError> {
                    let mut m = Qwen2::load(dir, dev, kind)?;
                    m.vs.freeze();
                    Ok(m)
                };
                (g, o, [frozen(&job.generator)?, frozen(&job.optimizer)?])
            }
            Some(cfg) => {
                // One frozen base per distinct checkpoint, in the compute dtype and fused in
                // place; the agents and their references are shares of it, and the agents
                // decode from it with their adapters beside (no merged copy).
                let compute = job.precision.compute_kind(dev);
                let base = |dir: &PathBuf| -> Result<Qwen2, ModelError> {
                    let mut m = Qwen2::load(dir, dev, compute.unwrap_or(Kind::Float))?;
                    m.fuse_in_place();
                    Ok(m)
                };
                let base_g = base(&job.generator)?;
                let base_o = if job.optimizer == job.generator {
                    base_g.share()?
                } else {
                    base(&job.optimizer)?
                };
                let agent = |base: &Qwen2, dir: &PathBuf, role, system: &str, optim| {
                    let mut m = base.share()?;
                    m.attach_lora(cfg)?;
                    m.set_compute_kind(compute);
                    TrainableAgent::with_model(dir, role, system, m, optim)
                };
                let g = agent(
                    &base_g,
                    &job.generator,
                    Role::Generator,
                    &job.generator_system,
                    go,
                )?;
                let o = agent(
                    &base_o,
                    &job.optimizer,
                    Role::Optimizer,
                    &job.optimizer_system,
                    oo,
                )?;
                (g, o, [base_g.share()?, base_o.share()?])
            }
        };
        let critics = match job.algorithm {
            Algorithm::Grpo => None,
            Algorithm::Ppo => Some([
                ValueHead::new(g.model.config.hidden_size, dev, job.value_lr)?,
                ValueHead::new(o.model.config.hidden_size, dev, job.value_lr)?,
            ]),
        };
        let ptx = match &job.ptx {
            None => [(Vec::new(), 0), (Vec::new(), 0)],
            Some(p) => {
                let load = |path: &PathBuf| -> Result<_, ModelError> {
                    let mut rows: Vec<Option<Vec<ChatMessage>>> = crate::job::read_lines(path)?
                        .into_iter()
                        .map(Some)
                        .collect();
                    let order = crate::train::shuffled(rows.len(), p.seed);
                    let rows = order.into_iter().filter_map(|i| rows[i].take()).collect();
                    Ok((rows, 0))
                };
                [load(&p.generator)?, load(&p.optimizer)?]
            }
        };
        Ok(Server {
            agents: [g, o],
            refs,
            critics,
            kept: BTreeMap::new(),
            next_id: 0,
            job,
            ptx,
        })
    }

    fn handle(&mut self, req: Request, out: &mut dyn Write) -> Result<Option<Reply>, ModelError> {
        let t0 = Instant::now();
        Ok(Some(match req {
            Request::Generate {
                agent,
                conversations,
                max_new_tokens,
                temperature,
                top_p,
                seed,
                stream,
                reference,
                launchers,
            } => {
                let p = crate::job::sample_params(max_new_tokens, temperature, top_p, seed);
                let a = &self.agents[agent.index()];
                // A sampling-only agent is its own reference (the same weights, and its
                // decoder needs no copy).
                let model = if reference && !self.job.sample_only {
                    &self.refs[agent.index()]
                } else {
                    &a.model
                };
                let comps = a.generate_streaming_with(
                    model,
                    &conversations,
                    &p,
                    &launchers,
                    &mut |i, text| {
                        if stream {
                            let text = text.to_string();
                            write_reply(out, &Reply::Partial { index: i, text });
                        }
                    },
                )?;
                let values: Option<Vec<f64>> = match &self.critics {
                    Some(c) if !comps.is_empty() && !reference => {
                        let prompts: Vec<&[i64]> =
                            comps.iter().map(|c| c.prompt_ids.as_slice()).collect();
                        let st = TrainableAgent::prompt_states(&a.model, &prompts)?;
                        let v = tch::no_grad(|| c[agent.index()].values(&st));
                        Some(Vec::<f64>::try_from(v.to_kind(Kind::Double))?)
                    }
                    _ => None,
                };
                let out = self.completions(agent, comps, values.as_deref(), reference, temperature);
                Reply::Generated(Generated {
                    completions: out,
                    seconds: t0.elapsed().as_secs_f64(),
                    gpu_memory: None,
                })
            }
            Request::Update { .. } if self.job.sample_only => {
                return Err(ModelError::Generate(
                    "`update` on a trainer started with `sample_only`: it only samples".into(),
                ));
            }
            Request::Update { agent, samples } => {
                let mut st = self.update(agent, &samples)?;
                self.kept.retain(|_, k| k.role != agent);
                st.seconds = t0.elapsed().as_secs_f64();
                Reply::Updated(st)
            }
            Request::Save { dir } => {
                for a in &self.agents {
                    let name = a.role.as_str();
                    a.save(&dir.join(name))?;
                    if let Some(cfg) = &self.job.lora {
                        a.model
                            .save_lora(&dir.join(format!("{name}_adapter")), cfg)?;
                    }
                }
                Reply::Saved {
                    seconds: t0.elapsed().as_secs_f64(),
                }
            }
            Request::SaveState { dir } => {
                self.save_state(&dir)?;
                Reply::Saved {
                    seconds: t0.elapsed().as_secs_f64(),
                }
            }
            Request::LoadState { dir } => {
                self.load_state(&dir)?;
                Reply::Saved {
                    seconds: t0.elapsed().as_secs_f64(),
                }
            }
            Request::Quit => return Ok(None),
        }))
    }

    /// The reply's completions for one `generate` request, numbering and keeping (for the
    /// next `update`) every sample of the policy; reference samples get no id.
    fn completions(
        &mut self,
        agent: Role,
        comps: Vec<Completion>,
        values: Option<&[f64]>,
        reference: bool,
        temperature: f64,
    ) -> Vec<cudarl_protocol::Completion> {
        let mut out = Vec::new();
        for (ci, c) in comps.into_iter().enumerate() {
            let lp = &c.log_probs;
            let forced = c.forced.map_or(0, |(_, n)| n);
            // Reference samples are not kept: no id, nothing to train on.
            let id = (!reference).then(|| {
                self.next_id += 1;
                self.next_id - 1
            });
            out.push(cudarl_protocol::Completion {
                id,
                text: c.text.clone(),
                tokens: c.ids.len(),
                finish: c.finish,
                mean_log_prob: lp.iter().map(|x| f64::from(*x)).sum::<f64>()
                    / lp.len().saturating_sub(forced).max(1) as f64,
                value: values.map(|v| v[ci]),
                forced_tokens: forced,
            });
            // Nothing to keep where no update can come.
            if let Some(id) = id.filter(|_| !self.job.sample_only) {
                self.kept.insert(
                    id,
                    Kept {
                        role: agent,
                        completion: c,
                        temperature,
                    },
                );
            }
        }
        out
    }

    /// `dir/<agent>.safetensors` ([`TrainableAgent::save_state`]), PPO's critics as
    /// `dir/critic_<agent>.safetensors` ([`AdamW::save`]), and `dir/server.json` with the
    /// PPO-ptx positions.
    fn save_state(&self, dir: &Path) -> Result<(), ModelError> {
        let io = |p: &Path| {
            let p = p.display().to_string();
            move |e| ModelError::Io(p, e)
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        for (i, a) in self.agents.iter().enumerate() {
            let (own, critic) = state_files(dir, a.role);
            a.save_state(&own)?;
            if let Some(c) = &self.critics {
                c[i].opt.save(&critic)?;
            }
        }
        let s = dir.join("server.json");
        let text = serde_json::json!({ "ptx_next": [self.ptx[0].1, self.ptx[1].1] }).to_string();
        std::fs::write(&s, text).map_err(io(&s))
    }

    /// Reads what [`Server::save_state`] wrote.
    fn load_state(&mut self, dir: &Path) -> Result<(), ModelError> {
        for (i, a) in self.agents.iter_mut().enumerate() {
            let (own, critic) = state_files(dir, a.role);
            a.load_state(&own)?;
            if let Some(c) = &mut self.critics {
                c[i].opt.load(&critic)?;
            }
        }
        let s = dir.join("server.json");
        let text =
            std::fs::read_to_string(&s).map_err(|e| ModelError::Io(s.display().to_string(), e))?;
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        for (i, slot) in self.ptx.iter_mut().enumerate() {
            let next = v["ptx_next"][i]
                .as_u64()
                .ok_or_else(|| ModelError::Weights {
                    file: s.display().to_string(),
                    message: format!("no integer `ptx_next[{i}]`"),
                })?;
            slot.1 = next as usize;
        }
        Ok(())
    }

    fn update(&mut self, agent: Role, samples: &[Sample]) -> Result<UpdateStats, ModelError> {
        let items = self.update_items(agent, samples)?;
        let mut st = UpdateStats::default();
        if items.is_empty() {
            return Ok(st);
        }
        let mb = self.job.minibatch.max(1);
        let (a, r) = (&mut self.agents[agent.index()], &self.refs[agent.index()]);
        let critic = self.critics.as_mut().map(|c| &mut c[agent.index()]);
        let mut n_mb = 0.0;
        let batches = minibatches(&self.kept, &items, mb, a.model.device());
        let fixed = fixed_log_probs(&a.model, r, &batches, &mut st)?;
        let mut step = UpdateStep {
            a,
            critic,
            ptx: &mut self.ptx[agent.index()],
            job: &self.job,
            pass: ScorePass {
                checkpoint: self.job.gradient_checkpointing,
                ..ScorePass::default()
            },
        };
        let passes = self.job.epochs.max(1);
        let order = (0..passes).flat_map(|_| 0..batches.len());
        for (k, ci) in order.enumerate() {
            if !step.minibatch(k, &batches[ci], &fixed[ci], &mut st)? {
                st.skipped_minibatches = passes * batches.len() - k;
                break;
            }
            n_mb += 1.0;
        }
        // Entropy was measured on every minibatch, the rest on those that stepped.
        st.entropy /= batches.len() as f64;
        for x in [
            &mut st.loss,
            &mut st.pg_loss,
            &mut st.kl,
            &mut st.clip_frac,
            &mut st.grad_norm,
            &mut st.value_loss,
            &mut st.ptx_loss,
            &mut st.aux_scale,
        ] {
            *x /= n_mb;
        }
        st.samples = items.len();
        Ok(st)
    }

    /// The kept completions `samples` name for an update of `agent`, as (id, advantage,
    /// return; 0 without one), those with no tokens left out.
    ///
    /// # Errors
    /// An id not kept, kept for the other agent, or without a return under PPO.
    fn update_items(
        &self,
        agent: Role,
        samples: &[Sample],
    ) -> Result<Vec<(u64, f64, f64)>, ModelError> {
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
            if self.critics.is_some() && s.ret.is_none() {
                return Err(ModelError::Generate(format!(
                    "update: PPO needs a `return` for completion {}",
                    s.id
                )));
            }
            if !k.completion.ids.is_empty() {
                items.push((s.id, s.advantage, s.ret.unwrap_or(0.0)));
            }
        }
        Ok(items)
    }
}

/// The minibatches of an update once: `items` (id, advantage, return) in chunks of `mb`, each
/// with its kept (prompt, completion) pairs, sampling temperature, and advantages and returns
/// `[b]` on `device`.
fn minibatches<'k>(
    kept: &'k BTreeMap<u64, Kept>,
    items: &[(u64, f64, f64)],
    mb: usize,
    device: tch::Device,
) -> Vec<Minibatch<'k>> {
    items
        .chunks(mb)
        .map(|chunk| {
            let seqs = chunk
                .iter()
                .map(|(id, _, _)| {
                    let c = &kept[id].completion;
                    (c.prompt_ids.as_slice(), c.ids.as_slice())
                })
                .collect();
            let adv: Vec<f32> = chunk.iter().map(|(_, a, _)| *a as f32).collect();
            let adv = Tensor::from_slice(&adv).to_device(device);
            let ret: Vec<f32> = chunk.iter().map(|(_, _, r)| *r as f32).collect();
            let ret = Tensor::from_slice(&ret).to_device(device);
            let forced = chunk
                .iter()
                .map(|(id, _, _)| kept[id].completion.forced)
                .collect();
            (seqs, kept[&chunk[0].0].temperature, adv, ret, forced)
        })
        .collect()
}

/// The old (`model`'s) and reference (`r`'s) log-probabilities `[b, T]` of every minibatch,
/// without gradients, adding each minibatch's mean entropy per token to `st.entropy`.
///
/// # Errors
/// libtorch errors.
fn fixed_log_probs(
    model: &Qwen2,
    r: &Qwen2,
    batches: &[Minibatch<'_>],
    st: &mut UpdateStats,
) -> Result<Vec<(Tensor, Tensor)>, ModelError> {
    let score = |m: &Qwen2, (seqs, temp, _, _, forced): &Minibatch<'_>, entropy: bool| {
        let _g = tch::no_grad_guard();
        let mut sc = Scored::new(m, seqs, *temp, ScorePass::default())?;
        sc.exclude(forced);
        let (logp, ent, _) = sc.log_probs(m, entropy)?;
        Ok::<_, ModelError>((logp, ent, sc.mask))
    };
    let mut fixed = Vec::new();
    for mb in batches {
        let (old, ent, mask) = score(model, mb, true)?;
        let (rf, _, _) = score(r, mb, false)?;
        if let Some(ent) = ent {
            st.entropy +=
                (ent.sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0)).double_value(&[]);
        }
        fixed.push((old, rf));
    }
    Ok(fixed)
}

/// What the minibatch steps of one update share: the agent trained, its critic (PPO), its
/// PPO-ptx conversations with the next to use, the job and the scoring pass.
struct UpdateStep<'s> {
    a: &'s mut TrainableAgent,
    critic: Option<&'s mut ValueHead>,
    ptx: &'s mut (Vec<Vec<ChatMessage>>, usize),
    job: &'s RlServe,
    pass: ScorePass,
}

/// One minibatch's scoring pass with the policy gradient taken: the mask `[b, T]`, the
/// trained parameters, the prompts' last states `[b, h]` (PPO), the policy gradient per
/// parameter and the scoring kept for the KL's own pass (with `pg.aux_grad_cap`), and the
/// log-probabilities `[b, T]` with the other gradients.
struct FusedStep {
    mask: Tensor,
    params: Vec<Tensor>,
    state: Option<Tensor>,
    g_pg: Option<Vec<Option<Tensor>>>,
    scored: Option<Scored>,
    fused: crate::score::Fused,
}

impl UpdateStep<'_> {
    /// The `k`th step of the update, on minibatch `mb` with its old and reference
    /// log-probabilities `fixed`, its stats added to `st`; `false`, with nothing stepped, when
    /// the policy has moved past `target_kl` (not on the first step).
    ///
    /// # Errors
    /// libtorch errors; a PPO-ptx conversation that does not render.
    fn minibatch(
        &mut self,
        k: usize,
        mb: &Minibatch<'_>,
        (old, rf): &(Tensor, Tensor),
        st: &mut UpdateStats,
    ) -> Result<bool, ModelError> {
        let (_, _, adv, ret, _) = mb;
        let fp = self.fused_pass(mb, old, rf)?;
        let (logp, mask) = (fp.fused.logp, &fp.mask);
        // How far this update has moved the policy on these completions (k1 estimator).
        let approx_kl = (((old - &logp) * mask).sum(Kind::Float)
            / mask.sum(Kind::Float).clamp_min(1.0))
        .double_value(&[]);
        st.max_approx_kl = st.max_approx_kl.max(approx_kl);
        if k > 0
            && self
                .job
                .target_kl
                .is_some_and(|t| approx_kl > TARGET_KL_MARGIN * t)
        {
            // The gradients this minibatch took are dropped, not stepped.
            self.a.abandon_step();
            return Ok(false);
        }
        if let (Some(scored), Some(d_kl)) = (fp.scored, fp.fused.rest.first()) {
            scored.backward(&self.a.model, d_kl)?;
        }
        let s =
            tch::no_grad(|| clipped_pg_loss(&logp, old, Some(rf), adv, mask, &self.job.pg).stats);
        let ptx = self.ptx_batch()?;
        if let (Some(c), Some(state)) = (self.critic.as_deref_mut(), fp.state) {
            // Value loss: 0.5 * mean (V(s) - return)^2, on the critic's own parameters.
            let vl = (c.values(&state) - ret).square().mean(Kind::Float) * 0.5;
            c.opt.zero_grad();
            vl.f_backward()?;
            c.opt.step();
            st.value_loss += vl.double_value(&[]);
        }
        if let Some((ex, max_len, loss)) = ptx {
            let b: Vec<&Example> = ex.iter().collect();
            let (nll, _) = crate::train::chunked_loss(&self.a.model, &b, max_len, loss)?;
            st.ptx_loss += nll;
        }
        if let (Some(cap), Some(g)) = (self.job.pg.aux_grad_cap, &fp.g_pg) {
            let c = crate::rl::cap_auxiliary(g, &fp.params, cap)?;
            st.aux_scale += c.scale;
            st.max_aux_grad_ratio = st.max_aux_grad_ratio.max(c.ratio);
        }
        st.grad_norm += self.a.finish_step();
        st.loss += s.loss;
        st.pg_loss += s.pg_loss;
        st.kl += s.kl;
        st.max_ref_log_ratio = st.max_ref_log_ratio.max(s.max_log_ratio);
        st.clip_frac += s.clip_frac;
        st.tokens += s.tokens;
        st.steps += 1;
        Ok(true)
    }

    /// Scores minibatch `mb` with gradients and starts the agent's step: the loss's gradients
    /// with respect to the log-probabilities in closed form, taken chunk by chunk in the
    /// head's one pass; the policy gradient apart when the auxiliary terms' is capped against
    /// it.
    ///
    /// # Errors
    /// libtorch errors.
    fn fused_pass(
        &mut self,
        (seqs, temp, adv, _, forced): &Minibatch<'_>,
        old: &Tensor,
        rf: &Tensor,
    ) -> Result<FusedStep, ModelError> {
        let a = &mut *self.a;
        let mut scored = Scored::new(&a.model, seqs, *temp, self.pass)?;
        scored.exclude(forced);
        let mask = scored.mask.shallow_clone();
        a.begin_step();
        let params = a.model.trainable().trainable_variables();
        let pg_cfg = self.job.pg;
        let capped = pg_cfg.aux_grad_cap.is_some();
        let grads = |logp: &Tensor| -> Result<Vec<Tensor>, ModelError> {
            let (d_pg, d_kl) =
                crate::rl::clipped_pg_grads(logp, old, Some(rf), adv, &mask, &pg_cfg);
            Ok(if capped {
                vec![d_pg, d_kl]
            } else {
                vec![d_pg + d_kl]
            })
        };
        let state = self.critic.is_some().then(|| scored.state(&a.model));
        let (g_pg, fused, scored) = if capped {
            let (g, f) = scored.gradients_fused(&a.model, &grads, &params)?;
            (Some(g), f, Some(scored))
        } else {
            (None, scored.backward_fused(&a.model, &grads)?, None)
        };
        Ok(FusedStep {
            mask,
            params,
            state,
            g_pg,
            scored,
            fused,
        })
    }

    /// PPO-ptx on the next `batch` SFT conversations of this agent, cycled: the examples, their
    /// most tokens and the loss pass; `None` when off.
    ///
    /// # Errors
    /// A conversation that does not render.
    fn ptx_batch(
        &mut self,
    ) -> Result<Option<(Vec<Example>, usize, crate::train::LossPass)>, ModelError> {
        Ok(match &self.job.ptx {
            Some(p) if p.batch > 0 && !self.ptx.0.is_empty() => {
                let (rows, next) = &mut *self.ptx;
                let take: Vec<&Vec<ChatMessage>> = (0..p.batch)
                    .map(|j| &rows[(*next + j) % rows.len()])
                    .collect();
                *next = (*next + p.batch) % rows.len();
                let ex = crate::train::chat_examples(&self.a.tokenizer, &take)?;
                let loss = crate::train::LossPass {
                    chunk_bytes: crate::train::CE_CHUNK_BYTES,
                    backward: true,
                    checkpoint: self.pass.checkpoint,
                    grad_scale: p.coef,
                };
                Some((ex, p.max_len, loss))
            }
            _ => None,
        })
    }
}

/// One minibatch of an update: (prompt, completion) token pairs, the sampling temperature,
/// the advantages `[b]`, the value targets `[b]` (PPO; zeros with GRPO), and each
/// completion's tokens written by constrained decoding (`(start, len)`, left out of the loss).
type Minibatch<'a> = (
    Vec<(&'a [i64], &'a [i64])>,
    f64,
    Tensor,
    Tensor,
    Vec<Option<(usize, usize)>>,
);

/// Runs the request loop on stdin/stdout until `quit` or end of input.
///
/// # Errors
/// The agents cannot be loaded (bad checkpoint, named).
pub fn serve(job: &RlServe) -> Result<(), ModelError> {
    let mut server = Server::new(job.clone())?;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    write_reply(&mut out, &Reply::Ready);
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Request>(&line) {
            Err(e) => Reply::Error(format!("bad request: {e}")),
            // The GPU, shared, for the request (generate, update, save): the harness's timing
            // waits between requests.
            Ok(req) => match crate::GpuShare::hold(server.device()).and_then(|_gpu| {
                // The request's GPU memory, read before the GPU is shared again.
                let dev = server.device();
                crate::cuda_graph::gpu_memory(dev, true);
                let mut r = server.handle(req, &mut out)?;
                let m = crate::cuda_graph::gpu_memory(dev, false);
                crate::cuda_graph::release_cached_memory(dev);
                match &mut r {
                    Some(Reply::Generated(g)) => g.gpu_memory = m,
                    Some(Reply::Updated(u)) => u.gpu_memory = m,
                    _ => {}
                }
                Ok(r)
            }) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => Reply::Error(e.to_string()),
            },
        };
        write_reply(&mut out, &reply);
    }
    Ok(())
}

/// One reply line, flushed.
fn write_reply(out: &mut dyn Write, r: &Reply) {
    let _ = writeln!(
        out,
        "{}",
        serde_json::to_string(r).expect("reply serializes")
    );
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SampleParams;
    use serde_json::Value;
    use std::path::Path;

    /// A `generate` reply's body as JSON (for indexing in tests).
    fn generated(r: Option<Reply>) -> Value {
        match r {
            Some(Reply::Generated(g)) => serde_json::to_value(g).unwrap(),
            other => panic!("expected a generated reply: {other:?}"),
        }
    }

    fn job(extra: &str) -> RlServe {
        serde_json::from_str(&format!(
            r#"{{"generator": "g", "optimizer": "o", "generator_system": "s", "optimizer_system": "t",
                "device": "cpu", "lr": 2e-5, "pg": {{"clip": 0.2, "kl_coef": 0.04}},
                "minibatch": 8, "warmup": 3{extra}}}"#
        ))
        .unwrap()
    }

    /// A tiny random Qwen2 checkpoint with its BPE tokenizer in `dir` (Hugging Face layout).
    fn tiny_checkpoint(dir: &Path) {
        use crate::{Qwen2Config, tokenizer::ChatTokenizer};
        std::fs::create_dir_all(dir).unwrap();
        let texts: Vec<String> = (0..64)
            .map(|i| format!("__global__ void k{i}(float* x) {{ x[threadIdx.x] *= {i}.5f; }}"))
            .collect();
        let tp = dir.join("tokenizer.json");
        crate::tokenizer::train_bpe(&texts, 400, &tp).unwrap();
        let vocab = ChatTokenizer::load(&tp).unwrap().vocab_size();
        // Seeding libtorch's global generator while another test samples would change that
        // test's samples (`cargo test` runs tests as threads): take turns. No caller holds it.
        let _rng = crate::torch_rng();
        tch::manual_seed(0);
        let cfg = Qwen2Config::new(vocab as i64, 32, 64, 1, 2, 1, 256, true);
        Qwen2::new(cfg, tch::Device::Cpu)
            .unwrap()
            .save(dir)
            .unwrap();
    }

    /// [`tiny_checkpoint`] in a fresh temporary directory (kept alive by the first value).
    fn tiny_model() -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let m = d.path().join("m");
        tiny_checkpoint(&m);
        (d, m)
    }

    /// Four completions of the generator for "Write k." (seed `seed`, temperature 1), from the
    /// policy or from its frozen reference.
    fn generate4(s: &mut Server, max_new_tokens: usize, seed: i64, reference: bool) -> Value {
        let req = Request::Generate {
            agent: Role::Generator,
            conversations: vec![vec![ChatMessage::new("user", "Write k.")]; 4],
            max_new_tokens,
            temperature: 1.0,
            top_p: 1.0,
            seed,
            stream: false,
            reference,
            launchers: Vec::new(),
        };
        generated(s.handle(req, &mut Vec::new()).unwrap())
    }

    /// Advantages +1, -1, +1, -1 for a `generate` answer's completions.
    fn alternating(r: &Value) -> Vec<Sample> {
        r["completions"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, c)| Sample {
                id: c["id"].as_u64().unwrap(),
                advantage: if i % 2 == 0 { 1.0 } else { -1.0 },
                ret: None,
            })
            .collect()
    }

    #[test]
    fn constrained_decoding_writes_the_tail_and_an_update_leaves_it_out() {
        let (_d, m) = tiny_model();
        let _rng = crate::torch_rng();
        let mut j = job("");
        (j.generator, j.optimizer) = (m.clone(), m.clone());
        let mut s = Server::new(j).unwrap();
        let a = &s.agents[0];
        let conv = vec![ChatMessage::new("user", "Write k.")];
        let prompt = a.tokenizer.render(&a.with_system(&conv), true).unwrap().0;
        // Three rows of one prompt: row 0 free, rows 1 and 2 held to a rule each.
        let sample = |seed: i64, rules: &[Option<(&str, &str)>]| {
            let params = crate::job::sample_params(48, 1.0, 1.0, seed);
            let mut seen = Vec::new();
            let c = a
                .sample_constrained(
                    &a.model,
                    vec![prompt.clone(); 3],
                    &params,
                    rules,
                    &mut |i, t| seen.push((i, t.to_string())),
                )
                .unwrap();
            seen.sort();
            (c, seen)
        };
        let text = |ids: &[i64]| a.tokenizer.decode(ids).unwrap();
        // A trigger for a row: the text of two tokens it draws at `k`, printable ASCII and not
        // in the answer before them (the random model draws raw bytes too).
        let trigger_at = |ids: &[i64], k: usize| {
            let t = text(&ids[k - 2..k]);
            let ok = t.len() >= 2
                && t.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
                && !text(&ids[..k - 1]).contains(&t)
                && text(&ids[..k]).starts_with(&text(&ids[..k - 1]));
            ok.then_some((k, t))
        };
        let first =
            |ids: &[i64], from: usize| (from..ids.len().min(16)).find_map(|k| trigger_at(ids, k));
        let (seed, free, (k1, t1), (k2, t2)) = (11..300)
            .find_map(|seed| {
                let (free, _) = sample(seed, &[None, None, None]);
                let r1 = first(&free[1].ids, 3)?;
                let r2 = first(&free[2].ids, r1.0 + 2)?;
                Some((seed, free, r1, r2))
            })
            .expect("a seed draws printable pairs of tokens in rows 1 and 2");
        let tail = " int64_t n)";
        let rules = [None, Some((t1.as_str(), tail)), Some((t2.as_str(), tail))];
        let (c, seen) = sample(seed, &rules);
        // The free row draws what it drew without the others' rules.
        assert_eq!(c[0].ids, free[0].ids);
        assert!(c[0].forced.is_none());
        for (r, k, trigger) in [(1, k1, &t1), (2, k2, &t2)] {
            let c = &c[r];
            // The drawn tokens before the one that completed the trigger are kept; that
            // token's text through the trigger and the tail are written.
            let (start, len) = c.forced.expect("the trigger was drawn");
            assert_eq!(start, k - 1);
            assert_eq!(&c.ids[..start], &free[r].ids[..start]);
            let full = text(&free[r].ids[..k]);
            let through = &full[..full.find(trigger.as_str()).unwrap() + trigger.len()];
            assert_eq!(text(&c.ids[..start + len]), format!("{through}{tail}"));
            assert!(
                c.text.starts_with(&format!("{through}{tail}")),
                "{:?}",
                c.text
            );
            assert!(c.log_probs[start..start + len].iter().all(|x| *x == 0.0));
            assert_eq!(c.ids.len(), c.log_probs.len());
            // Each row within its own budget, decoded on after the tail.
            assert!(
                c.ids.len() <= 48 && c.finish != crate::Finish::Stop,
                "{c:?}"
            );
            assert!(c.ids.len() > start + len, "decoding went on after the tail");
        }
        let want: Vec<(usize, String)> = c
            .iter()
            .enumerate()
            .map(|(i, x)| (i, x.text.clone()))
            .collect();
        assert_eq!(seen, want, "one finish per row, with its whole answer");
        // A rule list that does not match the conversations is refused.
        let conv3 = vec![conv.clone(); 3];
        let p = crate::job::sample_params(4, 1.0, 1.0, 1);
        let two = vec!["void launch(int n)".to_string(); 2];
        assert!(
            a.generate_streaming_with(&a.model, &conv3, &p, &two, &mut |_, _| {})
                .is_err()
        );
        // A task's declaration: its parameters through `)` are written.
        assert_eq!(
            crate::agent::launcher_tail(
                "extern \"C\" void launch(const float* x, float* out, int64_t n, cudaStream_t stream);"
            ),
            Some("const float* x, float* out, int64_t n, cudaStream_t stream)")
        );
        assert_eq!(crate::agent::launcher_tail("void run(int n)"), None);
        // An update counts every drawn token of the kept completions and none it wrote.
        let r = generate4(&mut s, 12, 1, false);
        let ids: Vec<u64> = r["completions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_u64().unwrap())
            .collect();
        let lens: Vec<usize> = ids
            .iter()
            .map(|id| s.kept[id].completion.ids.len())
            .collect();
        s.kept.get_mut(&ids[0]).unwrap().completion.forced = Some((1, lens[0] - 1));
        let st = s.update(Role::Generator, &alternating(&r)).unwrap();
        let drawn = 1 + lens[1..].iter().sum::<usize>();
        assert_eq!(st.tokens as usize, drawn, "{st:?}");
    }

    /// One `generate` of 4 completions from the checkpoint in `m`, then an `update` of the
    /// generator with advantages +1, -1, +1, -1 at a large learning rate, one completion per
    /// minibatch, `epochs` passes.
    fn update_with(m: &Path, target_kl: Option<f64>, epochs: usize) -> UpdateStats {
        let _rng = crate::torch_rng();
        let mut j = job("");
        (j.generator, j.optimizer) = (m.to_path_buf(), m.to_path_buf());
        (j.lr, j.minibatch, j.warmup, j.target_kl, j.epochs) = (1e-2, 1, 0, target_kl, epochs);
        let mut s = Server::new(j).unwrap();
        let r = generate4(&mut s, 12, 1, false);
        let st = s.update(Role::Generator, &alternating(&r)).unwrap();
        assert_eq!(st.samples, 4, "every completion has tokens");
        st
    }

    #[test]
    fn activation_checkpointing_leaves_an_update_as_it_was() {
        let (_d, m) = tiny_model();
        let _rng = crate::torch_rng();
        let run = |lora: &str, checkpoint: bool, cap: Option<f64>| {
            let mut j = job(lora);
            (j.generator, j.optimizer) = (m.clone(), m.clone());
            (j.lr, j.minibatch, j.warmup) = (1e-2, 2, 0);
            (j.gradient_checkpointing, j.pg.aux_grad_cap) = (checkpoint, cap);
            let mut s = Server::new(j).unwrap();
            let r = generate4(&mut s, 12, 1, false);
            let st = s.update(Role::Generator, &alternating(&r)).unwrap();
            let trained = s.agents[0].model.trainable().trainable_variables();
            let flat: Vec<Tensor> = trained.iter().map(|v| v.detach().reshape([-1])).collect();
            (st, Tensor::cat(&flat, 0))
        };
        // Full fine-tuning, and LoRA adapters on a frozen base (whose embedding takes no
        // gradient); the auxiliary gradient apart (capped) or summed.
        for lora in ["", r#", "lora": {"r": 4, "alpha": 8}"#] {
            for cap in [None, Some(1.0)] {
                let (plain, w0) = run(lora, false, cap);
                let (ck, w1) = run(lora, true, cap);
                assert_eq!((plain.steps, ck.steps), (2, 2));
                let what = format!("lora `{lora}`, cap {cap:?}: {plain:?} vs {ck:?}");
                for (a, b) in [
                    (plain.loss, ck.loss),
                    (plain.kl, ck.kl),
                    (plain.grad_norm, ck.grad_norm),
                    (plain.aux_scale, ck.aux_scale),
                    (plain.max_approx_kl, ck.max_approx_kl),
                ] {
                    assert!((a - b).abs() < 1e-5 * (1.0 + a.abs()), "{what}");
                }
                assert!(plain.grad_norm > 0.0, "{what}");
                let moved = (&w0 - &w1).abs().max().double_value(&[]);
                assert!(moved < 1e-5, "{what}: the weights differ by {moved}");
            }
        }
    }

    #[test]
    fn target_kl_stops_an_update_once_the_policy_has_moved() {
        let (_d, m) = tiny_model();
        let all = update_with(&m, None, 1);
        assert_eq!((all.skipped_minibatches, all.steps), (0, 4));
        // Each step at lr 1e-2 moves the policy: the approximate KL from the generating policy
        // is well above float noise (about 1e-8) after the first step.
        assert!(all.max_approx_kl > 1e-5, "{}", all.max_approx_kl);
        let stopped = update_with(&m, Some(all.max_approx_kl / 100.0), 1);
        assert!(
            (1..=3).contains(&stopped.skipped_minibatches),
            "the first minibatch steps, a later one stops: {stopped:?}"
        );
        assert!(stopped.max_approx_kl > TARGET_KL_MARGIN * all.max_approx_kl / 100.0);
        let loose = update_with(&m, Some(all.max_approx_kl * 10.0), 1);
        assert_eq!(
            loose.skipped_minibatches, 0,
            "a target above what moved stops nothing"
        );
        assert_eq!(
            loose.max_approx_kl, all.max_approx_kl,
            "same seeds, same steps"
        );
    }

    #[test]
    fn epochs_pass_over_the_minibatches_again_against_the_sampling_policy() {
        let (_d, m) = tiny_model();
        let one = update_with(&m, None, 1);
        let two = update_with(&m, None, 2);
        assert_eq!((one.steps, two.steps), (4, 8), "{one:?} {two:?}");
        assert_eq!(two.samples, 4, "samples count once");
        // The second pass measures each completion against the policy that sampled it, after
        // four more steps: it has moved at least as far as anything the first pass saw.
        assert!(two.max_approx_kl > one.max_approx_kl, "{one:?} {two:?}");
        // A target between the two stops the second run within its second pass, and the
        // skipped count covers the steps of every pass left undone.
        let t = (one.max_approx_kl + two.max_approx_kl) / 2.0 / TARGET_KL_MARGIN;
        let stopped = update_with(&m, Some(t), 2);
        assert!(stopped.steps >= 4 && stopped.steps < 8, "{stopped:?}");
        assert_eq!(stopped.steps + stopped.skipped_minibatches, 8);
    }

    #[test]
    fn the_reference_samples_what_the_policy_sampled_before_it_moved() {
        let (_d, m) = tiny_model();
        let mut j = job("");
        (j.generator, j.optimizer) = (m.clone(), m.clone());
        (j.lr, j.minibatch, j.warmup) = (5e-2, 1, 0);
        let _rng = crate::torch_rng();
        let mut s = Server::new(j).unwrap();
        let generate = |s: &mut Server, reference: bool| generate4(s, 16, 7, reference);
        let texts = |v: &Value| -> Vec<String> {
            v["completions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["text"].as_str().unwrap().to_string())
                .collect()
        };
        let before = generate(&mut s, false);
        let samples = alternating(&before);
        let st = s.update(Role::Generator, &samples).unwrap();
        assert!(st.max_approx_kl > 1e-5, "the policy moved: {st:?}");
        let frozen = generate(&mut s, true);
        assert_eq!(
            texts(&frozen),
            texts(&before),
            "same seed, the unmoved reference"
        );
        assert!(
            frozen["completions"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["id"].is_null()),
            "reference samples are not kept for training"
        );
        let kept = s.kept.len();
        let after = generate(&mut s, false);
        assert_eq!(s.kept.len(), kept + 4, "policy samples are kept");
        assert_ne!(texts(&after), texts(&before), "the policy itself moved");
    }

    #[test]
    fn a_sampling_only_trainer_samples_what_a_training_one_does_holds_no_copy_and_refuses_updates()
    {
        let (_d, m) = tiny_model();
        let mut j = job("");
        (j.generator, j.optimizer) = (m.clone(), m.clone());
        let _rng = crate::torch_rng();
        let mut training = Server::new(j.clone()).unwrap();
        j.sample_only = true;
        let mut sampling = Server::new(j).unwrap();
        let a = generate4(&mut training, 16, 3, false);
        let b = generate4(&mut sampling, 16, 3, false);
        assert_eq!(a["completions"], b["completions"]);
        // Its reference is itself: the same samples.
        let r = generate4(&mut sampling, 16, 3, true);
        let texts = |v: &Value| {
            v["completions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["text"].clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(texts(&r), texts(&b));
        // No decoder copy, no AdamW state, nothing kept for an update that cannot come.
        for agent in &sampling.agents {
            let d = agent.model.decoder.lock().unwrap();
            assert!(!d.as_ref().is_some_and(|d| d.holds_a_copy()));
            assert!(agent.model.vs.trainable_variables().is_empty());
        }
        assert!(sampling.kept.is_empty());
        let req = Request::Update {
            agent: Role::Generator,
            samples: vec![],
        };
        let e = sampling.handle(req, &mut Vec::new()).err().unwrap();
        assert!(e.to_string().contains("sample_only"), "{e}");
    }

    /// Four generator completions (seed 1), then an update of the generator with advantage 0
    /// for each.
    fn zero_update(s: &mut Server) -> UpdateStats {
        let r = generate4(s, 8, 1, false);
        let zero: Vec<Sample> = alternating(&r)
            .into_iter()
            .map(|x| Sample {
                advantage: 0.0,
                ..x
            })
            .collect();
        s.update(Role::Generator, &zero).unwrap()
    }

    #[test]
    fn ptx_fits_each_agent_to_its_own_sft_data_during_an_update() {
        let (d, m) = tiny_model();
        let conv = |i: usize, role_text: &str| {
            serde_json::to_string(&vec![
                ChatMessage::new("user", format!("Write k{i}.")),
                ChatMessage::new(
                    "assistant",
                    format!("__global__ void k{i}(float* x) {{ x[threadIdx.x] *= {role_text}; }}"),
                ),
            ])
            .unwrap()
        };
        let write = |name: &str, text: &str| {
            let p = d.path().join(name);
            let lines: Vec<String> = (0..6).map(|i| conv(i, text)).collect();
            std::fs::write(&p, lines.join("\n") + "\n").unwrap();
            p
        };
        let (gp, op) = (write("g.jsonl", "2.5f"), write("o.jsonl", "x[0]"));
        let _rng = crate::torch_rng();
        let server_capped = |ptx: Option<Ptx>, cap: Option<f64>| {
            let mut j = job("");
            (j.generator, j.optimizer) = (m.clone(), m.clone());
            (j.lr, j.minibatch, j.warmup, j.ptx) = (1e-2, 1, 0, ptx);
            j.pg.aux_grad_cap = cap;
            Server::new(j).unwrap()
        };
        let server = |ptx: Option<Ptx>| server_capped(ptx, None);
        let ptx = Ptx {
            coef: 1.0,
            batch: 3,
            generator: gp,
            optimizer: op,
            max_len: 256,
            seed: 0,
        };
        let mut s = server(Some(ptx.clone()));
        assert_eq!((s.ptx[0].0.len(), s.ptx[1].0.len()), (6, 6));
        let sft_loss = |s: &Server, k: usize| {
            let _g = tch::no_grad_guard();
            let ex = crate::train::chat_examples(&s.agents[k].tokenizer, &s.ptx[k].0).unwrap();
            let ex: Vec<&Example> = ex.iter().collect();
            let (l, n) = crate::train::loss_of(&s.agents[k].model, &ex, 256).unwrap();
            assert!(n > 0, "assistant tokens are trained on");
            l.double_value(&[])
        };
        let (g0, o0) = (sft_loss(&s, 0), sft_loss(&s, 1));
        // Zero advantages and a policy equal to its reference: the policy-gradient and KL
        // terms give no gradient, so what moves the generator is its SFT data alone.
        let st = zero_update(&mut s);
        assert_eq!(st.steps, 4);
        assert!(st.ptx_loss > 0.0, "{st:?}");
        assert_eq!(
            s.ptx[0].1,
            (4 * 3) % 6,
            "the cursor cycles over the examples"
        );
        assert!(
            sft_loss(&s, 0) < g0 - 0.1,
            "the generator fitted its SFT data"
        );
        assert_eq!(sft_loss(&s, 1), o0, "the optimizer did not move");
        assert_eq!(
            (st.aux_scale, st.max_aux_grad_ratio),
            (0.0, 0.0),
            "no cap, no report"
        );
        // With the auxiliary gradient capped at the policy gradient's norm, a zero policy
        // gradient lets no SFT step through: PPO-ptx cannot outweigh it.
        let mut capped = server_capped(Some(ptx.clone()), Some(1.0));
        let st = zero_update(&mut capped);
        assert_eq!(st.steps, 4);
        assert_eq!(st.aux_scale, 0.0, "{st:?}");
        assert!(st.max_aux_grad_ratio > 1e6, "{st:?}");
        assert_eq!(sft_loss(&capped, 0), g0, "the generator did not move");
        // Without ptx the same update moves nothing and reports no SFT loss.
        let mut plain = server(None);
        let st = zero_update(&mut plain);
        assert_eq!(st.ptx_loss, 0.0);
        assert!(st.max_approx_kl.abs() < 1e-4, "{st:?}");
    }

    /// Fraction of a completion's non-space characters that are ASCII digits: a verifiable
    /// reward the tiny random model earns some of by chance (its BPE was trained on text with
    /// numbers in it), so a GRPO group has spread from the first step.
    fn digit_share(text: &str) -> f64 {
        let chars: Vec<char> = text.chars().filter(|c| !c.is_whitespace()).collect();
        chars.iter().filter(|c| c.is_ascii_digit()).count() as f64 / chars.len().max(1) as f64
    }

    /// `steps` GRPO steps of the generator on one prompt through the server's own protocol
    /// (`generate` 16 completions at temperature 1, group-normalized advantages of
    /// [`digit_share`], `update`), each step's completions also drawn from the frozen reference
    /// with the same seed (the control of `rl-train.control`). Returns the policy's and the
    /// control's mean reward per step. `sign` -1 pays the opposite of the reward.
    fn digit_grpo(m: &Path, steps: i64, sign: f64) -> (Vec<f64>, Vec<f64>) {
        digit_grpo_with(m, steps, sign, "", 1e-2)
    }

    /// [`digit_grpo`] with `extra` job fields and learning rate `lr`.
    fn digit_grpo_with(
        m: &Path,
        steps: i64,
        sign: f64,
        extra: &str,
        lr: f64,
    ) -> (Vec<f64>, Vec<f64>) {
        let _rng = crate::torch_rng();
        let mut j = job(extra);
        (j.generator, j.optimizer) = (m.to_path_buf(), m.to_path_buf());
        (j.lr, j.minibatch, j.warmup) = (lr, 16, 0);
        let mut s = Server::new(j).unwrap();
        let (mut policy, mut control) = (Vec::new(), Vec::new());
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        for step in 0..steps {
            let generate = |s: &mut Server, reference: bool| {
                let req = Request::Generate {
                    agent: Role::Generator,
                    conversations: vec![vec![ChatMessage::new("user", "Write k.")]; 16],
                    max_new_tokens: 8,
                    temperature: 1.0,
                    top_p: 1.0,
                    seed: 100 + step,
                    stream: false,
                    reference,
                    launchers: Vec::new(),
                };
                generated(s.handle(req, &mut Vec::new()).unwrap())
            };
            let texts = |v: &Value| -> Vec<f64> {
                v["completions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| digit_share(c["text"].as_str().unwrap()))
                    .collect()
            };
            control.push(mean(&texts(&generate(&mut s, true))));
            let r = generate(&mut s, false);
            let rewards = texts(&r);
            policy.push(mean(&rewards));
            let paid: Vec<f64> = rewards.iter().map(|x| sign * x).collect();
            // One GRPO group (Shao et al., arXiv:2402.03300): (r - mean) / std.
            let m = mean(&paid);
            let sd = (paid.iter().map(|x| (x - m).powi(2)).sum::<f64>() / paid.len() as f64).sqrt();
            let adv: Vec<f64> = paid
                .iter()
                .map(|x| if sd < 1e-12 { 0.0 } else { (x - m) / sd })
                .collect();
            let samples = r["completions"]
                .as_array()
                .unwrap()
                .iter()
                .zip(adv)
                .map(|(c, advantage)| Sample {
                    id: c["id"].as_u64().unwrap(),
                    advantage,
                    ret: None,
                })
                .collect();
            let req = Request::Update {
                agent: Role::Generator,
                samples,
            };
            let st = s.handle(req, &mut Vec::new()).unwrap();
            assert!(matches!(st, Some(Reply::Updated(_))), "{st:?}");
        }
        (policy, control)
    }

    /// The whole update path (sampling log-probs kept by `generate`, group-normalized
    /// advantages, clipped ratio, KL to the reference, AdamW) learns a reward with signal, and
    /// the frozen reference sampled with the same seeds does not. Paying the opposite reward
    /// must push the other way, so a sign error in the loss or the advantages fails here.
    #[test]
    fn grpo_learns_a_verifiable_reward_and_its_frozen_control_does_not() {
        let (_d, m) = tiny_model();
        let last = |v: &[f64]| v[v.len() - 5..].iter().sum::<f64>() / 5.0;
        let (policy, control) = digit_grpo(&m, 40, 1.0);
        eprintln!("policy {policy:.3?}\ncontrol {control:.3?}");
        assert!(
            last(&policy) > last(&control) + 0.5,
            "RL above its frozen control over the last 5 steps: {policy:.3?} vs {control:.3?}"
        );
        let (against, control2) = digit_grpo(&m, 40, -1.0);
        eprintln!("against {against:.3?}");
        assert_eq!(
            control, control2,
            "the control is the same frozen policy with the same seeds"
        );
        assert!(
            last(&against) < 0.5 * last(&control),
            "paying the opposite reward lowers it: {against:.3?} vs {control:.3?}"
        );
    }

    #[test]
    fn lora_agents_learn_on_one_shared_frozen_base_that_is_their_reference() {
        let (d, m) = tiny_model();
        // Loading draws from libtorch's global generator (the initialization it overwrites):
        // taken in turn with the tests that seed it.
        let rng = crate::torch_rng();
        // The tied embedding scaled by 12 so that the logits a unit-RMS hidden state can reach
        // span several nats: at normal(0, 0.02) they stay within about +-0.6 whatever adapters
        // of the projections do, the final norm and the head being frozen.
        {
            let x = Qwen2::load(&m, tch::Device::Cpu, Kind::Float).unwrap();
            let mut e = x.vs.variables()["model.embed_tokens.weight"].shallow_clone();
            let _ = tch::no_grad(|| e.f_mul_scalar_(12.0)).unwrap();
            x.save(&m).unwrap();
        }
        drop(rng);
        let lora = r#", "lora": {"r": 8, "alpha": 16}"#;
        let (policy, control) = digit_grpo_with(&m, 40, 1.0, lora, 0.5);
        eprintln!("policy {policy:.3?}\ncontrol {control:.3?}");
        let last = |v: &[f64]| v[v.len() - 5..].iter().sum::<f64>() / 5.0;
        // At this learning rate the trajectory depends on the last bits of the arithmetic:
        // libtorch's CPU kernels on other vector units end 0.46 to 0.93 above the control.
        assert!(
            last(&policy) > last(&control) + 0.3,
            "LoRA RL above its frozen control over the last 5 steps: {policy:.3?} vs {control:.3?}"
        );
        // One base in memory: both agents and both references read the same storage, the
        // optimizer trains the adapters alone, and an update leaves the base as it was loaded.
        let _rng = crate::torch_rng();
        let mut j = job(lora);
        (j.generator, j.optimizer) = (m.clone(), m.clone());
        (j.lr, j.minibatch, j.warmup) = (5e-2, 1, 0);
        let mut s = Server::new(j.clone()).unwrap();
        let q = "model.layers.0.self_attn.q_proj.weight";
        let ptr = |x: &Qwen2| x.vs.variables()[q].data_ptr();
        let p0 = ptr(&s.agents[0].model);
        for x in [&s.agents[1].model, &s.refs[0], &s.refs[1]] {
            assert_eq!(ptr(x), p0, "one shared base");
        }
        let trained = s.agents[0].model.trainable().variables();
        assert_eq!(
            trained.len(),
            2 * 7,
            "A and B of the one layer's 7 projections"
        );
        assert!(trained.keys().all(|k| k.contains(".lora_")), "{trained:?}");
        let r = generate4(&mut s, 12, 1, false);
        let st = s.update(Role::Generator, &alternating(&r)).unwrap();
        assert!(st.steps == 4 && st.max_approx_kl > 1e-5, "{st:?}");
        let loaded = Qwen2::load(&m, tch::Device::Cpu, Kind::Float).unwrap();
        let base = s.refs[0].vs.variables();
        for (n, t) in loaded.vs.variables() {
            assert!(t.equal(&base[&n]), "the base moved at {n}");
        }
        // The saved generator is the base with its adapters merged: the same logits as the
        // adapted policy, not the base's; the decoder samples the adapted policy too.
        let out = d.path().join("saved");
        let saved = s.handle(Request::Save { dir: out.clone() }, &mut Vec::new());
        assert!(matches!(saved, Ok(Some(Reply::Saved { .. }))), "{saved:?}");
        for a in ["generator_adapter", "optimizer_adapter"] {
            assert!(
                out.join(a).join("adapter_model.safetensors").is_file(),
                "{a}"
            );
        }
        let merged = Qwen2::load(&out.join("generator"), tch::Device::Cpu, Kind::Float).unwrap();
        let ids = Tensor::from_slice(&[5i64, 9, 17, 33, 2, 41]).view([1, 6]);
        let logits = |x: &Qwen2| tch::no_grad(|| x.forward(&ids, None, None, None).unwrap());
        let policy = logits(&s.agents[0].model);
        let gap = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]);
        assert!(gap(&policy, &logits(&merged)) < 1e-4);
        assert!(
            gap(&policy, &logits(&s.refs[0])) > 1e-3,
            "the adapters changed nothing"
        );
        let greedy = |a: &TrainableAgent| {
            let p = SampleParams {
                max_new_tokens: 12,
                temperature: 0.0,
                use_cache: true,
                ..Default::default()
            };
            let conv = vec![vec![ChatMessage::new("user", "Write k.")]];
            a.generate_with_log_probs(&conv, &p).unwrap()[0].ids.clone()
        };
        let merged_agent = TrainableAgent::load(
            &out.join("generator"),
            Role::Generator,
            "s",
            tch::Device::Cpu,
            Default::default(),
            Default::default(),
        )
        .unwrap();
        assert_eq!(greedy(&s.agents[0]), greedy(&merged_agent));
        // A run's saved state is the adapters and their moments; a fresh trainer that loads
        // it computes what the trained one does.
        let state = d.path().join("state");
        s.save_state(&state).unwrap();
        let mut resumed = Server::new(j).unwrap();
        assert!(gap(&policy, &logits(&resumed.agents[0].model)) > 1e-3);
        resumed.load_state(&state).unwrap();
        assert!(gap(&policy, &logits(&resumed.agents[0].model)) < 1e-6);
    }

    #[test]
    fn the_generator_learns_at_generator_lr_else_at_lr() {
        let [g, o] = agent_optims(&job(""));
        assert_eq!((g.lr, o.lr), (2e-5, 2e-5));
        let [g, o] = agent_optims(&job(r#", "generator_lr": 5e-6"#));
        assert_eq!((g.lr, o.lr), (5e-6, 2e-5));
        assert_eq!((g.warmup, o.warmup), (3, 3));
        let [g, _] = agent_optims(&job(r#", "generator_lr": 0.0"#));
        assert_eq!(g.lr, 0.0, "0 freezes the generator");
    }
}
