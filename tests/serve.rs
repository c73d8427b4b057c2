//! `cudarl-pipe serve` as a real process on loopback, driven over real HTTP: every endpoint,
//! the error codes, the bearer token, the body limit, the verdict cache, backpressure (429),
//! deadlines (504) and a clean shutdown on SIGTERM. Compile-only (no GPU here): real nvcc.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::Project;
use common::server::Server;
use serde_json::{Value, json};

/// The verdict `check --mode compile --json` gives `source` on `task`.
fn check_json(p: &Project, task: &str, source: &std::path::Path) -> Value {
    let o = p.run(&[
        "check",
        "--task",
        task,
        "--source",
        source.to_str().unwrap(),
        "--mode",
        "compile",
        "--json",
    ]);
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", common::stderr(&o)))
}

fn evaluate_body(task: &str, source: &str) -> String {
    json!({"task_id": task, "source": source}).to_string()
}

#[test]
fn serve_endpoints_errors_token_cache_and_shutdown() {
    let p = Project::new();
    let s = Server::start(&p, &["--token", "s3cret", "--max-body-bytes", "65536"]);
    let tok = Some("s3cret");

    // Health and metrics need no token.
    let h = s.call("GET", "/healthz", None, None);
    assert_eq!(h.status, 200);
    let hj = h.json();
    assert_eq!(hj["mode"], "compile-only");
    // The two task families, and the KernelBench problems kb-specs gave a native launcher.
    let kb = hj["kernelbench"].as_u64().unwrap();
    assert!(kb >= 100, "{hj}");
    assert_eq!(hj["tasks"], 2 + kb);
    assert_eq!(hj["gpus"], 0);
    assert_eq!(hj["gpu_testers"], 0);

    // /v1/* needs the token.
    let r = s.call("GET", "/v1/tasks", None, None);
    assert_eq!(r.status, 401);
    assert_eq!(r.www_auth.as_deref(), Some("Bearer"));
    assert_eq!(s.call("GET", "/v1/tasks", Some("wrong"), None).status, 401);
    let r = s.call("GET", "/v1/tasks", tok, None);
    assert_eq!(r.status, 200);
    let ids: Vec<String> = r.json()["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len() as u64, 2 + kb);
    assert_eq!(&ids[..2], ["row_sum", "vector_add"]);
    assert!(ids.iter().any(|i| i == "kb/L1/19_ReLU"), "{ids:?}");
    let t = s.call("GET", "/v1/tasks/vector_add", tok, None).json();
    assert!(t["signature"].as_str().unwrap().contains("launch("), "{t}");
    let prompt = t["prompt"].as_array().unwrap();
    assert_eq!(prompt[0]["role"], "system");
    assert!(
        prompt[1]["content"]
            .as_str()
            .unwrap()
            .contains(t["signature"].as_str().unwrap())
    );
    assert_eq!(s.call("GET", "/v1/tasks/nope", tok, None).status, 404);

    // A good kernel: the verdict `check --json` gives for it.
    let naive_path = p.path("datasets/tasks/vector_add/naive.cu");
    let naive = std::fs::read_to_string(&naive_path).unwrap();
    let r = s.call(
        "POST",
        "/v1/evaluate",
        tok,
        Some(&evaluate_body("vector_add", &naive)),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.cache.is_none());
    let v = r.json();
    let c = check_json(&p, "vector_add", &naive_path);
    for k in [
        "task_id",
        "abi",
        "mode",
        "compiled",
        "executed",
        "correct",
        "failure",
        "static_flags",
        "resources",
        "nvcc_version",
        "arch",
    ] {
        assert_eq!(v[k], c[k], "{k}");
    }
    assert_eq!(v["compiled"], true);
    assert_eq!(v["executed"], false);
    // The same request again: from the verdict cache, the same body.
    let again = s.call(
        "POST",
        "/v1/evaluate",
        tok,
        Some(&evaluate_body("vector_add", &naive)),
    );
    assert_eq!(again.cache.as_deref(), Some("hit"));
    assert_eq!(again.json(), v);

    // A broken kernel is a 200 with the failure and nvcc's diagnostics.
    let broken = naive.replacen(";", "", 1);
    let b = s.call(
        "POST",
        "/v1/evaluate",
        tok,
        Some(&evaluate_body("vector_add", &broken)),
    );
    assert_eq!(b.status, 200);
    let bj = b.json();
    assert_eq!(bj["failure"], "compile_error");
    assert!(!bj["diagnostics"].as_array().unwrap().is_empty());
    // With the tester's words on it, as rl-train's optimizer reads them.
    let fb = bj["feedback"].as_str().unwrap();
    assert!(
        fb.starts_with("Compilation failed:") && fb.contains("line "),
        "{fb}"
    );

    // A KernelBench problem: its prompt shows the PyTorch source and the launcher kb-specs
    // derived; a native candidate is built like any native kernel (compile-only here) and gets
    // the verdict `check --task kb/...` gives it.
    let t = s.call("GET", "/v1/tasks/kb/L1/19_ReLU", tok, None).json();
    let sig = t["signature"].as_str().unwrap();
    assert!(
        sig.starts_with(r#"extern "C" void launch(const float* in0"#),
        "{t}"
    );
    let user = t["prompt"][1]["content"].as_str().unwrap();
    assert!(
        user.contains("```python") && user.contains("torch.relu") && user.contains(sig),
        "{user}"
    );
    let relu_path = common::repo_root().join("tests/kernels/kb_native/19_ReLU.cu");
    let relu = std::fs::read_to_string(&relu_path).unwrap();
    let r = s.call(
        "POST",
        "/v1/evaluate",
        tok,
        Some(&evaluate_body("kb/L1/19_ReLU", &relu)),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let c = check_json(&p, "kb/L1/19_ReLU", &relu_path);
    for k in [
        "task_id",
        "abi",
        "compiled",
        "executed",
        "failure",
        "signature",
    ] {
        assert_eq!(v[k], c[k], "{k}");
    }
    assert_eq!(
        (v["compiled"].as_bool(), v["abi"].as_str()),
        (Some(true), Some("native"))
    );
    assert!(v["reward"].is_object() && v["feedback"].is_string(), "{v}");
    // A misnamed launcher: not built, and the expected signature named.
    let r = s.call(
        "POST",
        "/v1/evaluate",
        tok,
        Some(&evaluate_body(
            "kb/L1/19_ReLU",
            &relu.replace("void launch(", "void run("),
        )),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["compiled"], false, "{}", r.body);
    // A torch-format candidate is judged too, as `check` judges it: this `ModelNew` builds no
    // kernel (torch.relu stands in for it), which the static checks reject before any build.
    let model_new = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n";
    let r = s.call(
        "POST",
        "/v1/evaluate",
        tok,
        Some(&evaluate_body("kb/L1/19_ReLU", model_new)),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let mn_path = p.path("model_new.py");
    std::fs::write(&mn_path, model_new).unwrap();
    let c = check_json(&p, "kb/L1/19_ReLU", &mn_path);
    for k in ["abi", "compiled", "failure", "signature"] {
        assert_eq!(v[k], c[k], "{k}: {v}");
    }
    assert_eq!(v["failure"], "static_reject", "{v}");
    assert!(
        v["failure_detail"].as_str().unwrap().contains("no-kernel"),
        "{v}"
    );

    // Bad requests.
    let bad = |body: &str| s.call("POST", "/v1/evaluate", tok, Some(body));
    assert_eq!(bad("{").status, 400);
    let r = bad(r#"{"task_id": "vector_add", "source": "x", "colour": 1}"#);
    assert_eq!(r.status, 422);
    assert!(
        r.json()["error"].as_str().unwrap().contains("colour"),
        "{}",
        r.body
    );
    assert_eq!(bad(r#"{"task_id": 7, "source": "x"}"#).status, 422);
    let r = bad(&evaluate_body("nope", "x"));
    assert_eq!(r.status, 404);
    assert!(r.body.contains("unknown task `nope`"));
    let r = bad(&evaluate_body("kb/L9/1_Nothing", "x"));
    assert_eq!(r.status, 404);
    assert!(
        r.body.contains("native launcher from `kb-specs`"),
        "{}",
        r.body
    );
    let r = bad(r#"{"task_id": "vector_add", "source": "x", "mode": "full"}"#);
    assert_eq!(r.status, 422);
    assert!(r.body.contains("no GPU"), "{}", r.body);
    assert_eq!(
        bad(r#"{"task_id": "vector_add", "source": "x", "abi": "torch"}"#).status,
        422
    );
    assert_eq!(
        bad(r#"{"task_id": "vector_add", "source": "x", "seeds": []}"#).status,
        422
    );
    // An empty source or one that is not text: refused before nvcc, as `check` refuses it.
    for source in [" \n", "__global__ void k() {}\u{0}"] {
        let r = bad(&serde_json::json!({"task_id": "vector_add", "source": source}).to_string());
        assert_eq!(r.status, 422, "{source:?}: {}", r.body);
        assert!(r.body.contains("empty or not text"), "{}", r.body);
    }
    // Over the body limit: refused from the Content-Length alone, before any body is read
    // (raw HTTP/1.1, so the client does not trip over the early answer).
    {
        use std::io::{Read, Write};
        let addr = s.base.trim_start_matches("http://");
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        write!(
            c,
            "POST /v1/evaluate HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer s3cret\r\nContent-Type: application/json\r\nContent-Length: 200000\r\nConnection: close\r\n\r\n{{"
        )
        .unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut head = [0u8; 12];
        c.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 413");
    }
    let no_type = ureq::post(&format!("{}/v1/evaluate", s.base))
        .set("Authorization", "Bearer s3cret")
        .send_string(&evaluate_body("vector_add", &naive));
    assert!(matches!(no_type, Err(ureq::Error::Status(415, _))));

    // Metrics: responses by status, verdicts by outcome, cache hits, queue depth back to 0.
    let m = s.call("GET", "/metrics", None, None);
    assert_eq!(m.status, 200);
    for line in [
        "cudarl_serve_responses_total{code=\"200\"} 6",
        "cudarl_serve_responses_total{code=\"404\"} 2",
        "cudarl_serve_responses_total{code=\"413\"} 1",
        "cudarl_serve_verdicts_total{outcome=\"compiled\"} 2",
        "cudarl_serve_verdicts_total{outcome=\"compile_error\"} 2",
        "cudarl_serve_verdicts_total{outcome=\"static_reject\"} 1",
        "cudarl_serve_cache_hits_total 1",
        "cudarl_serve_queue_depth 0",
        "cudarl_serve_evaluate_seconds_count 6",
    ] {
        assert!(m.body.lines().any(|l| l == line), "{line} in\n{}", m.body);
    }

    // The OpenAPI document describes exactly the routes served.
    let api = s.call("GET", "/openapi.json", None, None).json();
    assert_eq!(api["openapi"], "3.1.0");
    let paths: BTreeSet<&str> = api["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let want: BTreeSet<&str> = [
        "/v1/evaluate",
        "/v1/evaluate/batch",
        "/v1/optimize",
        "/v1/tasks",
        "/v1/tasks/{id}",
        "/healthz",
        "/metrics",
        "/openapi.json",
    ]
    .into();
    assert_eq!(paths, want);
    // `/v1/optimize` runs the trained agents (tests/models.rs); here its bad requests.
    for (body, says) in [
        ("{}", "give one of `problem`"),
        (
            r#"{"problem": "print(1)"}"#,
            "not a KernelBench-format problem",
        ),
        (r#"{"problem_id": "kb/L1/19_ReLU", "colour": 1}"#, "colour"),
    ] {
        let r = s.call("POST", "/v1/optimize", tok, Some(body));
        assert_eq!(r.status, 422, "{body}: {}", r.body);
        assert!(r.body.contains(says), "{body}: {}", r.body);
    }
    assert_eq!(s.call("POST", "/v1/optimize", None, Some("{}")).status, 401);
    for path in want.iter().filter(|p| **p != "/v1/optimize") {
        let probe = path.replace("{id}", "vector_add");
        let body = match *path {
            "/v1/evaluate" => Some(evaluate_body("vector_add", &naive)),
            "/v1/evaluate/batch" => Some(
                json!({"candidates": [{"task_id": "vector_add", "source": naive}]}).to_string(),
            ),
            _ => None,
        };
        let method = if body.is_some() { "POST" } else { "GET" };
        let r = s.call(method, &probe, tok, body.as_deref());
        assert_eq!(r.status, 200, "{path}");
    }

    // VERL's reward function (python/cudarl_verl/reward.py) against the live service.
    verl_reward_function(&s, &naive);
    verl_agent_loop(&s, &naive);

    // SIGTERM: a clean exit.
    assert_eq!(s.stop(), Some(0));
}

/// `--gpus` naming a device there is none of, or given to a compile-only service, and
/// `--gpu-testers 0` are usage errors (exit 2, the flag named) before anything is built.
#[test]
fn serve_refuses_gpus_it_cannot_judge_on() {
    let p = Project::new();
    for (args, want) in [
        (&["serve", "--gpus", "99"][..], "--gpus"),
        (
            &["serve", "--mode", "compile", "--gpus", "0"][..],
            "--gpus 0",
        ),
        (&["serve", "--gpu-testers", "0"][..], "--gpu-testers"),
    ] {
        let o = p.run(args);
        let err = common::stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    assert!(
        !p.path("artifacts").exists(),
        "a refused serve built nothing"
    );
}

#[test]
fn serve_backpressure_and_deadlines() {
    let p = Project::new();
    let s = Arc::new(Server::start(
        &p,
        &["--queue", "1", "--compile-workers", "1"],
    ));
    let naive = std::fs::read_to_string(p.path("datasets/tasks/vector_add/naive.cu")).unwrap();
    // Six different kernels at once (a comment makes each a cache miss) into a queue of one:
    // one is admitted, the others are told to come back.
    let n = 6;
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (s, b, src) = (s.clone(), barrier.clone(), format!("// {i}\n{naive}"));
            std::thread::spawn(move || {
                b.wait();
                let r = s.call(
                    "POST",
                    "/v1/evaluate",
                    None,
                    Some(&evaluate_body("vector_add", &src)),
                );
                (r.status, r.retry_after)
            })
        })
        .collect();
    let got: Vec<(u16, Option<String>)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = got.iter().filter(|g| g.0 == 200).count();
    let busy: Vec<_> = got.iter().filter(|g| g.0 == 429).collect();
    assert!(ok >= 1 && !busy.is_empty(), "{got:?}");
    assert_eq!(ok + busy.len(), n, "{got:?}");
    assert!(busy.iter().all(|g| g.1.as_deref() == Some("1")));

    // A deadline shorter than the build: 504; the build goes on, and the same kernel asked
    // again with time to spare is answered (a compile-cache hit).
    let src = format!("// deadline\n{naive}");
    let body = json!({"task_id": "vector_add", "source": src, "deadline_s": 0.001}).to_string();
    let r = s.call("POST", "/v1/evaluate", None, Some(&body));
    assert_eq!(r.status, 504, "{}", r.body);
    assert!(r.body.contains("deadline"));
    // The abandoned build still holds the only admission slot until it finishes.
    let mut v = None;
    for _ in 0..120 {
        let r = s.call(
            "POST",
            "/v1/evaluate",
            None,
            Some(&evaluate_body("vector_add", &src)),
        );
        if r.status == 200 {
            v = Some(r.json());
            break;
        }
        assert_eq!(r.status, 429, "{}", r.body);
        std::thread::sleep(Duration::from_millis(250));
    }
    let v = v.expect("answered once the build finished");
    assert_eq!(v["compiled"], true);
    assert_eq!(
        v["cache_hit"], true,
        "the abandoned build landed in the compile cache"
    );
    let m = s.call("GET", "/metrics", None, None).body;
    assert!(
        m.contains("cudarl_serve_responses_total{code=\"429\"}"),
        "{m}"
    );
    assert!(
        m.contains("cudarl_serve_responses_total{code=\"504\"} 1"),
        "{m}"
    );
    assert!(m.lines().any(|l| l == "cudarl_serve_queue_depth 0"), "{m}");
}

/// Posts `body` to `/v1/evaluate/batch` and reads the answer line by line as it arrives: the
/// status, the content type, and each line with the seconds since the request was sent.
fn batch_lines(s: &Server, body: &str) -> (u16, Option<String>, Vec<(f64, Value)>) {
    use std::io::BufRead;
    let t0 = std::time::Instant::now();
    let resp = match ureq::post(&format!("{}/v1/evaluate/batch", s.base))
        .timeout(Duration::from_secs(300))
        .set("Content-Type", "application/json")
        .send_string(body)
    {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("batch: {e}"),
    };
    let (status, kind) = (
        resp.status(),
        resp.header("content-type").map(str::to_string),
    );
    let lines = std::io::BufReader::new(resp.into_reader())
        .lines()
        .map(|l| {
            let l = l.expect("a line");
            (
                t0.elapsed().as_secs_f64(),
                serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}")),
            )
        })
        .collect();
    (status, kind, lines)
}

#[test]
fn serve_batch_streams_each_candidates_answer_with_its_id() {
    let p = Project::new();
    let s = Server::start(&p, &["--queue", "1", "--compile-workers", "2"]);
    let naive = std::fs::read_to_string(p.path("datasets/tasks/vector_add/naive.cu")).unwrap();
    let broken = naive.replacen(";", "", 1);
    let cached = s.call(
        "POST",
        "/v1/evaluate",
        None,
        Some(&evaluate_body("vector_add", &naive)),
    );
    assert_eq!(cached.status, 200, "{}", cached.body);
    let first = format!("// first\n{naive}");
    let body = json!({"candidates": [
        {"id": "cached", "task_id": "vector_add", "source": naive},
        {"id": "unknown", "task_id": "nope", "source": naive},
        {"id": "empty", "task_id": "vector_add", "source": " "},
        {"id": "new", "task_id": "vector_add", "source": first},
        {"id": "broken", "task_id": "vector_add", "source": broken},
        {"task_id": "vector_add", "source": format!("// no id\n{naive}")},
    ]})
    .to_string();
    let (status, kind, lines) = batch_lines(&s, &body);
    assert_eq!(status, 200);
    assert_eq!(kind.as_deref(), Some("application/x-ndjson"));
    // Every candidate answered once; what needed no judging first, in order.
    let mut seen: Vec<u64> = lines
        .iter()
        .map(|(_, l)| l["index"].as_u64().unwrap())
        .collect();
    assert_eq!(seen[..3], [0, 1, 2], "{lines:?}");
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2, 3, 4, 5]);
    let line = |i: u64| &lines.iter().find(|(_, l)| l["index"] == i).unwrap().1;
    assert_eq!(line(0)["id"], "cached");
    assert_eq!(line(0)["cache"], "hit");
    assert_eq!(line(0)["verdict"], cached.json());
    assert_eq!(
        (line(1)["id"].as_str(), line(1)["status"].as_u64()),
        (Some("unknown"), Some(404))
    );
    assert!(
        line(1)["error"].as_str().unwrap().contains("unknown task"),
        "{}",
        line(1)
    );
    assert_eq!(line(2)["status"], 422);
    assert!(
        line(2)["error"].as_str().unwrap().contains("source"),
        "{}",
        line(2)
    );
    assert_eq!(
        (line(3)["status"].as_u64(), &line(3)["verdict"]["compiled"]),
        (Some(200), &json!(true))
    );
    assert!(line(3).get("cache").is_none());
    assert_eq!(line(4)["verdict"]["failure"], "compile_error");
    assert!(line(4)["verdict"]["reward"].is_object() && line(4)["verdict"]["feedback"].is_string());
    assert!(line(5).get("id").is_none(), "{}", line(5));
    // Streamed: the answers known at once came well before the last build ended.
    let last = lines.iter().map(|(t, _)| *t).fold(0.0, f64::max);
    assert!(last - lines[2].0 > 0.2, "{lines:?}");
    // A batch verdict is the one `/v1/evaluate` gives, from the same cache.
    let again = s.call(
        "POST",
        "/v1/evaluate",
        None,
        Some(&evaluate_body("vector_add", &first)),
    );
    assert_eq!(again.cache.as_deref(), Some("hit"));
    assert_eq!(again.json(), line(3)["verdict"]);

    // Identical candidates are judged once and each gets its line.
    let verdicts = |s: &Server| -> f64 {
        let m = s.call("GET", "/metrics", None, None).body;
        m.lines()
            .filter(|l| l.starts_with("cudarl_serve_verdicts_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let before = verdicts(&s);
    let twice = json!({"task_id": "vector_add", "source": format!("// twice\n{naive}")});
    let body = json!({"candidates": [twice.clone(), twice]}).to_string();
    let (status, _, lines) = batch_lines(&s, &body);
    assert_eq!((status, lines.len()), (200, 2), "{lines:?}");
    assert_eq!(lines[0].1["verdict"], lines[1].1["verdict"]);
    assert_eq!(lines[0].1["status"], 200);
    assert_eq!(
        verdicts(&s) - before,
        1.0,
        "one judging for two identical candidates"
    );
    let m = s.call("GET", "/metrics", None, None).body;
    assert!(
        m.contains("cudarl_serve_batch_lines_total{code=\"404\"} 1"),
        "{m}"
    );

    // The whole request refused: no candidates, too many, an unknown field in one.
    let tiny = json!({"task_id": "vector_add", "source": "x"});
    for (body, says) in [
        (json!({"candidates": []}), "1 to 1024"),
        (json!({"candidates": vec![tiny.clone(); 1025]}), "not 1025"),
        (
            json!({"candidates": [{"task_id": "vector_add", "source": "x", "colour": 1}]}),
            "colour",
        ),
    ] {
        let r = s.call("POST", "/v1/evaluate/batch", None, Some(&body.to_string()));
        assert_eq!(r.status, 422, "{}", r.body);
        assert!(r.body.contains(says), "{says}: {}", r.body);
    }

    // A deadline shorter than a build: that candidate's line is a 504, and its build goes on
    // holding the only admission slot.
    let late = format!("// late\n{naive}");
    let body = json!({"deadline_s": 0.001, "candidates": [{"id": "late", "task_id": "vector_add", "source": late}]});
    let (status, _, lines) = batch_lines(&s, &body.to_string());
    assert_eq!(status, 200);
    assert_eq!(
        (lines.len(), lines[0].1["status"].as_u64()),
        (1, Some(504)),
        "{lines:?}"
    );
    assert!(lines[0].1["error"].as_str().unwrap().contains("deadline"));
    // While it does, a batch that needs judging is told to come back; one that needs none is
    // answered.
    let r = s.call(
        "POST",
        "/v1/evaluate/batch",
        None,
        Some(&json!({"candidates": [{"task_id": "vector_add", "source": format!("// busy\n{naive}")}]}).to_string()),
    );
    assert_eq!(
        (r.status, r.retry_after.as_deref()),
        (429, Some("1")),
        "{}",
        r.body
    );
    let (status, _, lines) = batch_lines(
        &s,
        &json!({"candidates": [{"task_id": "vector_add", "source": naive}]}).to_string(),
    );
    assert_eq!(
        (status, lines[0].1["cache"].as_str()),
        (200, Some("hit")),
        "{lines:?}"
    );
    let m = s.call("GET", "/metrics", None, None).body;
    assert!(
        m.contains("cudarl_serve_responses_total{code=\"429\"} 1"),
        "{m}"
    );
}

/// `compute_score`, its async form and `compute_score_batch`, in the repository's Python,
/// scoring through `s`.
fn verl_reward_function(s: &Server, naive: &str) {
    let Some(python) = common::python() else {
        eprintln!("SKIPPED the VERL reward-function check: no .venv (run `make setup`)");
        return;
    };
    let script = r#"
import asyncio, json, os, sys
from cudarl_verl import reward as r
good = "Here it is:\n```cuda\n" + sys.stdin.read() + "```\n"
a = r.compute_score("cudarl-pipe/tier0", good, "vector_add", {"task_id": "vector_add"})
assert a["compiled"] and a["error"] == "" and a["score"] > 0, a
b = asyncio.run(r.compute_score_async("cudarl-pipe/tier0", good.replace(";", "", 1), "vector_add"))
assert b["failure"] == "compile_error" and b["score"] == 0.0, b
c = r.compute_score("x", "no code here", "vector_add")
assert c["score"] == 0.0 and c["error"] == "no_code", c
d = r.compute_score("x", good, "no_such_task")
assert d["error"] == "http_404" and d["score"] == 0.0, d
r.BATCH_CANDIDATES = 2  # three candidates in two requests
g = r.compute_score_batch(["x"] * 4, [good, "no code here", good.replace(";", "", 1), good],
                          ["vector_add", "vector_add", "vector_add", "no_such_task"], [{}] * 4)
assert [x["error"] for x in g] == ["", "no_code", "", "http_404"], g
assert g[0]["score"] == a["score"] and g[2]["failure"] == "compile_error", g
os.environ["CUDARL_SERVE_TOKEN"] = "wrong"
e = r.compute_score("x", good, "vector_add")
assert e["error"] == "http_401", e
h = r.compute_score_batch(["x"] * 3, [good] * 3, ["vector_add"] * 3)
assert [x["error"] for x in h] == ["http_401"] * 3 and set(h[0]) == set(a), h
os.environ["CUDARL_SERVE_URL"] = "http://127.0.0.1:9"
f = r.compute_score("x", good, "vector_add")
assert f["error"].startswith("network"), f
k = r.compute_score_batch(["x"], [good], ["vector_add"])
assert k[0]["error"].startswith("network"), k
# The agent loop's batched path answers a network failure, and unusable settings, with a line.
m = asyncio.run(r.evaluate_async("vector_add", "x"))
assert m["status"] == -1 and m["index"] == 0, m
os.environ["CUDARL_SERVE_TIMEOUT_S"] = "soon"
m = asyncio.run(r.evaluate_async("vector_add", "x"))
assert m["status"] == -1 and "ValueError" in m["error"], m
del os.environ["CUDARL_SERVE_TIMEOUT_S"]
assert dict(r.ERRORS) == {"no_code": 2, "http_404": 2, "http_401": 4, "network": 2}, r.ERRORS
print("OK", a["score"])
"#;
    python_against(s, &python, &["-c", script], naive);
}

/// The multi-turn VERL agent loop inside the pinned verl, against `s` (compile mode): see
/// tests/python/check_verl_agent_loop.py.
fn verl_agent_loop(s: &Server, naive: &str) {
    let root = common::repo_root();
    let Some(python) = common::python() else {
        eprintln!("SKIPPED the VERL agent-loop check: no .venv (run `make setup`)");
        return;
    };
    let script = root.join("tests/python/check_verl_agent_loop.py");
    python_against(s, &python, &[script.to_str().unwrap()], naive);
}

/// Runs `python args...` with the repository's `python/` on PYTHONPATH, pointed at `s` (token
/// `s3cret`, compile mode), `stdin` on its stdin; asserts it exits 0 printing `OK`.
fn python_against(s: &Server, python: &str, args: &[&str], stdin: &str) {
    let mut cmd = std::process::Command::new(python);
    cmd.args(args)
        .env("PYTHONPATH", common::repo_root().join("python"))
        .env("CUDARL_SERVE_URL", &s.base)
        .env("CUDARL_SERVE_TOKEN", "s3cret")
        .env("CUDARL_SERVE_MODE", "compile");
    let o = common::output_with_stdin(cmd, stdin);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.lines().any(|l| l.starts_with("OK")),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn bench_serve_reports_a_batch_answered_once_per_candidate() {
    let p = Project::new();
    let o = p.run(&[
        "bench",
        "serve",
        "--mode",
        "compile",
        "--clients",
        "2",
        "--seconds",
        "2",
        "--overhead-reps",
        "1",
        "--batch",
        "5",
        "--gpu-testers",
        "2,1",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["lost"], 0, "{v}");
    // The measured service, then the baseline under the same load, with the ratios over it.
    assert_eq!(v["gpu_testers"], 2, "{v}");
    let base = &v["baselines"][0];
    assert_eq!(base["gpu_testers"], 1, "{v}");
    assert_eq!(base["lost"], 0, "{v}");
    assert!(base["ok"].as_u64().unwrap() > 0, "{base}");
    let ratio = base["measured_over_baseline"]["verdicts_per_second"]
        .as_f64()
        .unwrap();
    let want =
        v["verdicts_per_second"].as_f64().unwrap() / base["verdicts_per_second"].as_f64().unwrap();
    assert!((ratio - want).abs() < 1e-9, "{base}");
    let b = &v["batch"];
    assert_eq!(b["candidates"], 5, "{v}");
    assert_eq!(b["answered_once"], true, "{b}");
    assert_eq!(b["statuses"], json!({"200": 5}), "{b}");
    assert!(b["first_line_seconds"].as_f64().unwrap() <= b["seconds"].as_f64().unwrap());
}
