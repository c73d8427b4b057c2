//! Chat messages and the agents that write them.

use serde::{Deserialize, Serialize};

/// One chat message, as Hugging Face chat templates and VERL's `messages` column take it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message.
    pub fn new(role: &str, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Which agent writes a turn: the generator writes the first kernel of an episode, the
/// optimizer revises it with the tester's feedback. Serialized `generator` / `optimizer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Writes a kernel for a task.
    Generator,
    /// Revises a kernel given the tester's feedback.
    Optimizer,
}

impl Role {
    /// `generator` or `optimizer`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Generator => "generator",
            Role::Optimizer => "optimizer",
        }
    }

    /// 0 for the generator, 1 for the optimizer (index of per-agent arrays).
    pub fn index(self) -> usize {
        match self {
            Role::Generator => 0,
            Role::Optimizer => 1,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
