//! The `modelserve.dev/v1alpha1` `ModelServe` API: spec, status and the CRD they generate.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

mod status;
pub use status::*;

/// API group of every modelserve resource.
pub const GROUP: &str = "modelserve.dev";
/// Quantisation chosen when neither `quant` nor `file` is set.
pub const DEFAULT_QUANT: &str = "Q4_K_M";
/// Revision resolved when `revision` is empty.
pub const DEFAULT_REVISION: &str = "main";

/// Serve a GGUF model from a Hugging Face repository with llama.cpp. The controller resolves the
/// repository to a pinned file set, checks that the nodes' llama.cpp build can load it and that a
/// node can hold it, mirrors the files, creates the serving objects, waits for a ready replica and
/// smoke-tests it; each stage is a condition in status.
// clippy reads the repeated `type_ = "string"` of the printcolumns as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "modelserve.dev",
    version = "v1alpha1",
    kind = "ModelServe",
    plural = "modelserves",
    shortname = "ms",
    category = "modelserve",
    namespaced,
    status = "ModelServeStatus",
    derive = "PartialEq",
    doc = "ModelServe serves a GGUF model from a Hugging Face repository with llama.cpp.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Repo", type_ = "string", json_path = ".spec.repo"),
    printcolumn(name = "Quant", type_ = "string", json_path = ".status.resolved.quant"),
    printcolumn(name = "Stage", type_ = "string", json_path = ".status.stage"),
    printcolumn(name = "Progress", type_ = "string", json_path = ".status.progress"),
    printcolumn(name = "Memory", type_ = "string", json_path = ".status.check.memory"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.ready"),
    printcolumn(
        name = "Tok/s",
        type_ = "number",
        json_path = ".status.smoke.tokensPerSecond"
    ),
    printcolumn(
        name = "Asked",
        type_ = "date",
        json_path = ".status.demand.lastRequestAt"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("!(has(self.quant) && has(self.file))").message("set either quant or file, not both").field_path(".file"),
    validation = Rule::new("self.contextLength <= self.contextSize").message("contextLength (tokens per request) must not exceed contextSize (the server's whole context, shared by the parallel slots)").field_path(".contextLength")
)]
#[serde(rename_all = "camelCase")]
pub struct ModelServeSpec {
    /// Repository on the model registry, as owner/name (for example bartowski/Qwen2.5-7B-Instruct-GGUF).
    #[schemars(
        regex(
            pattern = r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,94}[A-Za-z0-9])?/[A-Za-z0-9]([A-Za-z0-9_.-]{0,94}[A-Za-z0-9])?$"
        ),
        length(max = 200)
    )]
    pub repo: String,

    /// Branch, tag or commit to serve; default main. It is resolved once to a commit and pinned in status.resolved.commit, so a moved branch never silently changes a served model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255), regex(pattern = r"^[A-Za-z0-9_./-]+$"))]
    #[x_kube(validation = Rule::new("!self.contains('..')").message("revision must not contain '..'"))]
    pub revision: Option<String>,

    /// Quantisation to serve, matched as a whole token of the file name, case-insensitively (Q4_K_M, Q8_0, UD-Q4_K_XL, ...). Default Q4_K_M. Set either quant or file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    )]
    pub quant: Option<String>,

    /// A GGUF file path in the repository, or the name of a split shard set, to serve instead of choosing by quant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    #[x_kube(
        validation = Rule::new("!self.contains('..')").message("file must be a path inside the repository: '..' is not allowed"),
        validation = Rule::new("!self.startsWith('/')").message("file must be a path relative to the repository root, without a leading '/'")
    )]
    pub file: Option<String>,

    /// Name clients use for the model (the OpenAI "model" field). Suggested from the repository when empty: bartowski/Qwen2.5-7B-Instruct-GGUF becomes qwen2.5-7b-instruct.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$")
    )]
    pub served_name: Option<String>,

    /// Further names the model answers to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub aliases: Vec<String>,

    /// Free text describing the model for people browsing the catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub description: Option<String>,

    /// Number of serving replicas; 0 means on demand: everything is prepared and a later scale-up starts it.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,

    /// Total context of the llama.cpp server in tokens (--ctx-size), shared by its parallel slots. Default 16384.
    #[serde(default = "default_context_size")]
    #[schemars(range(min = 256, max = 4194304))]
    pub context_size: i32,

    /// Context of one request in tokens; the server gets contextSize / contextLength parallel slots. Default 4096.
    #[serde(default = "default_context_length")]
    #[schemars(range(min = 256, max = 4194304))]
    pub context_length: i32,

    /// Secret in this namespace holding the registry token for gated or private repositories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<SecretKeyRef>,

    /// Overrides of the operator's llama.cpp engine defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineSpec>,

    /// The chat completion sent to a ready replica to prove it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smoke_test: Option<SmokeTestSpec>,

    /// Loading on demand through the gateway (`modelserve gateway`). When set, the gateway owns replicas: a request for the model at 0 replicas scales it to 1, and idleAfter without a request scales it back to 0. A person may still scale it up; the gateway scales it back to 0 once it is idle. Without it, replicas 0 leaves the model cataloged until someone scales it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_demand: Option<OnDemandSpec>,
}

