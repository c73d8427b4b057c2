//! Tokenizers (the Hugging Face `tokenizers` crate: `tokenizer.json` as `transformers` reads
//! it) and the chat template shared by SFT and RL.
//!
//! The chat template is ChatML, the format of Qwen2 chat models:
//!
//! ```text
//! <|im_start|>system\n{system}<|im_end|>\n
//! <|im_start|>user\n{prompt}<|im_end|>\n
//! <|im_start|>assistant\n{answer}<|im_end|>\n
//! ```
//!
//! The loss mask marks the assistant's content and its closing `<|im_end|>` (the model must
//! learn to stop), never the role headers or other turns.

use std::collections::HashSet;
use std::path::Path;

use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder};

use crate::ModelError;
pub use cudarl_protocol::ChatMessage;

/// End of a document (pretraining) and of a generation when no chat turn is open.
pub const EOS: &str = "<|endoftext|>";
/// Opens a chat turn.
pub const IM_START: &str = "<|im_start|>";
/// Closes a chat turn (the end-of-sequence token of chat generation).
pub const IM_END: &str = "<|im_end|>";

/// The chat template of [`ChatTokenizer::render`] in Jinja, as `transformers`'
/// `apply_chat_template` runs it (`tokenizer_config.json`'s `chat_template`): the same text for
/// the same messages; `add_generation_prompt` opens the assistant's turn.
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Sampling defaults written to `generation_config.json`: the temperature and nucleus mass the
/// pipeline samples with (`pipelines/default.toml`, `[stages.eval]` and `[stages.rl-train]`).
pub const GENERATION_TEMPERATURE: f64 = 0.7;
/// See [`GENERATION_TEMPERATURE`].
pub const GENERATION_TOP_P: f64 = 0.95;

fn terr(file: &str, e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(format!("{file}: {e}"))
}

/// Trains a byte-level BPE tokenizer (GPT-2's byte-level alphabet, so any text encodes) on
/// `texts` with `vocab_size` entries including the special tokens [`EOS`], [`IM_START`],
/// [`IM_END`], and writes it as `path` (`tokenizer.json`). Training is deterministic for the
/// same texts and size.
///
/// # Errors
/// Training or I/O errors.
pub fn train_bpe(texts: &[String], vocab_size: usize, path: &Path) -> Result<(), ModelError> {
    let file = path.display().to_string();
    let specials: Vec<AddedToken> = [EOS, IM_START, IM_END]
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect::<HashSet<char>>())
        .build();
    let mut tok = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None::<tokenizers::NormalizerWrapper>)
        .with_pre_tokenizer(Some(ByteLevel::new(false, true, true)))
        .with_post_processor(Some(ByteLevel::new(false, true, true)))
        .with_decoder(Some(ByteLevel::new(false, true, true)))
        .build()
        .map_err(|e| terr(&file, e))?;
    tok.train(&mut trainer, texts.iter())
        .map_err(|e| terr(&file, e))?;
    tok.save(path, true).map_err(|e| terr(&file, e))?;
    Ok(())
}

/// A tokenizer with the chat template.
pub struct ChatTokenizer {
    /// The underlying `tokenizers` tokenizer.
    pub tok: Tokenizer,
    /// Id of [`IM_START`].
    pub im_start: i64,
    /// Id of [`IM_END`].
    pub im_end: i64,
    /// Id of [`EOS`] (`None` when the vocabulary lacks it).
    pub eos: Option<i64>,
    /// The checkpoint's own `tokenizer_config.json` ([`ChatTokenizer::load_dir`]), written back
    /// in place of the generated one by [`ChatTokenizer::write_hf_configs`]; `None` for a
    /// tokenizer the pipeline trained.
    pub hf_config: Option<serde_json::Value>,
}

impl ChatTokenizer {
    /// Loads `tokenizer.json`.
    ///
    /// # Errors
    /// Unreadable file, or no `<|im_start|>`/`<|im_end|>` tokens.
    pub fn load(path: &Path) -> Result<ChatTokenizer, ModelError> {
        let file = path.display().to_string();
        let tok = Tokenizer::from_file(path).map_err(|e| terr(&file, e))?;
        let id = |t: &str| tok.token_to_id(t).map(i64::from);
        Ok(ChatTokenizer {
            im_start: id(IM_START).ok_or_else(|| terr(&file, format!("no `{IM_START}` token")))?,
            im_end: id(IM_END).ok_or_else(|| terr(&file, format!("no `{IM_END}` token")))?,
            eos: id(EOS),
            tok,
            hf_config: None,
        })
    }

