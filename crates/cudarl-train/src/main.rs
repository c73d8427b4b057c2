//! `cudarl-pipe-train JOB.json`: runs one trainer job (see `cudarl_train::job`). Exit codes: 0
//! done, 2 bad input (unreadable or malformed job, bad data, bad model files), 1 other failures.

use std::process::ExitCode;

use cudarl_train::ModelError;
use cudarl_train::job::{Job, run};

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: cudarl-pipe-train JOB.json");
        return ExitCode::from(2);
    };
    let job: Job = match std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
    {
        Ok(j) => j,
        Err(e) => {
            eprintln!("error: {path}: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&job) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                ModelError::Torch(_) => ExitCode::from(1),
                _ => ExitCode::from(2),
            }
        }
    }
}
