//! Pods, ReplicaSets and a Deployment as the test bed's scheduler and kwok stages left them, for
//! the Place stage's tests.
#![allow(dead_code)]

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::Limits;
use super::observe::{CachedReplicaSet, slim_replica_set};
use super::verdict::{Verdict, verdict};

// Pods as the test bed's scheduler and kwok stages (testbed/kwok/pod-faults.yaml) left them.
pub const READY: &str = include_str!("../../../tests/fixtures/pods/ready.json");
pub const UNSCHEDULABLE: &str = include_str!("../../../tests/fixtures/pods/unschedulable.json");
pub const CRASHLOOP: &str = include_str!("../../../tests/fixtures/pods/crashloop.json");
pub const OOMKILLED: &str = include_str!("../../../tests/fixtures/pods/oomkilled.json");
pub const INIT_CRASHLOOP: &str = include_str!("../../../tests/fixtures/pods/init-crashloop.json");

pub const LIMITS: Limits = Limits {
    grace: Duration::from_secs(60),
    timeout: Duration::from_secs(1800),
    restarts: 3,
};

pub fn fixture(s: &str) -> Pod {
    serde_json::from_str(s).unwrap()
}

pub fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

pub fn plus(t: Timestamp, secs: i64) -> Timestamp {
    Timestamp::from_second(t.as_second() + secs).unwrap()
}

pub fn created_at(p: &Pod) -> Timestamp {
    p.metadata.creation_timestamp.as_ref().unwrap().0
}

/// Judges `pods` `secs` after the first one was created, with the default limits.
pub fn judge(pods: &[Pod], secs: i64) -> Verdict {
    let since = pods.iter().map(created_at).max();
    verdict(pods, since, plus(created_at(&pods[0]), secs), &LIMITS, None)
}

/// A pod of ReplicaSet `rs` built in code: `node` None means not scheduled yet.
pub fn pod(name: &str, rs: &str, node: Option<&str>, status: serde_json::Value) -> Pod {
    let mut spec = json!({
        "initContainers": [{"name": "pull", "image": "pull:1"}],
        "containers": [{
            "name": "llama-server", "image": "srv:1",
            "ports": [{"name": "http", "containerPort": 8080}],
            "resources": {"limits": {"memory": "8Gi"}, "requests": {"memory": "8Gi"}}
        }]
    });
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    serde_json::from_value(json!({
        "metadata": {
            "name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "creationTimestamp": "2026-11-29T20:00:00Z",
            "labels": {"modelserve.dev/model": "m"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                                 "uid": format!("uid-{rs}"), "controller": true}]
        },
        "spec": spec,
        "status": status
    }))
    .unwrap()
}

pub fn main_status(state: serde_json::Value, restarts: i32) -> serde_json::Value {
    json!({
        "phase": "Running", "podIP": "127.1.0.9",
        "conditions": [{"type": "Ready", "status": "False"}],
        "initContainerStatuses": [{"name": "pull", "image": "pull:1", "imageID": "", "ready": true,
            "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}],
        "containerStatuses": [{"name": "llama-server", "image": "srv:1", "imageID": "", "ready": false,
            "restartCount": restarts, "state": state}]
    })
}

pub fn message(v: &Verdict) -> &str {
    match v {
        Verdict::Ready { .. } => panic!("expected a message, got {v:?}"),
        Verdict::Progress(m)
        | Verdict::Unschedulable(m)
        | Verdict::CrashLoop(m)
        | Verdict::OomKilled(m)
        | Verdict::ImagePull(m)
        | Verdict::Timeout(m) => m,
    }
}

/// A ReplicaSet of the Deployment `m` as the cache keeps it.
pub fn replica_set(name: &str, revision: &str) -> CachedReplicaSet {
    slim_replica_set(full_replica_set(name, revision))
}

pub fn full_replica_set(name: &str, revision: &str) -> ReplicaSet {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "creationTimestamp": "2026-11-29T19:00:00Z",
            "annotations": {"deployment.kubernetes.io/revision": revision},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "m",
                                 "uid": "uid-deploy", "controller": true}]}
    }))
    .unwrap()
}

pub fn deployment() -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": "m", "namespace": "ns", "uid": "uid-deploy",
            "creationTimestamp": "2026-11-29T18:00:00Z"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"modelserve.dev/model": "m"}},
                 "template": {}},
        "status": {"replicas": 2, "readyReplicas": 1}
    }))
    .unwrap()
}
