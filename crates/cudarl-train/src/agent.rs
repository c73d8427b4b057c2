//! Trainable agents (the mission's `TrainableAgent`): a generator or optimizer that owns a
//! Qwen2 model, its tokenizer, an AdamW optimizer over its float32 master weights (or its LoRA
//! adapters'), and its role's chat template (ChatML with the role's system prompt). It samples
//! completions with per-token log-probabilities (`generate_with_log_probs`) and applies
//! updates (`begin_step`, `finish_step`; the gradients come from `score::Scored`).

use std::path::Path;

use tch::{Device, Kind, Tensor};

use crate::ModelError;
use crate::adamw::{AdamW, AdamWConfig};
use crate::generate::{Finish, SampleParams, generate_streaming};
use crate::model::Qwen2;
use crate::tokenizer::{ChatMessage, ChatTokenizer};
use crate::train::{ComputeKind, Precision, clip_grad_norm};

pub use cudarl_protocol::Role;
use cudarl_protocol::rl::LAUNCHER_TRIGGER;

/// One sampled completion of a conversation.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The rendered prompt (with the generation prompt), token ids.
    pub prompt_ids: Vec<i64>,
    /// New token ids (ending with `<|im_end|>` when the model ended its turn).
    pub ids: Vec<i64>,
    /// Log-probability of each new token under the sampling distribution.
    pub log_probs: Vec<f32>,
    /// Decoded text of the new tokens, without `<|im_end|>`.
    pub text: String,
    /// Why it ended.
    pub finish: Finish,
    /// The tokens `ids[start..start + len]` constrained decoding wrote (the rest of the
    /// launcher declaration; their `log_probs` are 0 and an update masks them out), or `None`.
    pub forced: Option<(usize, usize)>,
}

/// Optimizer settings of an agent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AgentOptim {
    /// Learning rate (constant).
    pub lr: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// Global gradient L2 norm clip.
    pub grad_clip: f64,
    /// Optimizer steps of linear learning-rate warmup (`lr * k / warmup` at step `k`, then
    /// `lr`): Adam's first steps move every parameter by about `lr` whatever the gradient's
    /// size, which is what pushed a peaked SFT policy far from its reference at once
    /// (KL 0.99 nats/token after one RL step at 5e-5,
    /// `benchmarks/results/rl_generated_families_h100_2026-11-22.json`). 0 = none.
    pub warmup: usize,
}

impl Default for AgentOptim {
    fn default() -> Self {
        AgentOptim {
            lr: 1e-5,
            weight_decay: 0.0,
            grad_clip: 1.0,
            warmup: 0,
        }
    }
}

/// A generator or optimizer agent with trainable parameters.
pub struct TrainableAgent {
    /// The role.
    pub role: Role,
    /// The role's system prompt, prepended to conversations that have none.
    pub system: String,
    /// The policy.
    pub model: Qwen2,
    /// Its tokenizer and chat template.
    pub tokenizer: ChatTokenizer,
    opt: AdamW,
    optim: AgentOptim,
}

impl TrainableAgent {
    /// Loads a Hugging Face directory (with `tokenizer.json`, and its `tokenizer_config.json`
    /// when it has one: [`ChatTokenizer::load_dir`]) as a trainable agent: float32
    /// parameters on `device`, computing in `precision`'s dtype.
    ///
    /// # Errors
    /// Bad model directory or tokenizer (named), libtorch errors.
    pub fn load(
        dir: &Path,
        role: Role,
        system: &str,
        device: Device,
        precision: Precision,
        optim: AgentOptim,
    ) -> Result<TrainableAgent, ModelError> {
        let mut model = Qwen2::load(dir, device, Kind::Float)?;
        model.set_compute_kind(precision.compute_kind(device));
        Self::with_model(dir, role, system, model, optim)
    }

