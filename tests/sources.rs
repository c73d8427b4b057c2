//! Alternative sources: a KernelBench checkout directory, local archive files, and the
//! Hugging Face hub path through `hf-hub`: offline from a local mirror laid out like the hub
//! cache, and online against a real HTTP server on loopback (HF_ENDPOINT).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;

use common::*;

fn problems_rows(p: &Project) -> Vec<(String, String)> {
    let o = p.run(&[
        "export",
        "ingest-kernelbench",
        "--build",
        "--to",
        p.path("exp").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = cudarl_data::Table::read(
        &p.path("exp/ingest-kernelbench/problems.parquet"),
        "problems",
    )
    .unwrap();
    let id = t.req_strings("problem_id").unwrap();
    let code = t.req_strings("code").unwrap();
    (0..t.rows())
        .map(|i| {
            (
                id.get(i).unwrap().to_string(),
                code.get(i).unwrap().to_string(),
            )
        })
        .collect()
}

fn append_stage_table(p: &Project, node: &str, body: &str) {
    let f = p.path("pipelines/default.toml");
    let text = std::fs::read_to_string(&f).unwrap();
    // Replace the node's table with `body`.
    let start = text.find(&format!("[stages.{node}]")).unwrap();
    let end = text[start + 1..]
        .find("\n[stages.")
        .map(|e| start + 1 + e + 1)
        .unwrap_or(text.len());
    let new = format!(
        "{}[stages.{node}]\n{body}\n\n{}",
        &text[..start],
        &text[end..]
    );
    std::fs::write(&f, new).unwrap();
}

#[test]
fn kernelbench_checkout_matches_bundled() {
    let p = Project::new();
    p.run(&["run", "ingest-kernelbench"]);
    let bundled = problems_rows(&p);
    // Lay the bundled problems out as a KernelBench checkout.
    let t =
        cudarl_data::Table::read(&p.path("datasets/kernelbench/problems.parquet"), "x").unwrap();
    let (lv, name, code) = (
        t.req_ints("level").unwrap(),
        t.req_strings("name").unwrap(),
        t.req_strings("code").unwrap(),
    );
    for i in 0..t.rows() {
        let d = p.path(&format!("kb/KernelBench/level{}", lv.get(i).unwrap()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join(format!("{}.py", name.get(i).unwrap())),
            code.get(i).unwrap(),
        )
        .unwrap();
    }
    std::fs::write(p.path("kb/KernelBench/level1/README.md"), "not a problem").unwrap();
    append_stage_table(
        &p,
        "ingest-kernelbench",
        "source = \"checkout\"\npath = \"kb\"",
    );
    let (c, m) = p.run_json(&["run", "ingest-kernelbench"]);
    assert_eq!(c, 0, "{m:?}");
    assert_eq!(status_of(&m, "ingest-kernelbench"), "ran");
    assert_eq!(m["ingest-kernelbench"]["outputs"]["problems"]["rows"], 270);
    let from_checkout = problems_rows(&p);
    assert_eq!(from_checkout, bundled, "same ids and code from a checkout");
    // Editing one problem file re-runs ingest and explain names the file.
    std::fs::write(
        p.path("kb/KernelBench/level1/19_ReLU.py"),
        "class Model:\n    def forward(self, x):\n        return torch.relu(x) * 2\n",
    )
    .unwrap();
    let ex = stdout(&p.run(&["explain", "ingest-kernelbench"]));
    assert!(
        ex.contains("file level1/19_ReLU.py content changed"),
        "{ex}"
    );
}

#[test]
fn sakana_local_files() {
    let p = Project::new();
    let dir = p.path("archive");
    std::fs::create_dir_all(&dir).unwrap();
    let sample = p.path("datasets/sakana_ai_cuda_engineer_archive_sample/sample.parquet");
    let t = cudarl_data::Table::read(&sample, "x").unwrap();
    cudarl_data::write_parquet(&dir.join("level_1.parquet"), &t.batch.slice(0, 34)).unwrap();
    cudarl_data::write_parquet(&dir.join("level_2.parquet"), &t.batch.slice(34, 68)).unwrap();
    append_stage_table(
        &p,
        "ingest-sakana",
        "source = \"files\"\npath = \"archive\"",
    );
    let (c, m) = p.run_json(&["run", "ingest-sakana"]);
    assert_eq!(c, 0, "{m:?}");
    assert_eq!(m["ingest-sakana"]["outputs"]["kernels"]["rows"], 102);
    let w = m["ingest-sakana"]["warnings"].as_array().unwrap();
    assert!(
        w.iter().any(|w| w
            .as_str()
            .unwrap()
            .contains("PyTorch_Code_Functional, Torch_Profile")),
        "{w:?}"
    );
}

/// Lays out `files` like the hub cache: datasets--OWNER--NAME/{blobs/<etag>, refs/main,
/// snapshots/<commit>/<file>}.
fn make_mirror(cache: &Path, repo: &str, commit: &str, files: &[(&str, &Path)]) {
    let base = cache.join(format!("datasets--{}", repo.replace('/', "--")));
    std::fs::create_dir_all(base.join("refs")).unwrap();
    std::fs::write(base.join("refs/main"), commit).unwrap();
    for (name, src) in files {
        let data = std::fs::read(src).unwrap();
        let etag = blake3::hash(&data).to_hex().to_string();
        std::fs::create_dir_all(base.join("blobs")).unwrap();
        std::fs::write(base.join("blobs").join(&etag), &data).unwrap();
        let snap = base.join("snapshots").join(commit).join(name);
        std::fs::create_dir_all(snap.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(base.join("blobs").join(&etag), &snap).unwrap();
    }
}

const COMMIT: &str = "4edbe8d0c0ffee0000000000000000000000beef";

#[test]
fn hub_offline_from_local_mirror() {
    let p = Project::new();
    let cache = p.path("hfcache");
    let sample = p.path("datasets/sakana_ai_cuda_engineer_archive_sample/sample.parquet");
    make_mirror(
        &cache,
        "SakanaAI/AI-CUDA-Engineer-Archive",
        COMMIT,
        &[("level_1.parquet", &sample)],
    );
    append_stage_table(
        &p,
        "ingest-sakana",
        "source = \"hub\"\nhub = { repo = \"SakanaAI/AI-CUDA-Engineer-Archive\", files = [\"level_1.parquet\"], cache_dir = \"hfcache\", offline = true }",
    );
    let (c, m) = p.run_json(&["run", "ingest-sakana"]);
    assert_eq!(c, 0, "{m:?}");
    assert_eq!(m["ingest-sakana"]["outputs"]["kernels"]["rows"], 102);
    // Provenance names the hub dataset.
    let o = p.run(&["show", "ingest-sakana", "--json", "--head", "1"]);
    let row: serde_json::Value = serde_json::from_str(stdout(&o).lines().next().unwrap()).unwrap();
    assert!(
        row["provenance"]
            .as_str()
            .unwrap()
            .starts_with("hf:SakanaAI/AI-CUDA-Engineer-Archive@main level_1.parquet row"),
        "{row}"
    );
    assert!(
        row["row_id"]
            .as_str()
            .unwrap()
            .starts_with("sakana/level_1/"),
        "{row}"
    );

    // A file the mirror lacks: clear error, exit 2, never the network.
    append_stage_table(
        &p,
        "ingest-sakana",
        "source = \"hub\"\nhub = { repo = \"SakanaAI/AI-CUDA-Engineer-Archive\", files = [\"level_2.parquet\"], cache_dir = \"hfcache\", offline = true }",
    );
    let o = p.run(&["run", "ingest-sakana"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o) + &stdout(&o);
    assert!(
        e.contains("level_2.parquet") && e.contains("offline mode is on"),
        "{e}"
    );
}

/// A minimal hub file server: answers `GET /datasets/<repo>/resolve/<rev>/<file>` with the
/// headers hf-hub needs (ETag, X-Repo-Commit, Content-Range) and honours `Range`.
fn serve_hub(
    files: Vec<(String, Vec<u8>)>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h2 = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut req = String::new();
            if r.read_line(&mut req).is_err() {
                continue;
            }
            let mut range: Option<(usize, Option<usize>)> = None;
            loop {
                let mut l = String::new();
                if r.read_line(&mut l).unwrap_or(0) == 0 || l == "\r\n" {
                    break;
                }
                let lower = l.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("range: bytes=") {
                    let v = v.trim();
                    let (a, b) = v.split_once('-').unwrap();
                    range = Some((a.parse().unwrap(), b.parse().ok()));
                }
            }
            let path = req.split_whitespace().nth(1).unwrap_or("").to_string();
            h2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let found = files
                .iter()
                .find(|(n, _)| path.ends_with(&format!("/resolve/main/{n}")));
            let resp = match found {
                None => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_vec(),
                Some((_, data)) => {
                    let (a, b) = range.unwrap_or((0, None));
                    let b = b.unwrap_or(data.len() - 1).min(data.len() - 1);
                    let body = &data[a..=b];
                    let etag = blake3::hash(data).to_hex().to_string();
                    let mut h = format!(
                        "HTTP/1.1 206 Partial Content\r\nETag: \"{etag}\"\r\nX-Repo-Commit: {COMMIT}\r\nContent-Range: bytes {a}-{b}/{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        data.len(),
                        body.len()
                    )
                    .into_bytes();
                    h.extend_from_slice(body);
                    h
                }
            };
            let _ = s.write_all(&resp);
            let _ = s.flush();
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        }
    });
    (addr, hits)
}

#[test]
fn hub_download_over_loopback_http() {
    let p = Project::new();
    // The hub dataset's files have only code, level, name and problem_id.
    let t =
        cudarl_data::Table::read(&p.path("datasets/kernelbench/problems.parquet"), "x").unwrap();
    let keep: Vec<usize> = ["code", "level", "name", "problem_id"]
        .iter()
        .map(|c| t.schema.index_of(c).unwrap())
        .collect();
    let hub_file = p.path("hub_level_1.parquet");
    cudarl_data::write_parquet(&hub_file, &t.batch.project(&keep).unwrap()).unwrap();
    let data = std::fs::read(&hub_file).unwrap();
    let (endpoint, hits) = serve_hub(vec![("data/level_1-00000-of-00001.parquet".into(), data)]);
    append_stage_table(
        &p,
        "ingest-kernelbench",
        "source = \"hub\"\nhub = { repo = \"ScalingIntelligence/KernelBench\", files = [\"data/level_1-00000-of-00001.parquet\"], cache_dir = \"hfcache\" }",
    );
    let o = p
        .cmd(&["run", "ingest-kernelbench", "--json"])
        .env("HF_ENDPOINT", &endpoint)
        .env_remove("HF_HUB_OFFLINE")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    let rec: serde_json::Value = serde_json::from_str(stdout(&o).lines().next().unwrap()).unwrap();
    assert_eq!(rec["status"], "ran");
    assert_eq!(rec["outputs"]["problems"]["rows"], 270);
    assert!(
        hits.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "metadata + download requests"
    );
    // The file landed in the hub cache layout; a second run is offline-capable and cached.
    let snap = p.path(&format!(
        "hfcache/datasets--ScalingIntelligence--KernelBench/snapshots/{COMMIT}/data/level_1-00000-of-00001.parquet"
    ));
    assert!(snap.exists(), "{}", snap.display());
    let o = p
        .cmd(&["run", "ingest-kernelbench", "--json"])
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("\"status\":\"cached\""));
    // Provenance records the snapshot commit.
    let o = p.run(&["show", "ingest-kernelbench", "--json", "--head", "1"]);
    let row: serde_json::Value = serde_json::from_str(stdout(&o).lines().next().unwrap()).unwrap();
    assert_eq!(row["source_commit"], COMMIT);
    assert_eq!(row["source_kind"], "hub");
}
