//! Errors of the data layer. Every variant names the file and, where one applies, the field.

/// A data-layer error.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// Input is malformed: unreadable Parquet, missing or mistyped column, bad value.
    #[error("{file}{}: {message}", field.as_ref().map(|f| format!(": column `{f}`")).unwrap_or_default())]
    BadInput {
        /// File (as the user named it).
        file: String,
        /// Column or field.
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// A source cannot be reached or resolved (missing path, hub file not cached offline).
    #[error("{source_desc}: {message}")]
    Source {
        /// The source (path, hub repo).
        source_desc: String,
        /// What is wrong.
        message: String,
    },
    /// Writing an output failed.
    #[error("write {file}: {message}")]
    Write {
        /// Output file.
        file: String,
        /// Cause.
        message: String,
    },
}

impl DataError {
    /// Shorthand for [`DataError::BadInput`].
    pub fn bad(file: impl Into<String>, field: Option<&str>, message: impl Into<String>) -> Self {
        DataError::BadInput {
            file: file.into(),
            field: field.map(str::to_string),
            message: message.into(),
        }
    }
}

/// Result alias.
pub type Result<T> = std::result::Result<T, DataError>;
