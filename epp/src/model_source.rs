//! The model the picker tokenizes for: loaded at start from `--model-path`, or, for a
//! picker started without one (the operator's), from the first pod that serves a model
//! card (`dynamo_llm::model_card`, on each sidecar's metrics port), as Dynamo's frontend
//! loads its tokenizer from its workers' model deployment cards.
//!
//! Every pod's card is checked against the picker's model: a pod that serves another
//! model or uses another KV block size would be routed wrongly (its blocks never match
//! the prompts' hashes), so it is not routed to, and the reason shows in `/health`, in
//! the `dynamo_epp_model_card_mismatch` gauge and in the log. Never silently.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dynamo_kvcache::WorkerId;
use dynamo_llm::model_card::{CARD_PATH, ModelCard};
use dynamo_llm::{ApiError, ModelDir};
use futures::StreamExt;
use tokio::sync::Mutex;

use crate::request;
use crate::router::Router;

/// Longest a card's file may be (Qwen3's tokenizer.json is 11 MB).
const MAX_FILE_BYTES: u64 = 256 << 20;
/// How often a pod's card is read again once it has been checked.
const RECHECK: Duration = Duration::from_secs(60);
/// Longest wait between tries while a pod has no card yet (its engine downloads).
const MAX_RETRY: Duration = Duration::from_secs(5);

/// The model, once known, with what follows from it.
pub struct Loaded {
    pub model: Arc<ModelDir>,
    /// What pods are checked against.
    pub card: ModelCard,
    /// Largest request body read, in bytes.
    pub body_limit: usize,
}

/// The picker's model: set once, shared by the frontend, ext_proc and the pod checks.
#[derive(Clone)]
pub struct ModelSource {
    loaded: Arc<OnceLock<Loaded>>,
    /// One download at a time: the first pod with a card loads the model.
    loading: Arc<Mutex<()>>,
    /// Where downloaded model files go.
    dir: PathBuf,
    /// The served name and block size the picker routes with (its flags).
    name: String,
    block_size: u32,
    max_body_bytes: Option<usize>,
}

impl ModelSource {
    /// A source that learns the model from the pods' cards.
    pub fn from_pods(name: String, block_size: u32, max_body_bytes: Option<usize>) -> Self {
        let dir = std::env::temp_dir().join(format!("dynamo-epp-model-{}", std::process::id()));
        Self {
            loaded: Arc::default(),
            loading: Arc::default(),
            dir,
            name,
            block_size,
            max_body_bytes,
        }
    }

    /// A source with the model of the directory `path`.
    pub fn from_dir(
        path: &Path,
        name: Option<&str>,
        block_size: u32,
        max_body_bytes: Option<usize>,
    ) -> anyhow::Result<Self> {
        let model = ModelDir::load(path, name)?;
        let source = Self::from_pods(model.name.clone(), block_size, max_body_bytes);
        let card = ModelCard::read(path, &model.name, Some(block_size))?;
        source.set(model, card);
        Ok(source)
    }

    /// The served model name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model, or a 503 saying what the picker waits for.
    pub fn get(&self) -> Result<&Loaded, ApiError> {
        self.loaded.get().ok_or_else(|| ApiError {
            code: Some("model_not_loaded"),
            ..ApiError::unavailable(format!(
                "the picker has not loaded {:?} yet: it waits for a pod's model card",
                self.name
            ))
        })
    }

