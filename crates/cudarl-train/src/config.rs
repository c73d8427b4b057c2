//! The Hugging Face `config.json` of a Qwen2 model (`Qwen2Config` in `transformers`), read and
//! written with the same keys so a real checkpoint (Qwen2.5-Coder) loads and ours open in
//! `transformers`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ModelError;

/// Architecture hyper-parameters (names as in `transformers`' `Qwen2Config`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen2Config {
    /// `["Qwen2ForCausalLM"]`.
    #[serde(default = "default_architectures")]
    pub architectures: Vec<String>,
    /// `qwen2`.
    #[serde(default = "default_model_type")]
    pub model_type: String,
    /// Vocabulary size (rows of the embedding and of the LM head).
    pub vocab_size: i64,
    /// Model width.
    pub hidden_size: i64,
    /// SwiGLU inner width.
    pub intermediate_size: i64,
    /// Decoder layers.
    pub num_hidden_layers: i64,
    /// Query heads.
    pub num_attention_heads: i64,
    /// Key/value heads (grouped-query attention: `num_attention_heads` is a multiple of it).
    pub num_key_value_heads: i64,
    /// Per-head width; `hidden_size / num_attention_heads` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<i64>,
    /// Longest sequence the model was trained for (RoPE table length).
    pub max_position_embeddings: i64,
    /// RoPE base (transformers 4.x key; 5.x also writes `rope_parameters.rope_theta`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// The LM head shares the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// MLP activation: only `silu` (SwiGLU) is supported.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Beginning-of-sequence token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<i64>,
    /// End-of-sequence token(s): an id or a list of ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<Value>,
    /// Every other key, kept as read so a save writes it back (`rope_parameters`, `dtype`, ...).
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

fn default_architectures() -> Vec<String> {
    vec!["Qwen2ForCausalLM".into()]
}
fn default_model_type() -> String {
    "qwen2".into()
}
fn default_eps() -> f64 {
    1e-6
}
fn default_act() -> String {
    "silu".into()
}

impl Qwen2Config {
    /// A config with `transformers`' defaults for the keys not given here.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        vocab_size: i64,
        hidden_size: i64,
        intermediate_size: i64,
        num_hidden_layers: i64,
        num_attention_heads: i64,
        num_key_value_heads: i64,
        max_position_embeddings: i64,
        tie_word_embeddings: bool,
    ) -> Qwen2Config {
        Qwen2Config {
            architectures: default_architectures(),
            model_type: default_model_type(),
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim: None,
            max_position_embeddings,
            rope_theta: Some(10_000.0),
            rms_norm_eps: 1e-6,
            tie_word_embeddings,
            hidden_act: default_act(),
            bos_token_id: None,
            eos_token_id: None,
            extra: BTreeMap::new(),
        }
    }

    /// Reads and checks `config.json`.
    ///
    /// # Errors
    /// [`ModelError::Config`] naming the file and the key (unreadable, not JSON, missing key,
    /// unsupported `hidden_act`/`rope_scaling`, heads that do not divide).
    pub fn load(path: &Path) -> Result<Qwen2Config, ModelError> {
        let bad = |m: String| ModelError::Config {
            file: path.display().to_string(),
            message: m,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let c: Qwen2Config = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        c.validate().map_err(bad)?;
        Ok(c)
    }

    /// Writes `config.json` (pretty JSON, keys sorted as serde writes them).
    ///
    /// # Errors
    /// I/O errors.
    pub fn save(&self, path: &Path) -> Result<(), ModelError> {
        let text = serde_json::to_string_pretty(self).expect("config serializes");
        std::fs::write(path, text + "\n").map_err(|e| ModelError::Io(path.display().to_string(), e))
    }

    /// Consistency checks.
    ///
    /// # Errors
    /// A message naming the key.
    pub fn validate(&self) -> Result<(), String> {
        for (k, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v <= 0 {
                return Err(format!("`{k}` must be positive, is {v}"));
            }
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(format!(
                "`num_attention_heads` ({}) is not a multiple of `num_key_value_heads` ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim.is_none() && self.hidden_size % self.num_attention_heads != 0 {
            return Err("`hidden_size` is not a multiple of `num_attention_heads`".into());
        }
        if self.head_dim() % 2 != 0 {
            return Err(format!("head dim {} is odd (RoPE pairs)", self.head_dim()));
        }
        if self.hidden_act != "silu" {
            return Err(format!(
                "`hidden_act` = `{}`: only `silu` is supported",
                self.hidden_act
            ));
        }
        if self.extra.get("use_sliding_window") == Some(&Value::Bool(true)) {
            return Err("`use_sliding_window` = true: only full attention is supported".into());
        }
        let scaling = self.extra.get("rope_scaling").cloned().or_else(|| {
            self.extra
                .get("rope_parameters")
                .and_then(|p| p.get("rope_type"))
                .filter(|t| t.as_str() != Some("default"))
                .cloned()
        });
        if let Some(s) = scaling.filter(|s| !s.is_null()) {
            return Err(format!(
                "`rope_scaling` = {s}: only the default RoPE is supported"
            ));
        }
        Ok(())
    }

    /// Per-head width.
    pub fn head_dim(&self) -> i64 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// The RoPE base: `rope_theta`, else `rope_parameters.rope_theta` (transformers 5), else
    /// 10,000 (the default of both).
    pub fn rope_base(&self) -> f64 {
        self.rope_theta
            .or_else(|| {
                self.extra
                    .get("rope_parameters")
                    .and_then(|p| p.get("rope_theta"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(10_000.0)
    }

    /// End-of-sequence ids (empty when the config has none).
    pub fn eos_ids(&self) -> Vec<i64> {
        match &self.eos_token_id {
            Some(Value::Number(n)) => n.as_i64().into_iter().collect(),
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_i64).collect(),
            _ => vec![],
        }
    }

    /// Parameter count (embedding counted once when tied).
    pub fn num_parameters(&self) -> i64 {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let (q, kv) = (
            self.num_attention_heads * self.head_dim(),
            self.num_key_value_heads * self.head_dim(),
        );
        let attn = h * q + q + 2 * (h * kv + kv) + q * h;
        let layer = attn + 3 * h * i + 2 * h;
        v * h
            + self.num_hidden_layers * layer
            + h
            + if self.tie_word_embeddings { 0 } else { v * h }
    }
}