    /// Loads a checkpoint directory's tokenizer: `dir/tokenizer.json`, and
    /// `dir/tokenizer_config.json` when there is one (a downloaded Hugging Face checkpoint, or a
    /// checkpoint this pipeline wrote). Its `chat_template` must render the pipeline's
    /// conversations exactly as ChatML does ([`check_chat_template`]), since SFT, RL and eval
    /// tokenize with [`ChatTokenizer::render`]; the file is kept and written back with every
    /// checkpoint trained from it.
    ///
    /// # Errors
    /// As [`ChatTokenizer::load`]; an unreadable `tokenizer_config.json`, or a `chat_template`
    /// that does not render as ChatML (the file and the first difference named).
    pub fn load_dir(dir: &Path) -> Result<ChatTokenizer, ModelError> {
        let mut tok = ChatTokenizer::load(&dir.join("tokenizer.json"))?;
        let p = dir.join("tokenizer_config.json");
        if !p.exists() {
            return Ok(tok);
        }
        let file = p.display().to_string();
        let text = std::fs::read_to_string(&p).map_err(|e| ModelError::Io(file.clone(), e))?;
        let cfg: serde_json::Value = serde_json::from_str(&text).map_err(|e| terr(&file, e))?;
        match cfg.get("chat_template") {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::String(t)) => check_chat_template(t, &file)?,
            // The named-templates form: the `default` one is what `apply_chat_template` uses.
            Some(serde_json::Value::Array(named)) => {
                let default = named
                    .iter()
                    .find(|n| n.get("name").and_then(|v| v.as_str()) == Some("default"))
                    .and_then(|n| n.get("template").and_then(|v| v.as_str()))
                    .ok_or_else(|| terr(&file, "`chat_template`: no template named `default`"))?;
                check_chat_template(default, &file)?;
            }
            Some(_) => {
                return Err(terr(
                    &file,
                    "`chat_template` is neither a string nor a list",
                ));
            }
        }
        tok.hf_config = Some(cfg);
        Ok(tok)
    }

    /// Writes `tokenizer_config.json` (the checkpoint's own when it was loaded with one,
    /// [`ChatTokenizer::load_dir`]; else [`CHAT_TEMPLATE`], [`IM_END`] as the end-of-sequence
    /// token, [`EOS`] as padding, `model_max_length` = `max_len` tokens) and
    /// `generation_config.json` (stop at [`IM_END`] or [`EOS`]; sampling at
    /// [`GENERATION_TEMPERATURE`] and [`GENERATION_TOP_P`]) into `dir`, beside its
    /// `tokenizer.json`, so `transformers`' `AutoTokenizer.apply_chat_template` and
    /// `AutoModelForCausalLM.generate` work on the checkpoint as they do on a Qwen2 chat model.
    ///
    /// # Errors
    /// Write errors (the file named).
    pub fn write_hf_configs(&self, dir: &Path, max_len: i64) -> Result<(), ModelError> {
        let pad = if self.eos.is_some() { EOS } else { IM_END };
        let tokenizer_config = self.hf_config.clone().unwrap_or_else(|| {
            serde_json::json!({
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": CHAT_TEMPLATE,
                "bos_token": null,
                "eos_token": IM_END,
                "pad_token": pad,
                "unk_token": null,
                "additional_special_tokens": [IM_START, IM_END],
                "model_max_length": max_len,
                "clean_up_tokenization_spaces": false,
            })
        });
        let stop: Vec<i64> = std::iter::once(self.im_end).chain(self.eos).collect();
        let generation_config = serde_json::json!({
            "eos_token_id": stop,
            "pad_token_id": self.eos.unwrap_or(self.im_end),
            "do_sample": true,
            "temperature": GENERATION_TEMPERATURE,
            "top_p": GENERATION_TOP_P,
        });
        for (name, v) in [
            ("tokenizer_config.json", tokenizer_config),
            ("generation_config.json", generation_config),
        ] {
            let p = dir.join(name);
            let text = serde_json::to_string_pretty(&v).expect("json") + "\n";
            std::fs::write(&p, text).map_err(|e| ModelError::Io(p.display().to_string(), e))?;
        }
        Ok(())
    }

    /// Vocabulary size including special tokens.
    pub fn vocab_size(&self) -> usize {
        self.tok.get_vocab_size(true)
    }

    /// Token ids of `text` (no special tokens added).
    ///
    /// # Errors
    /// Tokenizer errors.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>, ModelError> {
        let e = self
            .tok
            .encode(text, false)
            .map_err(|e| terr("encode", e))?;
        Ok(e.get_ids().iter().map(|&i| i64::from(i)).collect())
    }

    /// Text of `ids` (special tokens skipped).
    ///
    /// # Errors
    /// Ids outside the vocabulary.
    pub fn decode(&self, ids: &[i64]) -> Result<String, ModelError> {
        let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        self.tok.decode(&ids, true).map_err(|e| terr("decode", e))
    }

    /// Renders `messages` with the chat template: token ids and, per token, whether it is
    /// trained on (assistant content and its `<|im_end|>`). With `generation_prompt`, ends
    /// with an open `<|im_start|>assistant\n` for the model to continue.
    ///
    /// # Errors
    /// Tokenizer errors.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        generation_prompt: bool,
    ) -> Result<(Vec<i64>, Vec<bool>), ModelError> {
        let nl = self.encode("\n")?;
        let (mut ids, mut mask) = (Vec::new(), Vec::new());
        let push = |t: &[i64], m: bool, ids: &mut Vec<i64>, mask: &mut Vec<bool>| {
            ids.extend_from_slice(t);
            mask.extend(std::iter::repeat_n(m, t.len()));
        };
        for msg in messages {
            let train = msg.role == "assistant";
            push(&[self.im_start], false, &mut ids, &mut mask);
            push(
                &self.encode(&format!("{}\n", msg.role))?,
                false,
                &mut ids,
                &mut mask,
            );
            push(&self.encode(&msg.content)?, train, &mut ids, &mut mask);
            push(&[self.im_end], train, &mut ids, &mut mask);
            push(&nl, false, &mut ids, &mut mask);
        }
        if generation_prompt {
            push(&[self.im_start], false, &mut ids, &mut mask);
            push(&self.encode("assistant\n")?, false, &mut ids, &mut mask);
        }
        Ok((ids, mask))
    }
}