    /// An agent of `model` (its [`Qwen2::trainable`] parameters are what AdamW trains: the
    /// LoRA adapters when attached, else every weight) with the tokenizer of the checkpoint
    /// directory `dir` ([`ChatTokenizer::load_dir`]).
    ///
    /// # Errors
    /// A bad tokenizer (named).
    pub fn with_model(
        dir: &Path,
        role: Role,
        system: &str,
        model: Qwen2,
        optim: AgentOptim,
    ) -> Result<TrainableAgent, ModelError> {
        let tokenizer = ChatTokenizer::load_dir(dir)?;
        let cfg = AdamWConfig {
            beta2: 0.95,
            weight_decay: optim.weight_decay,
            ..Default::default()
        };
        let opt = AdamW::new(model.trainable(), cfg, optim.lr);
        Ok(TrainableAgent {
            role,
            system: system.to_string(),
            model,
            tokenizer,
            opt,
            optim,
        })
    }

    /// `conversation` with the role's system prompt first (unless it has one).
    pub fn with_system(&self, conversation: &[ChatMessage]) -> Vec<ChatMessage> {
        let mut v = Vec::with_capacity(conversation.len() + 1);
        if conversation.first().is_none_or(|m| m.role != "system") {
            v.push(ChatMessage::new("system", self.system.clone()));
        }
        v.extend_from_slice(conversation);
        v
    }

    /// Samples one completion per conversation (the conversations are batched; repeat one to
    /// get a group), with per-token log-probabilities; a turn ends at `<|im_end|>`.
    ///
    /// # Errors
    /// Rendering or generation errors.
    pub fn generate_with_log_probs(
        &self,
        conversations: &[Vec<ChatMessage>],
        params: &SampleParams,
    ) -> Result<Vec<Completion>, ModelError> {
        self.generate_streaming(conversations, params, &mut |_, _| {})
    }

    /// [`TrainableAgent::generate_with_log_probs`] that calls `on_finish(i, text)` with the
    /// decoded text of conversation `i`'s answer as soon as it is finished, while the rest of
    /// the batch decodes on.
    ///
    /// # Errors
    /// Rendering or generation errors.
    pub fn generate_streaming(
        &self,
        conversations: &[Vec<ChatMessage>],
        params: &SampleParams,
        on_finish: &mut dyn FnMut(usize, &str),
    ) -> Result<Vec<Completion>, ModelError> {
        self.generate_streaming_with(&self.model, conversations, params, &[], on_finish)
    }

    /// [`TrainableAgent::generate_streaming`] with another model of the same vocabulary in
    /// place of the policy (the frozen reference: `rl-train`'s `control`), with this agent's
    /// tokenizer and system prompt, and constrained decoding of `launchers[i]`, conversation
    /// `i`'s launcher declaration (none where `launchers` is empty or the entry is empty): once
    /// answer `i` first contains [`LAUNCHER_TRIGGER`], the rest of the declaration through its
    /// `)` is appended as tokens the model did not draw ([`Completion::forced`]), and the
    /// answer is decoded on from there in a second pass over the batch's constrained rows.
    ///
    /// # Errors
    /// Tokenizer or libtorch errors.
    pub fn generate_streaming_with(
        &self,
        model: &Qwen2,
        conversations: &[Vec<ChatMessage>],
        params: &SampleParams,
        launchers: &[String],
        on_finish: &mut dyn FnMut(usize, &str),
    ) -> Result<Vec<Completion>, ModelError> {
        if !launchers.is_empty() && launchers.len() != conversations.len() {
            return Err(ModelError::Generate(format!(
                "{} launchers for {} conversations: one per conversation, or none",
                launchers.len(),
                conversations.len()
            )));
        }
        let prompts: Vec<Vec<i64>> = conversations
            .iter()
            .map(|c| Ok(self.tokenizer.render(&self.with_system(c), true)?.0))
            .collect::<Result<_, ModelError>>()?;
        let rules: Vec<Option<(&str, &str)>> = (0..prompts.len())
            .map(|i| {
                let tail = launchers.get(i).and_then(|l| launcher_tail(l))?;
                Some((LAUNCHER_TRIGGER, tail))
            })
            .collect();
        self.sample_constrained(model, prompts, params, &rules, on_finish)
    }

