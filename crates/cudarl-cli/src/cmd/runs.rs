//! Remembered runs: the settings each `run` built with, kept by name in the store
//! (`<store>/settings/<pipeline>/<name>.json`), and which of them a verb that reads the store
//! loads the pipeline with (docs/architecture.md, "The command line").

use std::path::{Path, PathBuf};

use super::CliError;

/// What a pipeline is loaded with: a profile of the pipeline file, then `--set` overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Settings {
    /// `[profiles.NAME]` applied first; `None`: no profile.
    pub profile: Option<String>,
    /// `NODE.KEY=VALUE` overrides, applied after the profile, in order.
    pub sets: Vec<String>,
}

impl Settings {
    /// The settings as command-line flags, e.g. `--profile cpu --set eval.samples=1`
    /// (`--profile none` for none).
    pub fn flags(&self) -> String {
        let mut f = format!("--profile {}", self.profile.as_deref().unwrap_or("none"));
        for s in &self.sets {
            f.push_str(&format!(" --set {s}"));
        }
        f
    }
}

/// One remembered `run`: its name, the targets it built and its settings.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    /// `--run NAME` of the run, else its targets joined by `+` ([`default_name`]).
    pub name: String,
    /// The targets it built: those named, else the pipeline's default targets (empty: every
    /// node).
    pub targets: Vec<String>,
    /// The settings it built them with.
    pub settings: Settings,
    /// When it was recorded (Unix time, milliseconds).
    pub finished_unix_ms: u64,
}

/// The folder of pipeline `pipeline`'s remembered runs in `store`.
///
/// # Errors
/// A pipeline name that is not one path component of the allowed characters (exit 2).
fn dir(store: &Path, pipeline: &str) -> Result<PathBuf, CliError> {
    if !allowed(pipeline) {
        return Err(CliError::usage(format!(
            "pipeline.name {pipeline:?}: a name of letters, digits, '-', '_', '.' and '+' (at most 100, not starting with '.') is needed to remember its runs"
        )));
    }
    Ok(store.join("settings").join(pipeline))
}

/// Whether `name` is letters, digits, `-`, `_`, `.` and `+`, not starting with `.`, at most 100
/// characters: one path component.
fn allowed(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.len() <= 100
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+'))
}

/// The name a run is remembered under when not given `--run`: its targets joined by `+`
/// (`all` for every node); past 100 characters, the first 80 and 8 hex digits of the whole
/// name's BLAKE3.
pub fn default_name(targets: &[String]) -> String {
    let name = if targets.is_empty() {
        "all".to_string()
    } else {
        targets.join("+")
    };
    if name.len() <= 100 {
        return name;
    }
    let head: String = name.chars().take(80).collect();
    format!(
        "{head}+{}",
        cudarl_core::Digest::of_bytes(name.as_bytes()).short(8)
    )
}

/// Checks a run name given with `--run`: ASCII letters, digits, `-`, `_`, `.` and `+`, not
/// starting with `.`, at most 100 characters.
///
/// # Errors
/// Any other name (exit 2, the rule said).
pub fn check_name(name: &str) -> Result<(), CliError> {
    if allowed(name) {
        Ok(())
    } else {
        Err(CliError::usage(format!(
            "--run {name:?}: a run name is letters, digits, '-', '_', '.' and '+' (at most 100, not starting with '.')"
        )))
    }
}

/// The remembered runs of pipeline `pipeline` in `store`, the latest first; none when the store
/// or the folder does not exist, or the pipeline's name cannot be a folder.
///
/// # Errors
/// A file in the folder that is not a run record (exit 2, the file named).
pub fn list(store: &Path, pipeline: &str) -> Result<Vec<RunRecord>, CliError> {
    // A pipeline whose name cannot be a folder has no remembered runs (`run` warns).
    let Ok(entries) = dir(store, pipeline).map(std::fs::read_dir) else {
        return Ok(vec![]);
    };
    let Ok(entries) = entries else {
        return Ok(vec![]);
    };
    let mut runs = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let bytes = std::fs::read(&path)
            .map_err(|err| CliError::failed(format!("{}: {err}", path.display())))?;
        let r: RunRecord = serde_json::from_slice(&bytes).map_err(|err| {
            CliError::usage(format!(
                "{}: not the record of a run ({err}); delete it or give --profile/--set",
                path.display()
            ))
        })?;
        runs.push(r);
    }
    runs.sort_by(|a, b| (b.finished_unix_ms, &b.name).cmp(&(a.finished_unix_ms, &a.name)));
    Ok(runs)
}

/// Records `record` in `store` (atomically, replacing a record of the same name).
///
/// # Errors
/// The store cannot be written (exit 1).
pub fn remember(
    store: &cudarl_core::Store,
    pipeline: &str,
    record: &RunRecord,
) -> Result<(), CliError> {
    let path = dir(store.root(), pipeline)?.join(format!("{}.json", record.name));
    let bytes = serde_json::to_vec_pretty(record).expect("run record serializes");
    store
        .write_atomic(&path, &bytes)
        .map_err(|e| CliError::failed(format!("{}: {e}", path.display())))
}

/// The runs as a note's list: `a, b (--run NAME)`, or empty for none.
pub fn named(runs: &[&RunRecord]) -> String {
    if runs.is_empty() {
        return String::new();
    }
    let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
    format!("{} (--run NAME)", names.join(", "))
}

/// The run `name` among `runs`.
///
/// # Errors
/// No such run (exit 2, the remembered ones listed, with a "did you mean").
pub fn find<'a>(
    runs: &'a [RunRecord],
    name: &str,
    pipeline: &str,
    store: &Path,
) -> Result<&'a RunRecord, CliError> {
    runs.iter().find(|r| r.name == name).ok_or_else(|| {
        let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
        CliError::usage(format!(
            "--run {name}: no remembered run of pipeline `{pipeline}` in {}{} (runs: {})",
            store.display(),
            cudarl_core::suggest::did_you_mean(name, names.iter().copied()),
            if names.is_empty() {
                "none yet".to_string()
            } else {
                names.join(", ")
            }
        ))
    })
}
