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
        })
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