    /// Samples continuations of `prompts` where `rules[i] = (trigger, tail)` holds row `i`:
    /// once its answer first contains `trigger`, the tokens of the last drawn token's text
    /// through `trigger`, then of `tail`, are written in its place ([`Completion::forced`],
    /// log-probability 0), and the row is decoded on from there in a second batch.
    ///
    /// # Errors
    /// Tokenizer or libtorch errors.
    pub(crate) fn sample_constrained(
        &self,
        model: &Qwen2,
        prompts: Vec<Vec<i64>>,
        params: &SampleParams,
        rules: &[Option<(&str, &str)>],
        on_finish: &mut dyn FnMut(usize, &str),
    ) -> Result<Vec<Completion>, ModelError> {
        let mut eos = vec![self.tokenizer.im_end];
        eos.extend(self.tokenizer.eos);
        let tok = &self.tokenizer;
        let rule = |i: usize| rules.get(i).copied().flatten();
        let text_of = |ids: &[i64]| {
            let body: Vec<i64> = ids.iter().copied().filter(|t| !eos.contains(t)).collect();
            tok.decode(&body)
        };
        // Rows stopped at the trigger finish after the second pass, not here.
        let triggered = std::cell::RefCell::new(vec![false; prompts.len()]);
        let mut stop = |i: usize, ids: &[i64]| {
            let hit = rule(i).is_some_and(|(trigger, _)| contains_trigger(tok, ids, trigger));
            if hit {
                triggered.borrow_mut()[i] = true;
            }
            hit
        };
        let mut finished = |i: usize, ids: &[i64]| {
            if !triggered.borrow()[i]
                && let Ok(text) = text_of(ids)
            {
                on_finish(i, &text);
            }
        };
        let g = generate_streaming(model, &prompts, params, &eos, &mut stop, &mut finished)?;
        let mut out = Vec::with_capacity(prompts.len());
        for (i, p) in prompts.into_iter().enumerate() {
            let ids = g.tokens[i].clone();
            out.push(Completion {
                text: text_of(&ids)?,
                prompt_ids: p,
                ids,
                log_probs: g.log_probs[i].clone(),
                finish: g.finish[i],
                forced: None,
            });
        }
        // The constrained rows: drawn tokens up to the one that completed the trigger, that
        // token's text through the trigger and the declaration's tail as written tokens (cut
        // at the token budget, where the answer ends by length).
        let mut rows = Vec::new();
        for i in (0..out.len()).filter(|&i| triggered.borrow()[i]) {
            let c = &mut out[i];
            let (trigger, tail) = rule(i).expect("a constrained row has a rule");
            let (keep, mut forced) = forced_tokens(tok, &c.ids, (trigger, tail))?;
            forced.truncate(params.max_new_tokens.saturating_sub(keep));
            c.ids.truncate(keep);
            c.log_probs.truncate(keep);
            c.forced = Some((keep, forced.len()));
            c.log_probs.extend(std::iter::repeat_n(0.0, forced.len()));
            c.ids.extend(forced);
            c.text = text_of(&c.ids)?;
            c.finish = Finish::Length;
            if c.ids.len() < params.max_new_tokens {
                rows.push(i);
            } else {
                on_finish(i, &c.text);
            }
        }
        if rows.is_empty() {
            return Ok(out);
        }
        let cont: Vec<Vec<i64>> = rows
            .iter()
            .map(|&i| [out[i].prompt_ids.as_slice(), &out[i].ids].concat())
            .collect();
        let used = rows.iter().map(|&i| out[i].ids.len()).min().unwrap_or(0);
        let p2 = SampleParams {
            max_new_tokens: params.max_new_tokens - used,
            seed: params.seed.map(|s| s.wrapping_add(1 << 20)),
            ..params.clone()
        };
        // Each row stops at its own budget; the batch's is the roomiest row's.
        let bases: Vec<Vec<i64>> = rows.iter().map(|&i| out[i].ids.clone()).collect();
        let rooms: Vec<usize> = bases
            .iter()
            .map(|b| params.max_new_tokens - b.len())
            .collect();
        let mut stop2 = |k: usize, ids: &[i64]| ids.len() >= rooms[k];
        let mut finished2 = |k: usize, ids: &[i64]| {
            let all = [bases[k].as_slice(), &ids[..ids.len().min(rooms[k])]].concat();
            if let Ok(text) = text_of(&all) {
                on_finish(rows[k], &text);
            }
        };
        let g = generate_streaming(model, &cont, &p2, &eos, &mut stop2, &mut finished2)?;
        for (k, &i) in rows.iter().enumerate() {
            let c = &mut out[i];
            let n = g.tokens[k].len().min(rooms[k]);
            c.ids.extend_from_slice(&g.tokens[k][..n]);
            c.log_probs.extend_from_slice(&g.log_probs[k][..n]);
            c.finish = match g.finish[k] {
                Finish::Eos if n == g.tokens[k].len() => Finish::Eos,
                _ => Finish::Length,
            };
            c.text = text_of(&c.ids)?;
        }
        Ok(out)
    }