/// How an on-demand model is loaded and unloaded by the gateway.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct OnDemandSpec {
    /// How long the model stays loaded after its last request before the gateway scales it back to 0 replicas: a duration from 1s to 7d such as 30s, 15m or 1h30m. Default 15m.
    #[serde(default = "default_idle_after")]
    #[schemars(length(min = 2, max = 32), regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub idle_after: String,
}

/// The shortest and longest idleAfter.
pub const MIN_IDLE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);
pub const MAX_IDLE_AFTER: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

impl OnDemandSpec {
    /// idleAfter as a duration, or why it is not one within 1s..=7d.
    pub fn idle_after(&self) -> Result<std::time::Duration, String> {
        let d = crate::units::parse_duration(&self.idle_after)
            .map_err(|e| format!("spec.onDemand.idleAfter: {e}"))?;
        if !(MIN_IDLE_AFTER..=MAX_IDLE_AFTER).contains(&d) {
            return Err(format!(
                "spec.onDemand.idleAfter: {:?} is out of range; give a duration from 1s to 7d",
                self.idle_after
            ));
        }
        Ok(d)
    }
}

fn default_idle_after() -> String {
    "15m".into()
}

/// A key of a Secret in the ModelServe's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key in the Secret whose value is the token; default "token".
    #[serde(default = "default_token_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Optional overrides of the llama.cpp engine; unset fields take the operator's configuration.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(
    validation = Rule::new("!has(self.gpus) || self.gpus == 0 || (has(self.accelerator) && self.accelerator != 'cpu')").message("engine.gpus above 0 needs a GPU accelerator: set engine.accelerator to cuda, rocm or vulkan").field_path(".gpus"),
    validation = Rule::new("!(has(self.gpuLayers) || has(self.splitMode) || has(self.gpuResource) || has(self.gpuMemory)) || (has(self.accelerator) && self.accelerator != 'cpu')").message("gpuLayers, splitMode, gpuResource and gpuMemory apply to a GPU accelerator only: set engine.accelerator to cuda, rocm or vulkan").field_path(".accelerator")
)]
#[serde(rename_all = "camelCase")]
pub struct EngineSpec {
    /// llama.cpp server image, pinned by build (for example ghcr.io/ggml-org/llama.cpp:server-b6500).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// Extra llama-server arguments appended after the ones the operator computes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// Resources of the server container; memory defaults to the Check stage's estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Node labels a replica's node must have; also narrows the nodes the Check stage considers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the replicas' pods; also widens the nodes the Check stage considers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// What the replicas compute on: cpu (default), cuda, rocm or vulkan. With a GPU the Check stage computes, before any download, how many layers fit on which GPU of the nodes, by llama.cpp's own placement rules, and the replicas run with exactly that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<Accelerator>,
    /// GPUs per replica (default 1 with a GPU accelerator); requested as the gpuResource extended resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 16))]
    pub gpus: Option<i32>,
    /// Layers to offload to the GPUs (llama.cpp --n-gpu-layers, the output layer counting as one); default: the most that fit, computed by the Check stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10000))]
    pub gpu_layers: Option<i32>,
    /// How the model is split over several GPUs (llama.cpp --split-mode): layer (default), row or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_mode: Option<SplitMode>,
    /// The extended resource the GPUs are requested as; default from the accelerator: nvidia.com/gpu for cuda and vulkan, amd.com/gpu for rocm. A MIG slice of the device plugin's mixed strategy, such as nvidia.com/mig-1g.10gb, is placed by its own memory label (nvidia.com/mig-1g.10gb.memory), never the whole GPU's. A GPU the device plugin shares among N pods (time-slicing or MPS, GFD's replicas label), under nvidia.com/gpu or its own name such as nvidia.com/gpu.shared, gives a replica a Nth of its memory, as MPS limits each pod to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
        )
    )]
    pub gpu_resource: Option<String>,
    /// Memory of one GPU, such as 24Gi, for nodes whose labels do not say (nvidia.com/gpu.memory from GPU Feature Discovery, amd.com/gpu.vram); it also replaces what they say. On GPUs shared among pods, the memory one replica may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 32),
        regex(pattern = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")
    )]
    pub gpu_memory: Option<String>,
}

/// What the replicas compute on.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Accelerator {
    #[default]
    Cpu,
    Cuda,
    Rocm,
    Vulkan,
}

impl Accelerator {
    pub fn is_gpu(self) -> bool {
        self != Accelerator::Cpu
    }

    pub fn name(self) -> &'static str {
        match self {
            Accelerator::Cpu => "cpu",
            Accelerator::Cuda => "cuda",
            Accelerator::Rocm => "rocm",
            Accelerator::Vulkan => "vulkan",
        }
    }

    /// The extended resource GPUs of this kind are requested as, unless engine.gpuResource says.
    pub fn default_resource(self) -> Option<&'static str> {
        match self {
            Accelerator::Cpu => None,
            Accelerator::Cuda | Accelerator::Vulkan => Some("nvidia.com/gpu"),
            Accelerator::Rocm => Some("amd.com/gpu"),
        }
    }
}

