//! Hugging Face hub datasets through the `hf-hub` crate: files resolve from the local hub cache
//! (the `huggingface_hub` layout: `datasets--OWNER--NAME/{blobs,refs,snapshots}`), or are
//! downloaded into it when online. Offline mode (`offline = true` or `HF_HUB_OFFLINE=1`) never
//! touches the network and fails with a clear message if a file is not cached.

use std::path::PathBuf;

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

use crate::error::{DataError, Result};

/// Where and how to get files of one hub dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubDataset {
    /// `owner/name`, e.g. `SakanaAI/AI-CUDA-Engineer-Archive`.
    pub repo: String,
    /// Branch, tag or commit (default `main`).
    pub revision: String,
    /// Hub cache directory; `None` = `HF_HUB_CACHE`, `$HF_HOME/hub`, or `~/.cache/huggingface/hub`.
    pub cache_dir: Option<PathBuf>,
    /// Never use the network.
    pub offline: bool,
    /// Hub endpoint; `None` = `HF_ENDPOINT` or `https://huggingface.co`.
    pub endpoint: Option<String>,
}

impl HubDataset {
    fn cache(&self) -> Cache {
        match &self.cache_dir {
            Some(d) => Cache::new(d.clone()),
            None => Cache::from_env(),
        }
    }

    fn repo_handle(&self) -> Repo {
        Repo::with_revision(self.repo.clone(), RepoType::Dataset, self.revision.clone())
    }

    /// Whether offline mode is on (param or `HF_HUB_OFFLINE=1`).
    pub fn is_offline(&self) -> bool {
        self.offline
            || std::env::var("HF_HUB_OFFLINE")
                .is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
    }

    /// Description used in messages and in cache-key preimages (no local paths).
    pub fn describe(&self) -> String {
        format!("hub dataset {}@{}", self.repo, self.revision)
    }

    /// Local paths of `files` (paths inside the repository), downloading missing ones unless
    /// offline.
    ///
    /// # Errors
    /// [`DataError::Source`] naming the file: not cached while offline, or the download failed.
    pub fn resolve(&self, files: &[String]) -> Result<Vec<(String, PathBuf)>> {
        let cache = self.cache();
        let offline = self.is_offline();
        let mut api = None;
        let mut out = Vec::new();
        for f in files {
            if let Some(p) = cache.repo(self.repo_handle()).get(f) {
                out.push((f.clone(), p));
                continue;
            }
            if offline {
                return Err(DataError::Source {
                    source_desc: format!("{} file {f}", self.describe()),
                    message: format!(
                        "not in the hub cache at {} and offline mode is on (download it once online, or point cache_dir at a mirror)",
                        cache.path().display()
                    ),
                });
            }
            if api.is_none() {
                let mut b = ApiBuilder::from_cache(cache.clone()).with_progress(false);
                if let Some(e) = self
                    .endpoint
                    .clone()
                    .or_else(|| std::env::var("HF_ENDPOINT").ok())
                {
                    b = b.with_endpoint(e);
                }
                api = Some(b.build().map_err(|e| DataError::Source {
                    source_desc: self.describe(),
                    message: format!("cannot create hub client: {e}"),
                })?);
            }
            let p = api
                .as_ref()
                .expect("built above")
                .repo(self.repo_handle())
                .get(f)
                .map_err(|e| DataError::Source {
                    source_desc: format!("{} file {f}", self.describe()),
                    message: format!("download failed: {e}"),
                })?;
            out.push((f.clone(), p));
        }
        Ok(out)
    }
}

/// The commit hash of a file resolved from the hub cache (`.../snapshots/<commit>/<file>`).
pub fn snapshot_commit(path: &std::path::Path) -> Option<String> {
    let comps: Vec<&str> = path
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .collect();
    comps
        .windows(2)
        .rev()
        .find(|w| w[0] == "snapshots")
        .map(|w| w[1].to_string())
}
