//! What the controller writes into `.status`: each stage its own part.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// What the controller observed and decided; every stage writes its own part.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ModelServeStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The stage now running, or the one that failed: Resolve, Check, Mirror, Catalog, Place, SmokeTest, or Ready when all are done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// Progress of the current stage for people, such as 41% while mirroring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// Ready replicas over wanted replicas, such as 1/1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// One condition per stage (Resolved, Checked, Mirrored, Cataloged, Placed, SmokeTested) plus Ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The file set the repository resolved to, pinned to a commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<ResolvedStatus>,
    /// What the Check stage found: architecture, engine build and memory needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<CheckStatus>,
    /// Progress of the copy into the cluster's mirror.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<MirrorStatus>,
    /// URL of the OpenAI-compatible endpoint inside the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Replicas of the serving Deployment (the scale subresource reads it).
    #[serde(default)]
    pub replicas: i32,
    /// Replicas ready to answer.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Label selector of the replicas' pods, for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The replica the Place stage found ready, which the smoke test calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementStatus>,
    /// The smoke test's reply and speed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smoke: Option<SmokeStatus>,
    /// Requests through the gateway, written by the gateway (never by the controller): when the model was last asked for, and when the gateway last loaded or unloaded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand: Option<DemandStatus>,
}

/// What the gateway records of a model's requests; its replicas share it, so they agree on when
/// an on-demand model has been idle long enough.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DemandStatus {
    /// When a request for the model last reached a gateway or was last seen in flight there (refreshed at least every quarter of idleAfter, at most once a second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_request_at: Option<Time>,
    /// When a gateway last scaled the model from 0 replicas for a request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activated_at: Option<Time>,
    /// When a gateway last scaled the model back to 0 replicas after idleAfter without a request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaled_to_zero_at: Option<Time>,
}

/// Where a ready replica runs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PlacementStatus {
    /// The ready pod.
    pub pod: String,
    /// The node it runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The pod's IP and the llama.cpp server's port, e.g. 10.1.2.3:8080.
    pub address: String,
    /// The pod's UID, so a replaced pod is smoke-tested again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// The resolved, pinned file set.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedStatus {
    /// What was resolved (repository, revision, and quant or file); a spec that asks for something else resolves again.
    pub request: String,
    /// The commit the revision resolved to; it changes only when the spec changes.
    pub commit: String,
    /// Name of the file set (a file path, or the shard set's name).
    pub set: String,
    /// The quantisation of the set, as written in the file names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant: Option<String>,
    /// Every file of the set, with size and sha256 as the registry published them.
    #[serde(default)]
    pub files: Vec<ResolvedFile>,
    /// Sum of the files' sizes in bytes.
    pub total_bytes: i64,
    /// The catalog name clients use.
    pub served_name: String,
}

/// One file of a resolved set.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedFile {
    /// Path in the repository.
    pub path: String,
    /// Size in bytes.
    pub size: i64,
    /// Hex sha256 the registry published for the file.
    pub sha256: String,
}

/// The Check stage's findings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CheckStatus {
    /// What was checked (commit, set, context, slots, engine build); a different one checks again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// general.architecture from the GGUF header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// The llama.cpp build the nodes run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_build: Option<String>,
    /// The first llama.cpp build that loads this model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_build: Option<String>,
    /// Parallel slots the server gets (contextSize / contextLength).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<i32>,
    /// Memory a replica needs, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<i64>,
    /// The same as a Kubernetes quantity, as set on the replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// KV cache bytes per token of context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_bytes_per_token: Option<i64>,
    /// What the estimate counted, as a sentence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis: Option<String>,
    /// With a GPU accelerator: the layers offloaded (--n-gpu-layers, the output layer counting as one) and of how many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_layers: Option<i32>,
    /// With a GPU accelerator: the layers there are to offload (the blocks and the output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<i32>,
    /// With several GPUs: the share of layers of each (--tensor-split).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_split: Option<String>,
    /// The memory of one GPU the placement assumes; replicas go only to nodes whose GPUs have at least this much.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_bytes: Option<i64>,
    /// How many pods share each GPU (the device plugin's time-slicing or MPS, GFD's replicas label) on the nodes the placement holds on, each count once; 1 for GPUs not shared. gpuMemoryBytes is a GPU's memory divided by it, and replicas go only to nodes whose GPUs give each pod at least that.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_shared_by: Vec<i32>,
    /// GKE accelerators (cloud.google.com/gke-accelerator) of the nodes the placement holds on whose GPUs no GPU Feature Discovery label sizes: their memory is what modelserve knows of the model, and replicas go to nodes of these too where each pod's share of a GPU is at least gpuMemoryBytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gke_accelerators: Vec<String>,
    /// Instance types (node.kubernetes.io/instance-type) of the EC2 or Azure nodes the placement holds on whose GPUs no GPU Feature Discovery label sizes: their memory is what modelserve knows of the type (g5.2xlarge: A10G), and replicas go to nodes of these types too where each pod's share of a GPU is at least gpuMemoryBytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instance_types: Vec<String>,
    /// On the nodes the placement holds on whose AMD GPUs differ in size (one amd.com/gpu.vram.<size> label per size), the size of the smallest GPUs, such as 64G, each size once: replicas go to such nodes with one of these and no size too small for gpuMemoryBytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub amd_mixed_sizes: Vec<String>,
    /// With a GPU accelerator: what each GPU of a replica holds, by llama.cpp's placement rules. memoryBytes is then the host part alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceStatus>,
}

/// One GPU of a replica and what llama.cpp puts on it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStatus {
    /// The GPU's index in the replica (CUDA0, CUDA1, ...).
    pub index: i32,
    /// The GPU model, from the node's labels, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    /// The layers it holds, such as 0-15, and whether the output layer is among them.
    pub layers: String,
    /// Weights on the GPU, in bytes.
    pub weights_bytes: i64,
    /// KV cache and recurrent state of its layers, in bytes.
    pub kv_bytes: i64,
    /// Compute buffers on the GPU, in bytes.
    pub compute_bytes: i64,
    /// All of it.
    pub total_bytes: i64,
    /// The GPU's memory the placement was checked against, in bytes.
    pub memory_bytes: i64,
}

/// Mirror progress.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MirrorStatus {
    /// The file set this progress is for (a digest of the commit and every file's sha256);
    /// a Mirrored condition holds for this set only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// Bytes present and verified on the mirror.
    pub bytes_done: i64,
    /// Bytes of the whole set.
    pub bytes_total: i64,
    /// bytesDone over bytesTotal, 0 to 100.
    pub percent: i32,
    /// Download speed over all files, in bytes per second, while files arrive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<i64>,
    /// Seconds until the whole set is present at that speed, while files arrive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<i64>,
    /// Per-file state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<MirrorFileStatus>,
}

/// One file on the mirror.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MirrorFileStatus {
    /// Path in the repository.
    pub path: String,
    /// queued, downloading, verifying, present or failed.
    pub state: String,
    /// Bytes received so far.
    pub bytes_done: i64,
}

/// The smoke test's result.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SmokeStatus {
    /// The model's reply.
    pub reply: String,
    /// Generation speed in tokens per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_second: Option<f64>,
    /// Tokens the reply took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<i64>,
    /// When the smoke test ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Time>,
    /// The pod that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// That pod's UID: a replaced pod is tested again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// What was asked (a digest of the served name, prompt and maxTokens): a changed smokeTest
    /// is run again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// With a GPU accelerator: the layers the engine's log says it offloaded (0 when it found no usable GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_layers: Option<i32>,
}
