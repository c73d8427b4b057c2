//! Reporters: indicatif progress bars on a terminal, plain log lines otherwise, silence for
//! machine-readable output (warnings and notes always go to stderr).

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cudarl_core::{NodeRecord, NodeStatus, ProgressSink, Reporter};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How the CLI reports progress.
pub enum CliReporter {
    /// Bars and spinners on a terminal.
    Bars(MultiProgress),
    /// One line per event on stderr.
    Plain,
    /// Warnings and notes only (for `--json`).
    Quiet,
}

impl CliReporter {
    /// Bars if stderr is a terminal and not `quiet`, else plain lines (or quiet).
    pub fn detect(quiet: bool) -> CliReporter {
        if quiet {
            CliReporter::Quiet
        } else if std::io::stderr().is_terminal() {
            CliReporter::Bars(MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
        } else {
            CliReporter::Plain
        }
    }

    fn line(&self, s: &str) {
        match self {
            CliReporter::Bars(m) => {
                let _ = m.println(s);
            }
            _ => eprintln!("{s}"),
        }
    }
}

impl Reporter for CliReporter {
    fn node_started(&self, node: &str, stage: &str) {
        if !matches!(self, CliReporter::Quiet) {
            self.line(&format!("   running {node} ({stage})"));
        }
    }

    fn node_waiting(&self, node: &str, why: &str) {
        self.line(&format!("   waiting {node}: {why}"));
    }

    fn node_note(&self, node: &str, message: &str) {
        self.line(&format!("      note {node}: {message}"));
    }

    fn node_finished(&self, r: &NodeRecord) {
        // A failure and why, on stderr whatever else is shown: the summary on stdout may be
        // JSON or piped away.
        if r.status == NodeStatus::Failed && !r.interrupted {
            let why = r.error.as_deref().unwrap_or("no message");
            self.line(&format!(
                "{:>10} {} ({:.2}s): {why}",
                "failed", r.node, r.seconds
            ));
            return;
        }
        if matches!(self, CliReporter::Quiet) {
            return;
        }
        if r.interrupted {
            let why = r.error.as_deref().unwrap_or("interrupted");
            self.line(&format!("{:>10} {}: {why}", "stopped", r.node));
            return;
        }
        if r.status == NodeStatus::Ran {
            self.line(&format!(
                "{:>10} {} ({:.2}s)",
                r.status.as_str(),
                r.node,
                r.seconds
            ));
        }
    }

    fn warning(&self, node: &str, message: &str) {
        self.line(&format!("   warning {node}: {message}"));
    }

    fn progress(&self, node: &str, label: &str, total: Option<u64>) -> Box<dyn ProgressSink> {
        match self {
            CliReporter::Bars(m) => {
                // A known total: a bar with elapsed time and ETA; an unknown one (a trainer's
                // steps): a spinner with the count, the rate and the elapsed time, ticking
                // while no step lands.
                let (pb, template) = match total {
                    Some(t) => (
                        ProgressBar::new(t),
                        "{prefix:>12} [{bar:30}] {pos}/{len} {per_sec} {elapsed} eta {eta} {msg}",
                    ),
                    None => (
                        ProgressBar::new_spinner(),
                        "{prefix:>12} {spinner} {pos} {msg} {per_sec} {elapsed}",
                    ),
                };
                pb.set_style(
                    ProgressStyle::with_template(template)
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=> "),
                );
                // Ticking keeps the elapsed time moving while one slow item (a trainer step, a
                // minute-long build) is under way.
                pb.enable_steady_tick(std::time::Duration::from_millis(250));
                pb.set_prefix(node.to_string());
                pb.set_message(label.to_string());
                Box::new(BarSink(m.add(pb)))
            }
            CliReporter::Plain => Box::new(PlainSink {
                node: node.to_string(),
                label: label.to_string(),
                state: Mutex::new((0, total, Instant::now(), Instant::now())),
            }),
            CliReporter::Quiet => Box::new(cudarl_core::NoProgress),
        }
    }
}

struct BarSink(ProgressBar);

impl ProgressSink for BarSink {
    fn inc(&self, n: u64) {
        self.0.inc(n);
    }
    fn set_total(&self, total: u64) {
        self.0.set_length(total);
    }
    fn finish(&self) {
        self.0.finish_and_clear();
    }
}

/// Logs progress at most every 5 seconds: items done, total, rate.
struct PlainSink {
    node: String,
    label: String,
    state: Mutex<(u64, Option<u64>, Instant, Instant)>,
}

impl ProgressSink for PlainSink {
    fn inc(&self, n: u64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 += n;
        if s.3.elapsed() >= Duration::from_secs(5) {
            s.3 = Instant::now();
            let rate = s.0 as f64 / s.2.elapsed().as_secs_f64().max(1e-9);
            eprintln!(
                "  progress {} {}: {}/{} ({rate:.1}/s)",
                self.node,
                self.label,
                s.0,
                s.1.map(|t| t.to_string()).unwrap_or_else(|| "?".into())
            );
        }
    }
    fn set_total(&self, total: u64) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1 = Some(total);
    }
    fn finish(&self) {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        eprintln!(
            "  progress {} {}: done, {} items in {:.1}s",
            self.node,
            self.label,
            s.0,
            s.2.elapsed().as_secs_f64()
        );
    }
}