/// The conversation shapes the pipeline renders (system first; one or more user and assistant
/// turns; an open assistant turn to sample), each with whether the generation prompt is added.
fn probe_conversations() -> Vec<(Vec<ChatMessage>, bool)> {
    let sys = ChatMessage::new("system", "You write CUDA kernels.");
    let user = ChatMessage::new("user", "Write a kernel.\n```cpp\nint x;\n```");
    let asst = ChatMessage::new("assistant", "```cuda\n__global__ void k() {}\n```");
    let again = ChatMessage::new("user", "It did not compile:\nerror: x");
    vec![
        (vec![sys.clone(), user.clone(), asst.clone()], false),
        (vec![sys.clone(), user.clone()], true),
        (vec![sys, user, asst, again], true),
    ]
}

/// ChatML's text of `messages` (what [`ChatTokenizer::render`] tokenizes; [`CHAT_TEMPLATE`]).
fn chatml(messages: &[ChatMessage], generation_prompt: bool) -> String {
    let mut s: String = messages
        .iter()
        .map(|m| format!("{IM_START}{}\n{}{IM_END}\n", m.role, m.content))
        .collect();
    if generation_prompt {
        s.push_str(&format!("{IM_START}assistant\n"));
    }
    s
}

/// Checks that the Jinja `template` (a `tokenizer_config.json`'s `chat_template`, rendered the
/// way `transformers`' `apply_chat_template` renders it, with MiniJinja and Python's string
/// methods) gives ChatML's text for the conversations the pipeline renders: a system message,
/// user and assistant turns, and the open assistant turn. Qwen2 and Qwen2.5 chat templates do
/// (their default system prompt applies only when a conversation has none).
///
/// # Errors
/// [`ModelError::Tokenizer`] naming `file`: a template that does not parse or render, or the
/// first conversation it renders differently, with both texts from the first difference.
pub fn check_chat_template(template: &str, file: &str) -> Result<(), ModelError> {
    let mut env = minijinja::Environment::new();
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    env.add_template("chat_template", template)
        .map_err(|e| terr(file, format!("`chat_template` does not parse: {e}")))?;
    let t = env.get_template("chat_template").expect("added");
    for (messages, open) in probe_conversations() {
        let got = t
            .render(minijinja::context! {
                messages => minijinja::Value::from(minijinja::value::Serde(&messages)),
                add_generation_prompt => open,
                bos_token => "",
                eos_token => IM_END,
            })
            .map_err(|e| terr(file, format!("`chat_template` does not render: {e}")))?;
        let want = chatml(&messages, open);
        if got != want {
            let at = got
                .char_indices()
                .zip(want.chars())
                .find(|((_, a), b)| a != b)
                .map_or(got.len().min(want.len()), |((i, _), _)| i);
            let from = |s: &str| {
                s.get(at..)
                    .unwrap_or("")
                    .chars()
                    .take(60)
                    .collect::<String>()
            };
            return Err(terr(
                file,
                format!(
                    "`chat_template` is not ChatML, which SFT, RL and eval tokenize with: for a \
                     {} conversation it gives {:?} where ChatML has {:?} (from character {at})",
                    if open { "sampled" } else { "trained" },
                    from(&got),
                    from(&want),
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer(dir: &Path) -> ChatTokenizer {
        let texts: Vec<String> = (0..64)
            .map(|i| format!("You write CUDA kernels. Write a kernel that adds {i} vectors.\n"))
            .collect();
        let p = dir.join("tokenizer.json");
        train_bpe(&texts, 300, &p).unwrap();
        ChatTokenizer::load(&p).unwrap()
    }

    #[test]
    fn the_written_chat_template_renders_the_trainers_tokens_and_names_the_stop_tokens() {
        let d = tempfile::tempdir().unwrap();
        let tok = tokenizer(d.path());
        tok.write_hf_configs(d.path(), 2048).unwrap();
        let messages = [
            ChatMessage::new("system", "You write CUDA kernels."),
            ChatMessage::new("user", "Write a kernel that adds two vectors."),
            ChatMessage::new("assistant", "__global__ void k() {}"),
        ];
        // The text the template gives (ChatML, as the module docs show), tokenized whole the way
        // `transformers`' fast tokenizer does (special tokens matched first), is the trainer's
        // rendering token for token.
        let text: String = messages
            .iter()
            .map(|m| format!("{IM_START}{}\n{}{IM_END}\n", m.role, m.content))
            .collect::<String>()
            + &format!("{IM_START}assistant\n");
        assert_eq!(
            tok.encode(&text).unwrap(),
            tok.render(&messages, true).unwrap().0
        );
        let cfg: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(d.path().join("tokenizer_config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(cfg["chat_template"], CHAT_TEMPLATE);
        assert_eq!(cfg["eos_token"], IM_END);
        assert_eq!(cfg["pad_token"], EOS);
        assert_eq!(cfg["model_max_length"], 2048);
        let gen_cfg: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(d.path().join("generation_config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            gen_cfg["eos_token_id"],
            serde_json::json!([tok.im_end, tok.eos.unwrap()])
        );
        assert_eq!(gen_cfg["pad_token_id"], tok.eos.unwrap());
    }

    /// A template in the style of Qwen2.5's: a default system prompt when there is none,
    /// whitespace control, attribute access, a `tools` branch never taken.
    const SYSTEM_DEFAULT_TEMPLATE: &str = "{%- if tools %}{{ raise_exception('no tools') }}\
        {%- elif messages[0].role != 'system' %}{{- '<|im_start|>system\\nYou help.<|im_end|>\\n' }}\
        {%- endif %}{%- for m in messages %}\
        {{- '<|im_start|>' + m.role + '\\n' + m.content.strip() + '<|im_end|>\\n' }}{%- endfor %}\
        {%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

    #[test]
    fn chatml_templates_pass_the_check_and_others_are_named_with_the_difference() {
        check_chat_template(CHAT_TEMPLATE, "cfg.json").unwrap();
        check_chat_template(SYSTEM_DEFAULT_TEMPLATE, "cfg.json").unwrap();
        let llama = "{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]\
            {% else %}{{ m.content }}{% endif %}{% endfor %}";
        let e = check_chat_template(llama, "ckpt/tokenizer_config.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ckpt/tokenizer_config.json")
                && e.contains("not ChatML")
                && e.contains("[INST]"),
            "{e}"
        );
        let e = check_chat_template("{% for %}", "t.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.json") && e.contains("does not parse"), "{e}");
        let e = check_chat_template("{{ raise_exception('roles must alternate') }}", "t.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("roles must alternate"), "{e}");
    }

    #[test]
    fn a_checkpoints_own_tokenizer_config_is_checked_kept_and_written_back() {
        let d = tempfile::tempdir().unwrap();
        tokenizer(d.path());
        let cfg = serde_json::json!({"chat_template": SYSTEM_DEFAULT_TEMPLATE, "eos_token": IM_END,
            "model_max_length": 32768, "custom": "kept"});
        std::fs::write(d.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
        let tok = ChatTokenizer::load_dir(d.path()).unwrap();
        let out = tempfile::tempdir().unwrap();
        tok.write_hf_configs(out.path(), 2048).unwrap();
        let written: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.path().join("tokenizer_config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(written, cfg);
        // A directory without one gets the generated file.
        std::fs::remove_file(d.path().join("tokenizer_config.json")).unwrap();
        let tok = ChatTokenizer::load_dir(d.path()).unwrap();
        assert!(tok.hf_config.is_none());
        let bad = serde_json::json!({"chat_template": "{{ messages[0].content }}"});
        std::fs::write(d.path().join("tokenizer_config.json"), bad.to_string()).unwrap();
        let e = ChatTokenizer::load_dir(d.path()).err().unwrap().to_string();
        assert!(
            e.contains("tokenizer_config.json") && e.contains("not ChatML"),
            "{e}"
        );
    }
}