    fn set(&self, model: ModelDir, card: ModelCard) {
        let body_limit = self
            .max_body_bytes
            .unwrap_or_else(|| request::default_body_limit(&model));
        tracing::info!(model = %model.name, encoder = model.encoder(), "model ready");
        let model = Arc::new(model);
        // Requests are prepared on the runtime's workers: each builds its encoder cache
        // now, not on the first request it takes (`ModelDir::warm`).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let warm = model.clone();
            runtime.spawn(dynamo_server::on_every_worker(move || warm.warm()));
        }
        let _ = self.loaded.set(Loaded {
            model,
            card,
            body_limit,
        });
    }

    /// Downloads the card's files from `base` (`http://pod/model_card`) and loads them,
    /// unless a model is loaded already.
    async fn load_from(
        &self,
        client: &reqwest::Client,
        base: &str,
        card: &ModelCard,
    ) -> anyhow::Result<()> {
        let _one_at_a_time = self.loading.lock().await;
        if self.loaded.get().is_some() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.dir)?;
        for file in &card.files {
            anyhow::ensure!(
                ModelCard::is_card_file(&file.name) && file.bytes <= MAX_FILE_BYTES,
                "the card lists {:?} of {} bytes, which is no model card file",
                file.name,
                file.bytes
            );
            let bytes = download(client, &format!("{base}/files/{}", file.name)).await?;
            std::fs::write(self.dir.join(&file.name), bytes)?;
        }
        let (dir, name) = (self.dir.clone(), self.name.clone());
        let (model, read) = tokio::task::spawn_blocking(move || {
            let model = ModelDir::load(&dir, Some(&name))?;
            let read = ModelCard::read(&dir, &name, None)?;
            anyhow::Ok((model, read))
        })
        .await??;
        anyhow::ensure!(
            read.files == card.files,
            "the files downloaded from {base} are not the ones its card lists"
        );
        tracing::info!(model = %self.name, pod = %base, "model loaded from a pod's model card");
        self.set(model, card.clone());
        Ok(())
    }

    /// Why `card` does not fit what the picker routes with, if it does not.
    fn problem(&self, card: &ModelCard) -> Option<String> {
        if card.name != self.name {
            return Some(format!("serves {:?}, not {:?}", card.name, self.name));
        }
        if let Some(size) = card.block_size.filter(|&s| s != self.block_size) {
            return Some(format!(
                "uses KV blocks of {size} tokens, not the picker's {} (--block-size)",
                self.block_size
            ));
        }
        self.loaded.get()?.card.differs_from(card)
    }
}

/// Reads `url` whole, refusing more than [`MAX_FILE_BYTES`].
async fn download(client: &reqwest::Client, url: &str) -> anyhow::Result<Vec<u8>> {
    let response = client.get(url).send().await?.error_for_status()?;
    let mut bytes = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        bytes.extend_from_slice(&chunk?);
        anyhow::ensure!(
            bytes.len() as u64 <= MAX_FILE_BYTES,
            "{url} is longer than {MAX_FILE_BYTES} bytes"
        );
    }
    Ok(bytes)
}

/// Follows one pod's model card until aborted: loads the model from it when the picker
/// has none yet, and tells the router whether the pod fits.
pub async fn follow(
    router: Arc<Router>,
    worker: WorkerId,
    base: String,
    source: ModelSource,
    client: reqwest::Client,
) {
    let mut retry = Duration::from_millis(200);
    loop {
        let card = async {
            let response = client.get(&base).send().await?.error_for_status()?;
            anyhow::Ok(response.json::<ModelCard>().await?)
        }
        .await;
        let card = match card {
            Ok(card) => card,
            Err(e) => {
                tracing::debug!(pod = %base, error = %e, "no model card yet");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(MAX_RETRY);
                continue;
            }
        };
        // Only a pod that serves the picker's model may be the one it is loaded from.
        if source.loaded.get().is_none()
            && source.problem(&card).is_none()
            && let Err(e) = source.load_from(&client, &base, &card).await
        {
            tracing::warn!(pod = %base, error = %e, "loading the model from a pod's card failed");
            tokio::time::sleep(MAX_RETRY).await;
            continue;
        }
        let problem = source.problem(&card);
        if let Some(problem) = &problem {
            tracing::warn!(pod = %base, %problem, "a pod does not serve the picker's model: not routed to");
        }
        router.set_card_problem(worker, problem);
        retry = Duration::from_millis(200);
        tokio::time::sleep(RECHECK).await;
    }
}

/// The card URL of a pod whose sidecar serves its metrics (and card) on `port`.
pub fn card_url(address: std::net::SocketAddr, port: u16) -> String {
    format!(
        "http://{}{CARD_PATH}",
        std::net::SocketAddr::new(address.ip(), port)
    )
}