    /// The state `[b, h]` (float32, detached) of each prompt: the last layer's hidden state at
    /// its last token, what PPO's value head reads before the agent answers.
    ///
    /// # Errors
    /// libtorch errors.
    pub fn prompt_states(model: &Qwen2, prompts: &[&[i64]]) -> Result<Tensor, ModelError> {
        let _g = tch::no_grad_guard();
        let dev = model.device();
        let width = prompts.iter().map(|p| p.len()).max().unwrap_or(1).max(1);
        let b = prompts.len() as i64;
        let mut ids = Vec::new();
        for p in prompts {
            let mut row = p.to_vec();
            row.resize(width, 0);
            ids.extend(row);
        }
        let ids = Tensor::from_slice(&ids)
            .view([b, width as i64])
            .to_device(dev);
        let hidden = model.hidden(&ids, None, None, None)?;
        let h = hidden.size()[2];
        let last: Vec<i64> = prompts.iter().map(|p| p.len().max(1) as i64 - 1).collect();
        let last = Tensor::from_slice(&last).to_device(dev).view([b, 1, 1]);
        Ok(hidden
            .gather(1, &last.expand([b, 1, h], false), false)
            .squeeze_dim(1)
            .to_kind(Kind::Float))
    }

    /// Starts an optimizer step: the learning rate from the warmup, the trained parameters'
    /// gradients dropped. The caller then accumulates the step's gradients into `.grad`
    /// ([`crate::score::Scored::backward`], [`crate::train::chunked_loss`]) and calls
    /// [`TrainableAgent::finish_step`].
    pub fn begin_step(&mut self) {
        self.warm_up();
        self.opt.zero_grad();
    }

    /// Ends an optimizer step: global-norm clipping of the accumulated gradients, then AdamW,
    /// then the gradients dropped, so they hold no memory while the agent samples. Returns the
    /// gradient norm before clipping.
    pub fn finish_step(&mut self) -> f64 {
        let norm = clip_grad_norm(
            &self.model.trainable().trainable_variables(),
            self.optim.grad_clip,
        );
        self.opt.step();
        self.opt.zero_grad();
        norm
    }

    /// Abandons an optimizer step begun by [`TrainableAgent::begin_step`]: the gradients it
    /// accumulated are dropped and no parameter moves.
    pub fn abandon_step(&mut self) {
        self.opt.zero_grad();
    }

