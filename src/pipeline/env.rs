//! What the stages run with: the operator's settings, the API client, the caches of the objects
//! they read, the clock and the HTTP client. The controller builds one [`Env`]; the stages never
//! reach into the controller.

use std::sync::Arc;
use std::time::Duration;

use super::cache::Cache;
use crate::conditions::Clock;

/// The default image of `modelserve pull`: this very version of modelserve.
pub const DEFAULT_PULL_IMAGE: &str =
    concat!("ghcr.io/modelserve/modelserve:", env!("CARGO_PKG_VERSION"));

/// The default llama.cpp server image.
pub const DEFAULT_ENGINE_IMAGE: &str = "ghcr.io/ggml-org/llama.cpp:server-b10587";
/// The same build for each GPU accelerator: official tags name the accelerator and the build.
pub const DEFAULT_ENGINE_IMAGE_CUDA: &str = "ghcr.io/ggml-org/llama.cpp:server-cuda-b10587";
pub const DEFAULT_ENGINE_IMAGE_ROCM: &str = "ghcr.io/ggml-org/llama.cpp:server-rocm-b10587";
pub const DEFAULT_ENGINE_IMAGE_VULKAN: &str = "ghcr.io/ggml-org/llama.cpp:server-vulkan-b10587";

/// The operator's settings the stages read (flags of `modelserve controller`).
#[derive(Clone, Debug, clap::Args)]
pub struct Settings {
    #[command(flatten)]
    pub registry: crate::hub::RegistryArgs,
    /// Secret (NAMESPACE/NAME, key "token") with the registry token used when a ModelServe names none.
    #[arg(long, env = "MODELSERVE_DEFAULT_TOKEN_SECRET")]
    pub default_token_secret: Option<String>,
    /// llama.cpp server image of the replicas, pinned by build (its tag names the build).
    #[arg(long, env = "MODELSERVE_ENGINE_IMAGE", default_value = DEFAULT_ENGINE_IMAGE)]
    pub engine_image: String,
    /// llama.cpp server image of replicas with engine.accelerator cuda, pinned by build (server-cuda-bN is CUDA 12, server-cuda13-bN CUDA 13).
    #[arg(long, env = "MODELSERVE_ENGINE_IMAGE_CUDA", default_value = DEFAULT_ENGINE_IMAGE_CUDA)]
    pub engine_image_cuda: String,
    /// llama.cpp server image of replicas with engine.accelerator rocm, pinned by build.
    #[arg(long, env = "MODELSERVE_ENGINE_IMAGE_ROCM", default_value = DEFAULT_ENGINE_IMAGE_ROCM)]
    pub engine_image_rocm: String,
    /// llama.cpp server image of replicas with engine.accelerator vulkan, pinned by build.
    #[arg(long, env = "MODELSERVE_ENGINE_IMAGE_VULKAN", default_value = DEFAULT_ENGINE_IMAGE_VULKAN)]
    pub engine_image_vulkan: String,
    /// Memory kept free on each GPU when the Check stage places layers (llama.cpp's --fit-target), for the CUDA context and what the estimate leaves out, e.g. 1Gi or 512Mi.
    #[arg(long, env = "MODELSERVE_GPU_HEADROOM", default_value = "1Gi", value_parser = parse_memory)]
    pub gpu_headroom: u64,
    /// The cluster's model mirror (`modelserve mirror`), e.g. http://modelserve-mirror:8090.
    #[arg(long, env = "MODELSERVE_MIRROR_URL")]
    pub mirror_url: Option<String>,
    /// A file holding the operator's token for the mirror (a projected ServiceAccount token for the mirror's audience), sent as "Authorization: Bearer" and read again before each request; without it the operator sends none (a mirror run with --auth none).
    #[arg(long, env = "MODELSERVE_MIRROR_TOKEN_FILE")]
    pub mirror_token_file: Option<std::path::PathBuf>,
    /// The audience of the token the replicas' init container presents to the mirror: the mirror's --audience.
    #[arg(long, env = "MODELSERVE_MIRROR_AUDIENCE", default_value = crate::mirror::auth::DEFAULT_AUDIENCE)]
    pub mirror_audience: String,
    /// The llama.cpp build the nodes run, when the image tag does not say (for example `latest`).
    #[arg(long, env = "MODELSERVE_ENGINE_BUILD", value_parser = parse_build)]
    pub engine_build: Option<u32>,
    /// The best CPU code the engine image has: "all" for the official images, which load the best variant for each CPU, or the best tier per architecture of an image built for one CPU level (none, avx2, avx512, amx, arm-dotprod; e.g. "avx2"). It caps the CPU repack the estimate counts.
    #[arg(long, env = "MODELSERVE_ENGINE_CPU", default_value = "all", value_parser = clap::value_parser!(crate::gguf::memory::repack::EngineCpu))]
    pub engine_cpu: crate::gguf::memory::repack::EngineCpu,
    /// Image of the replicas' init container that copies the model from the mirror (`modelserve pull`).
    #[arg(long, env = "MODELSERVE_PULL_IMAGE", default_value = DEFAULT_PULL_IMAGE)]
    pub pull_image: String,
    /// How long a replica may stay unschedulable before the Place stage reports it (the scheduler keeps retrying; a cluster autoscaler may add a node), e.g. 60s, 5m.
    #[arg(long, env = "MODELSERVE_PLACE_GRACE", default_value = "60s", value_parser = crate::units::parse_duration)]
    pub place_grace: Duration,
    /// How long a new replica may take to become ready, copying the model included, before the Place stage gives up, e.g. 30m, 2h.
    #[arg(long, env = "MODELSERVE_PLACE_TIMEOUT", default_value = "30m", value_parser = crate::units::parse_duration)]
    pub place_timeout: Duration,
    /// Restarts a replica's container may have before the Place stage reports a crash loop.
    #[arg(long, env = "MODELSERVE_CRASH_RESTARTS", default_value_t = 3, value_parser = clap::value_parser!(i32).range(0..))]
    pub crash_restarts: i32,
    /// Longest one stage of one ModelServe may run in a reconcile before it is stopped and retried, so a slow registry or replica holds up nobody else.
    #[arg(long, env = "MODELSERVE_STAGE_TIMEOUT", default_value = "5m", value_parser = crate::units::parse_duration)]
    pub stage_timeout: Duration,
}

