//! Every name and label the stages, the controller and the CLI share: the served-name rule, the
//! names of the objects a ModelServe owns, their labels, the server's port and paths, and the
//! field manager of the operator's writes. One place, so a rename cannot miss a reader.

use std::collections::BTreeMap;

use kube::ResourceExt;

use crate::api::{ModelServe, ModelServeSpec};

/// The one field manager of every write the operator makes (status, serving objects).
pub const FIELD_MANAGER: &str = "modelserve-controller";
/// The llama.cpp server's port in the pod and on the Service.
pub const PORT: i32 = 8080;
/// The name of the server's container port (and the Service's target port).
pub const PORT_NAME: &str = "http";
/// Where the init container puts the files and the server reads them.
pub const MODELS_DIR: &str = "/models";
/// Where the engine key is mounted.
pub const KEY_DIR: &str = "/etc/modelserve/engine-key";
/// Where the init container's projected token for the mirror is mounted, and its file.
pub const MIRROR_TOKEN_DIR: &str = "/var/run/secrets/modelserve/mirror";
pub const MIRROR_TOKEN_FILE: &str = "token";
pub const MIRROR_TOKEN_VOLUME: &str = "mirror-token";
/// The data key of the engine-key Secret.
pub const KEY_FIELD: &str = "key";
/// The label every object and pod of one ModelServe carries: the ModelServe's name.
pub const MODEL_LABEL: &str = "modelserve.dev/model";
/// The label that marks every object the operator manages; watches select on it.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "modelserve");
/// The pod template annotation holding a digest of the engine key: a new key rolls the
/// replicas, because llama-server reads its key file only at start.
pub const KEY_DIGEST_ANNOTATION: &str = "modelserve.dev/engine-key-digest";
/// Pod template annotations naming what a replica serves.
pub const COMMIT_ANNOTATION: &str = "modelserve.dev/commit";
pub const SET_ANNOTATION: &str = "modelserve.dev/set";
/// The name of the init container that copies the model from the mirror.
pub const PULL_CONTAINER: &str = "pull";
/// The name of the server container.
pub const SERVER_CONTAINER: &str = "llama-server";

/// The label selector of everything the operator manages, for watches.
pub fn managed_selector() -> String {
    format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)
}

/// The engine-key Secret of a ModelServe.
pub fn secret_name(ms: &ModelServe) -> String {
    format!("{}-engine-key", ms.name_any())
}

/// The pods' labels; the Deployment and the Service select on them, and every owned object
/// carries them.
pub fn pod_labels(ms: &ModelServe) -> BTreeMap<String, String> {
    let name = ms.name_any();
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "llama-server".into()),
        ("app.kubernetes.io/instance".into(), name.clone()),
        ("app.kubernetes.io/component".into(), "model-server".into()),
        (MANAGED_BY.0.into(), MANAGED_BY.1.into()),
        (MODEL_LABEL.into(), name),
    ])
}

/// The label selector of the pods, as the scale subresource wants it.
pub fn selector(ms: &ModelServe) -> String {
    format!("{MODEL_LABEL}={}", ms.name_any())
}

/// The in-cluster URL of the model's Service.
pub fn endpoint(name: &str, namespace: &str) -> String {
    format!("http://{name}.{namespace}.svc:{PORT}/v1")
}

/// The served name of a ModelServe: `spec.servedName`, else the repository's suggestion.
pub fn served_name_of(spec: &ModelServeSpec) -> String {
    spec.served_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| served_name(&spec.repo))
}

/// Every name the model answers to: the served name, then the aliases, without repeats.
pub fn model_names(ms: &ModelServe) -> Vec<String> {
    let mut names = vec![served_name_of(&ms.spec)];
    for a in &ms.spec.aliases {
        if !a.is_empty() && !names.contains(a) {
            names.push(a.clone());
        }
    }
    names
}

/// Suggests the served name of a repository: the name part, without a GGUF suffix, lowercased,
/// restricted to `[a-z0-9._-]`, at most 63 characters.
/// `bartowski/Qwen2.5-7B-Instruct-GGUF` becomes `qwen2.5-7b-instruct`.
pub fn served_name(repo: &str) -> String {
    let name = repo.rsplit('/').next().unwrap_or(repo);
    let lower = name.to_ascii_lowercase();
    let base = ["-gguf", "_gguf", ".gguf"]
        .iter()
        .find_map(|s| lower.strip_suffix(s))
        .unwrap_or(&lower);
    let mut out = String::with_capacity(base.len());
    for c in base.chars() {
        let c = if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            c
        } else {
            '-'
        };
        if c == '-' && out.ends_with('-') {
            continue;
        }
        out.push(c);
    }
    out.truncate(63);
    let trimmed = out.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed.is_empty() {
        "model".to_string()
    } else {
        trimmed.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::served_name;

    #[test]
    fn strips_the_owner_and_the_gguf_suffix_and_lowercases() {
        assert_eq!(
            served_name("bartowski/Qwen2.5-7B-Instruct-GGUF"),
            "qwen2.5-7b-instruct"
        );
        assert_eq!(served_name("unsloth/Qwen3-0.6B-GGUF"), "qwen3-0.6b");
        assert_eq!(served_name("ggml-org/gemma-3-1b-it-GGUF"), "gemma-3-1b-it");
        assert_eq!(
            served_name("second-state/All-MiniLM-L6-v2-Embedding-GGUF"),
            "all-minilm-l6-v2-embedding"
        );
    }

    #[test]
    fn a_name_without_suffix_is_kept() {
        assert_eq!(served_name("ggml-org/models"), "models");
    }

    #[test]
    fn odd_characters_and_lengths_still_give_a_valid_name() {
        assert_eq!(served_name("a/__GGUF"), "model");
        let long = format!("a/{}", "x".repeat(200));
        assert_eq!(served_name(&long).len(), 63);
        assert_eq!(served_name("a/Foo+Bar  Baz-GGUF"), "foo-bar-baz");
    }
}