/// How llama.cpp splits a model over several GPUs.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum SplitMode {
    /// Whole layers per GPU, in proportion to --tensor-split.
    #[default]
    Layer,
    /// Rows of each weight matrix across the GPUs.
    Row,
    /// One GPU only.
    None,
}

impl SplitMode {
    pub fn name(self) -> &'static str {
        match self {
            SplitMode::Layer => "layer",
            SplitMode::Row => "row",
            SplitMode::None => "none",
        }
    }
}

impl EngineSpec {
    /// The accelerator, defaulted to cpu.
    pub fn accelerator(&self) -> Accelerator {
        self.accelerator.unwrap_or_default()
    }

    /// GPUs per replica: the spec's, else 1 with a GPU accelerator, else 0.
    pub fn gpus(&self) -> u32 {
        match (self.gpus, self.accelerator().is_gpu()) {
            (Some(n), true) => n.clamp(0, 16) as u32,
            (None, true) => 1,
            (_, false) => 0,
        }
    }

    /// The extended resource the GPUs are requested as.
    pub fn gpu_resource(&self) -> Option<String> {
        self.gpu_resource
            .clone()
            .or_else(|| self.accelerator().default_resource().map(String::from))
    }

    /// The memory the user asks for in `resources`: the request, or else the limit (which
    /// Kubernetes copies into a missing request). None when only the estimate applies.
    pub fn memory_request(
        &self,
    ) -> Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity> {
        let r = self.resources.as_ref()?;
        [&r.requests, &r.limits]
            .into_iter()
            .find_map(|m| m.as_ref()?.get("memory"))
    }
}

/// The smoke test sent once to a ready replica.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SmokeTestSpec {
    /// Run the smoke test; default true.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The user message of the chat completion.
    #[serde(default = "default_prompt")]
    #[schemars(length(min = 1, max = 4096))]
    pub prompt: String,
    /// Upper bound of generated tokens (1 to 4096); default 32.
    #[serde(default = "default_max_tokens")]
    #[schemars(range(min = 1, max = 4096))]
    pub max_tokens: i32,
}

impl Default for SmokeTestSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            prompt: default_prompt(),
            max_tokens: default_max_tokens(),
        }
    }
}

fn default_replicas() -> i32 {
    1
}
fn default_context_size() -> i32 {
    16384
}
fn default_context_length() -> i32 {
    4096
}
fn default_token_key() -> String {
    "token".into()
}
fn default_true() -> bool {
    true
}
fn default_prompt() -> String {
    "Say hello in one short sentence.".into()
}
fn default_max_tokens() -> i32 {
    32
}

impl ModelServeSpec {
    /// The revision to resolve, defaulted.
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or(DEFAULT_REVISION)
    }

    /// The quant to select when no file is named.
    pub fn quant(&self) -> &str {
        self.quant.as_deref().unwrap_or(DEFAULT_QUANT)
    }

    /// The smoke test settings, defaulted.
    pub fn smoke_test(&self) -> SmokeTestSpec {
        self.smoke_test.clone().unwrap_or_default()
    }
}

/// The CRD as YAML, exactly as committed under crds/.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    let crd = ModelServe::crd();
    Ok(format!(
        "# Generated by `modelserve crd` from src/api/; do not edit by hand.\n{}",
        serde_yaml::to_string(&crd)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_defaults_fill_what_the_user_left_out() {
        let spec: ModelServeSpec =
            serde_json::from_value(serde_json::json!({"repo": "a/b"})).unwrap();
        assert_eq!(spec.replicas, 1);
        assert_eq!(spec.context_size, 16384);
        assert_eq!(spec.context_length, 4096);
        assert_eq!(spec.quant(), "Q4_K_M");
        assert_eq!(spec.revision(), "main");
        assert_eq!(spec.smoke_test().max_tokens, 32);
    }

    #[test]
    fn every_schema_property_has_a_description() {
        let crd = serde_json::to_value(ModelServe::crd()).unwrap();
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let mut missing = Vec::new();
        walk(schema, "", &mut missing);
        // Kubernetes' own types (tolerations, resources, conditions) carry their own docs.
        assert!(
            missing.is_empty(),
            "properties without a description: {missing:?}"
        );
    }

    fn walk(schema: &serde_json::Value, path: &str, missing: &mut Vec<String>) {
        if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
            for (name, sub) in props {
                let p = format!("{path}.{name}");
                if sub.get("description").is_none()
                    && !["apiVersion", "kind", "metadata"].contains(&name.as_str())
                {
                    missing.push(p.clone());
                }
                walk(sub, &p, missing);
            }
        }
        if let Some(items) = schema.get("items") {
            walk(items, &format!("{path}[]"), missing);
        }
    }

    #[test]
    fn conditions_are_a_list_map_keyed_by_type() {
        let crd = serde_json::to_value(ModelServe::crd()).unwrap();
        let conds = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"]["conditions"];
        assert_eq!(conds["x-kubernetes-list-type"], "map");
        assert_eq!(
            conds["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"])
        );
    }
}
