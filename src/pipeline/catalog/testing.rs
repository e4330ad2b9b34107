//! ModelServes, resolved and checked status and settings for the Catalog stage's tests.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PodSpec;

use super::Settings;
use crate::api::{CheckStatus, ModelServe, ModelServeSpec, ResolvedFile, ResolvedStatus};

pub fn model(spec: serde_json::Value) -> ModelServe {
    let spec: ModelServeSpec = serde_json::from_value(spec).unwrap();
    let mut ms = ModelServe::new("qwen", spec);
    ms.metadata.namespace = Some("models".into());
    ms.metadata.uid = Some("0000-uid".into());
    ms
}

pub fn resolved(files: &[(&str, i64)]) -> ResolvedStatus {
    ResolvedStatus {
        request: "r".into(),
        commit: "c".repeat(40),
        set: "qwen-q4_k_m".into(),
        quant: Some("Q4_K_M".into()),
        files: files
            .iter()
            .enumerate()
            .map(|(i, (p, s))| ResolvedFile {
                path: p.to_string(),
                size: *s,
                sha256: format!("{i}").repeat(64),
            })
            .collect(),
        total_bytes: files.iter().map(|f| f.1).sum(),
        served_name: "qwen".into(),
    }
}

pub fn checked(memory: i64, parallel: i32) -> CheckStatus {
    CheckStatus {
        memory_bytes: Some(memory),
        parallel: Some(parallel),
        ..Default::default()
    }
}

pub fn settings(build: u32) -> Settings {
    Settings {
        engine_image: format!("ghcr.io/ggml-org/llama.cpp:server-b{build}"),
        build,
        pull_image: "modelserve:test".into(),
        mirror_url: "http://mirror:8090".into(),
        mirror_audience: "modelserve-mirror".into(),
    }
}

pub fn pod(d: &Deployment) -> &PodSpec {
    d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

pub fn args_of(d: &Deployment) -> Vec<String> {
    pod(d).containers[0].args.clone().unwrap()
}

pub fn value_after(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}
