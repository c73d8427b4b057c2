//! `cudarl-pipe serve` as a child process on loopback, and requests to it over real HTTP.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::Project;

/// `cudarl-pipe serve` on a free loopback port, compile-only, killed when dropped.
pub struct Server {
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Server {
    /// Starts it in `p` with `extra` arguments and waits for its address.
    pub fn start(p: &Project, extra: &[&str]) -> Server {
        let mut args = vec!["serve", "--bind", "127.0.0.1:0", "--mode", "compile"];
        args.extend_from_slice(extra);
        let mut child = p
            .cmd(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(180))
            .expect("serve prints its address");
        let base = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in `{line}`"))
            .to_string();
        Server { child, base }
    }

    /// (status, headers we look at, body) of one request.
    pub fn call(&self, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Reply {
        let mut r = ureq::request(method, &format!("{}{path}", self.base))
            .timeout(Duration::from_secs(120));
        if let Some(t) = token {
            r = r.set("Authorization", &format!("Bearer {t}"));
        }
        let res = match body {
            Some(b) => r.set("Content-Type", "application/json").send_string(b),
            None => r.call(),
        };
        let resp = match res {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        Reply {
            status: resp.status(),
            cache: resp.header("x-cache").map(str::to_string),
            retry_after: resp.header("retry-after").map(str::to_string),
            www_auth: resp.header("www-authenticate").map(str::to_string),
            body: resp.into_string().unwrap_or_default(),
        }
    }

    /// SIGTERM, then its exit code.
    pub fn stop(mut self) -> Option<i32> {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        self.child.wait().unwrap().code()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One answer: the status, the headers the tests look at, the body.
pub struct Reply {
    pub status: u16,
    pub cache: Option<String>,
    pub retry_after: Option<String>,
    pub www_auth: Option<String>,
    pub body: String,
}

impl Reply {
    /// The body as JSON (panics with the body when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}