    /// Sets the learning rate of the next step from the linear warmup.
    fn warm_up(&mut self) {
        if self.optim.warmup > 0 {
            let k = self.opt.steps() + 1;
            let f = (k as f64 / self.optim.warmup as f64).min(1.0);
            self.opt.set_lr(self.optim.lr * f);
        }
    }

    /// Writes what continuing this agent's training needs to `path` ([`AdamW::save`]: the
    /// float32 master weights, the moments and the step counts the warmup reads).
    ///
    /// # Errors
    /// libtorch errors, naming the file.
    pub fn save_state(&self, path: &Path) -> Result<(), ModelError> {
        self.opt.save(path)
    }

    /// Reads what [`TrainableAgent::save_state`] wrote for an agent of the same shapes.
    ///
    /// # Errors
    /// A missing or misshapen file or tensor (named), libtorch errors.
    pub fn load_state(&mut self, path: &Path) -> Result<(), ModelError> {
        self.opt.load(path)
    }

    /// Saves the model (LoRA adapters merged: [`Qwen2::save`]) and tokenizer in the Hugging
    /// Face layout, with the chat template and generation settings
    /// ([`ChatTokenizer::write_hf_configs`]).
    ///
    /// # Errors
    /// I/O and libtorch errors.
    pub fn save(&self, dir: &Path) -> Result<(), ModelError> {
        self.model.save(dir)?;
        let p = dir.join("tokenizer.json");
        self.tokenizer
            .tok
            .save(&p, true)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", p.display())))?;
        self.tokenizer
            .write_hf_configs(dir, self.model.config.max_position_embeddings)
    }
}

/// The part of launcher declaration `launcher` constrained decoding writes: what follows
/// [`LAUNCHER_TRIGGER`] through the closing `)` (a trailing `;` dropped), or `None` for a
/// declaration without the trigger.
pub(crate) fn launcher_tail(launcher: &str) -> Option<&str> {
    let k = launcher.find(LAUNCHER_TRIGGER)? + LAUNCHER_TRIGGER.len();
    let tail = launcher[k..].trim_end().trim_end_matches(';').trim_end();
    tail.ends_with(')').then_some(tail)
}

/// Whether the text of the last `trigger.len() + 4` tokens of `ids` contains `trigger`
/// (ASCII): asked after every drawn token, so the first time it does the last token completed
/// it. A token other than a special one (which decoding skips) is at least one character, so
/// the trigger's tokens lie within that window.
fn contains_trigger(tok: &ChatTokenizer, ids: &[i64], trigger: &str) -> bool {
    let from = ids.len().saturating_sub(trigger.len() + 4);
    tok.decode(&ids[from..]).is_ok_and(|t| t.contains(trigger))
}

/// For drawn tokens `ids` whose last token completed `trigger`: how many of them to keep and
/// the tokens written after them, the last token's text through the trigger and then `tail`
/// (so what follows the trigger is `tail`, whatever the last token went on to draw); all of
/// them and nothing written where the text does not split at the last token.
///
/// # Errors
/// Tokenizer errors.
fn forced_tokens(
    tok: &ChatTokenizer,
    ids: &[i64],
    (trigger, tail): (&str, &str),
) -> Result<(usize, Vec<i64>), ModelError> {
    let k = ids.len();
    let full = tok.decode(ids)?;
    let prev = tok.decode(&ids[..k.saturating_sub(1)])?;
    let end = full.find(trigger).map(|q| q + trigger.len());
    Ok(match end {
        Some(end) if k > 0 && full.starts_with(&prev) && end > prev.len() => {
            let text = format!("{}{tail}", &full[prev.len()..end]);
            (k - 1, tok.encode(&text)?)
        }
        // Text that does not split at the last token (a tokenizer whose decoding of a prefix
        // is not a prefix of the whole): the row goes on as drawn, unconstrained.
        _ => (k, Vec::new()),
    })
}