fn parse_memory(s: &str) -> Result<u64, String> {
    crate::units::parse_quantity(s)
        .ok_or_else(|| format!("{s:?} is not a memory size such as 1Gi or 512Mi"))
}

impl Settings {
    /// The engine image of replicas on `accelerator`, unless the ModelServe names one.
    pub fn engine_image_for(&self, accelerator: crate::api::Accelerator) -> &str {
        use crate::api::Accelerator;
        match accelerator {
            Accelerator::Cpu => &self.engine_image,
            Accelerator::Cuda => &self.engine_image_cuda,
            Accelerator::Rocm => &self.engine_image_rocm,
            Accelerator::Vulkan => &self.engine_image_vulkan,
        }
    }

    /// The operator's token for the mirror, read now; None without --mirror-token-file.
    pub fn mirror_token(&self) -> Result<Option<String>, String> {
        let Some(path) = &self.mirror_token_file else {
            return Ok(None);
        };
        crate::mirror::auth::read_token_file(path)
            .map(Some)
            .map_err(|e| format!("cannot read the mirror token in {}: {e}", path.display()))
    }
}

fn parse_build(s: &str) -> Result<u32, String> {
    s.strip_prefix('b')
        .unwrap_or(s)
        .parse()
        .map_err(|_| format!("{s:?} is not a llama.cpp build number such as b6500"))
}

/// Everything one reconcile's stages share.
pub struct Env {
    pub client: kube::Client,
    pub settings: Settings,
    pub cache: Cache,
    pub clock: Arc<dyn Clock>,
    /// HTTP to the mirror and the replicas: one client, reused.
    pub http: reqwest::Client,
    /// Header inspections already made, shared by every ModelServe of the same file set.
    pub inspections: Memo<crate::api::CheckStatus>,
}

/// A small bounded memo: at most [`Memo::MOST`] entries, forgotten all at once when full, so
/// its memory is bounded whatever the number of models.
pub struct Memo<V> {
    entries: std::sync::Mutex<std::collections::HashMap<String, V>>,
}

impl<V: Clone> Default for Memo<V> {
    fn default() -> Self {
        Memo {
            entries: Default::default(),
        }
    }
}

impl<V: Clone> Memo<V> {
    pub const MOST: usize = 256;

    pub fn get(&self, key: &str) -> Option<V> {
        self.lock().get(key).cloned()
    }

    pub fn put(&self, key: String, value: V) {
        let mut m = self.lock();
        if m.len() >= Self::MOST {
            m.clear();
        }
        m.insert(key, value);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, V>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Env {
    /// One HTTP client for the mirror and the replicas. Proxies come from the environment
    /// (HTTPS_PROXY, NO_PROXY) as reqwest reads them; pod IPs and the mirror's Service are
    /// in-cluster, so a cluster with a proxy lists them in NO_PROXY as for any other client.
    pub fn http_client() -> Result<reqwest::Client, String> {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::{Memo, parse_build};

    #[test]
    fn the_memo_keeps_at_most_its_bound() {
        let m: Memo<u32> = Memo::default();
        for i in 0..(Memo::<u32>::MOST as u32 * 3) {
            m.put(format!("k{i}"), i);
            assert!(m.lock().len() <= Memo::<u32>::MOST);
        }
        m.put("a".into(), 7);
        assert_eq!(m.get("a"), Some(7));
        assert_eq!(m.get("b"), None);
    }

    #[test]
    fn builds_parse_with_or_without_the_b() {
        assert_eq!(parse_build("b6500"), Ok(6500));
        assert_eq!(parse_build("6500"), Ok(6500));
        assert!(parse_build("bb6500").is_err());
        assert!(parse_build("latest").unwrap_err().contains("b6500"));
    }
}
