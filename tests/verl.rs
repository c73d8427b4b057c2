//! `rl-train` with `backend = "verl"` (pipelines/verl.toml): the job directory, the Hydra
//! overrides composed against the installed verl's own `ppo_trainer` config (real verl 0.9.1,
//! real Hydra, a real `python -m verl.trainer.main_ppo --cfg job`), the agent loop import check,
//! and unknown keys refused with exit 2. Launching needs GPUs and vLLM: not run here.

mod common;

use common::*;

const COMPILE: &str = "validate.mode=\"compile\"";

fn blob(
    p: &Project,
    m: &std::collections::BTreeMap<String, serde_json::Value>,
    out: &str,
) -> Vec<u8> {
    let h = out_hash(m, "rl-train", out);
    std::fs::read(p.store().join("cas").join(&h[..2]).join(&h)).unwrap()
}

#[test]
fn verl_backend_writes_and_composes_the_job() {
    if python().is_none() {
        eprintln!("SKIPPED the VERL backend test: no .venv (run `make setup`)");
        return;
    }
    let p = Project::new();
    let args = [
        "run",
        "rl-train",
        "--pipeline",
        "pipelines/verl.toml",
        "--set",
        COMPILE,
    ];
    let (c, m) = p.run_json(&args);
    assert_eq!(c, 0, "{:?}", m.get("rl-train"));
    assert_eq!(status_of(&m, "rl-train"), "ran");
    // The composed config is verl's, with our keys in it.
    let config = String::from_utf8(blob(&p, &m, "config")).unwrap();
    for needle in [
        "default_agent_loop: cudarl_kernel_agent",
        "agent_loop_config_path: cudarl_verl/agent_loop.yaml",
        "train_files: rl_train.parquet",
        "adv_estimator: grpo",
        "kl_loss_coef: 0.04",
        "total_training_steps: 4",
        "path: Qwen/Qwen2.5-Coder-7B-Instruct",
    ] {
        assert!(config.contains(needle), "{needle} in\n{config}");
    }
    let overrides = String::from_utf8(blob(&p, &m, "overrides")).unwrap();
    assert!(
        overrides
            .lines()
            .any(|l| l == "actor_rollout_ref.rollout.n=4"),
        "{overrides}"
    );
    // The job directory holds everything the cluster needs, byte for byte.
    let job: serde_json::Value = serde_json::from_slice(&blob(&p, &m, "job")).unwrap();
    assert_eq!(job["launched"], false);
    assert_eq!(job["verl"], "0.9.1");
    let cmd: Vec<&str> = job["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(&cmd[1..3], ["-m", "verl.trainer.main_ppo"]);
    let dir = std::path::PathBuf::from(job["job_dir"].as_str().unwrap());
    assert_eq!(
        std::fs::read(dir.join("rl_train.parquet")).unwrap(),
        blob(&p, &m, "rl_train")
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("overrides.txt")).unwrap(),
        overrides
    );
    for f in [
        "agent_loop.py",
        "agent_loop.yaml",
        "reward.py",
        "__init__.py",
    ] {
        assert_eq!(
            std::fs::read(dir.join("cudarl_verl").join(f)).unwrap(),
            std::fs::read(repo_root().join("python/cudarl_verl").join(f)).unwrap(),
            "{f}"
        );
    }
    assert!(
        m["rl-train"]["warnings"][0]
            .as_str()
            .unwrap()
            .contains("not launched (launch = false)"),
        "{}",
        m["rl-train"]
    );
    // Cached on a second run.
    let (c, m2) = p.run_json(&args);
    assert_eq!((c, status_of(&m2, "rl-train")), (0, "cached".to_string()));

    // A key verl's config does not have: exit 2, named, nothing published.
    let before = p.store_snapshot();
    let mut bad = args.to_vec();
    bad.extend(["--set", "rl-train.overrides=[\"trainer.bogus_key=1\"]"]);
    let (c, m) = p.run_json(&bad);
    assert_eq!(c, 2);
    let err = m["rl-train"]["error"].as_str().unwrap();
    assert!(
        err.contains("trainer.bogus_key") && err.contains("overrides"),
        "{err}"
    );
    let after = p.store_snapshot();
    assert!(
        !after
            .keys()
            .any(|k| k.starts_with("ac/rl-train") && !before.contains_key(k)),
        "no manifest for a rejected configuration"
    );
    // The `+` prefix adds a key, as in Hydra.
    let mut plus = args.to_vec();
    plus.extend(["--set", "rl-train.overrides=[\"+trainer.note=hello\"]"]);
    assert_eq!(p.run_json(&plus).0, 0);
}

#[test]
fn the_default_pipeline_says_where_the_verl_backend_lives() {
    let p = Project::new();
    // Its rl-train section holds the tch trainer's params (and its eval reads checkpoints a
    // VERL job does not produce here): the error points to pipelines/verl.toml.
    let o = p.run(&["run", "rl-train", "--set", "rl-train.backend=\"verl\""]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--pipeline pipelines/verl.toml"),
        "{}",
        stderr(&o)
    );
    let o = p.run(&["run", "rl-train", "--set", "rl-train.backend=\"jax\""]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("expected `tch` or `verl`"),
        "{}",
        stderr(&o)
    );
}
