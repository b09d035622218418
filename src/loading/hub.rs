//! Hugging Face hub repositories, fetched into (or found in) the local hub cache. Without the
//! `hub` feature the fetches are errors that say so.

use std::path::PathBuf;

#[cfg(feature = "hub")]
use hf_hub::{api::sync::ApiBuilder, Cache};

use crate::error::{Error, Result};

/// Fetches `config.json`, `tokenizer.json` and the safetensors weights of the hub model `repo`
/// (`org/name`) and returns the snapshot folder holding them. Files already in the cache are
/// not downloaded again. `cache_dir` overrides the cache (default: `$HF_HOME/hub` or
/// `~/.cache/huggingface/hub`).
///
/// # Errors
/// [`Error::Hub`] when a file can be neither found in the cache nor downloaded.
pub fn fetch(repo: &str, cache_dir: Option<PathBuf>) -> Result<PathBuf> {
    let get = getter(repo, cache_dir)?;
    let config = get("config.json")?;
    get("tokenizer.json")?;
    match get("model.safetensors") {
        Ok(_) => {}
        Err(single) => {
            let index = get("model.safetensors.index.json").map_err(|_| single)?;
            let text = std::fs::read_to_string(index)?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| Error::Hub { message: format!("{repo}: index: {e}"), source: Some(e.into()) })?;
            let mut shards: Vec<&str> =
                json["weight_map"].as_object().into_iter().flatten().filter_map(|(_, f)| f.as_str()).collect();
            shards.sort_unstable();
            shards.dedup();
            for shard in shards {
                get(shard)?;
            }
        }
    }
    snapshot(repo, &config)
}

/// Whether `spec`, naming nothing on disk, reads as a hub repository id (`org/name`).
pub fn is_repo_id(spec: &str) -> bool {
    spec.split('/').count() == 2 && !spec.starts_with('.') && !spec.starts_with('/')
}

/// A function that finds `file` of the hub model `repo` in the cache or downloads it.
#[cfg(feature = "hub")]
fn getter(repo: &str, cache_dir: Option<PathBuf>) -> Result<impl Fn(&str) -> Result<PathBuf> + '_> {
    let cache = cache_dir.map_or_else(Cache::from_env, Cache::new);
    let api = ApiBuilder::from_cache(cache)
        .with_progress(false)
        .build()
        .map_err(|e| Error::Hub { message: format!("{repo}: {e}"), source: Some(e.into()) })?;
    let model = api.model(repo.to_string());
    Ok(move |file: &str| {
        model.get(file).map_err(|e| Error::Hub { message: format!("{repo}/{file}: {e}"), source: Some(e.into()) })
    })
}

/// Without the `hub` feature: every file is an error that says so.
#[cfg(not(feature = "hub"))]
fn getter(repo: &str, _cache_dir: Option<PathBuf>) -> Result<impl Fn(&str) -> Result<PathBuf> + '_> {
    Ok(move |file: &str| Err(Error::hub(format!("{repo}/{file}: specdec was built without the `hub` feature"))))
}

/// The snapshot folder holding `file`.
fn snapshot(repo: &str, file: &std::path::Path) -> Result<PathBuf> {
    file.parent().map(PathBuf::from).ok_or_else(|| Error::hub(format!("{repo}: odd cache path")))
}

/// Fetches a draft head's `config.json` and its weights (`model.safetensors`, else
/// `medusa_lm_head.safetensors`) from the hub repository `repo` and returns the folder.
///
/// # Errors
/// [`Error::Hub`] when a file can be neither found in the cache nor downloaded.
pub fn fetch_head(repo: &str, cache_dir: Option<PathBuf>) -> Result<PathBuf> {
    let get = getter(repo, cache_dir)?;
    let config = get("config.json")?;
    get("model.safetensors").or_else(|_| get("medusa_lm_head.safetensors"))?;
    snapshot(repo, &config)
}
