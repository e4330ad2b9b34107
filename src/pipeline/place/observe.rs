//! What the Place stage looks at: the Deployment, its ReplicaSets and their pods, and which of
//! them run the spec asked for now.

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::core::PartialObjectMetaExt;

use crate::pipeline::cache::Cache;
pub use crate::pipeline::cache::CachedReplicaSet;

/// What the stage reads from the cluster for one ModelServe.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// The Deployment named after the ModelServe.
    pub deployment: Option<Deployment>,
    /// ReplicaSets carrying the model label.
    pub replica_sets: Vec<CachedReplicaSet>,
    /// Pods carrying the model label.
    pub pods: Vec<Pod>,
}

/// Reads the Deployment `name` and the ReplicaSets and pods labelled for the model `name`,
/// from the cache: no request to the API server.
pub fn observe(cache: &Cache, namespace: &str, name: &str) -> Observed {
    Observed {
        deployment: cache.deployment(namespace, name).map(|d| (*d).clone()),
        replica_sets: owned(cache.replica_sets_of(namespace, name)),
        pods: owned(cache.pods_of(namespace, name)),
    }
}

fn owned<K: Clone>(v: Vec<std::sync::Arc<K>>) -> Vec<K> {
    v.into_iter().map(|o| (*o).clone()).collect()
}

/// The pods that count and the time the clock of the timeout starts: the pods of the
/// Deployment's newest ReplicaSet (an older one's pods are on their way out during a rollout and
/// do not run the spec asked for), and the latest creation of that ReplicaSet or its pods.
pub fn current_pods(observed: &Observed) -> (Vec<Pod>, Option<Timestamp>) {
    let Some(deployment) = &observed.deployment else {
        return (Vec::new(), None);
    };
    let newest = observed
        .replica_sets
        .iter()
        .filter(|rs| controlled_by(&rs.metadata, deployment.metadata.uid.as_deref()))
        .max_by_key(|rs| (revision(rs), created(&rs.metadata), rs.name_any()));
    let Some(rs) = newest else {
        return (Vec::new(), created(&deployment.metadata));
    };
    let pods: Vec<Pod> = observed
        .pods
        .iter()
        .filter(|p| controlled_by(&p.metadata, rs.metadata.uid.as_deref()))
        .cloned()
        .collect();
    let since = pods
        .iter()
        .filter_map(|p| created(&p.metadata))
        .chain(created(&rs.metadata))
        .max();
    (pods, since)
}

/// Whether the newest ReplicaSet of the Deployment already runs the Deployment's pod template
/// (a scale changes the generation but not the template, and its pods stay the current ones).
pub fn template_current(observed: &Observed) -> bool {
    let Some(deployment) = &observed.deployment else {
        return false;
    };
    let Some(want) = deployment.spec.as_ref().map(|s| s.template.clone()) else {
        return false;
    };
    let newest = observed
        .replica_sets
        .iter()
        .filter(|rs| controlled_by(&rs.metadata, deployment.metadata.uid.as_deref()))
        .max_by_key(|rs| (revision(rs), created(&rs.metadata), rs.name_any()));
    let have = newest.and_then(|rs| rs.annotations().get(TEMPLATE_DIGEST).cloned());
    have.is_some() && have == template_digest(want)
}

/// Where the cache keeps a ReplicaSet's pod template as its digest (the template itself, as
/// large as the Deployment's, is dropped from the cache).
pub const TEMPLATE_DIGEST: &str = "modelserve.dev/cached-template-digest";

/// A digest of a pod template as the Deployment asks for it: without the template hash label
/// the Deployment controller adds to its ReplicaSets' copies.
pub fn template_digest(mut t: k8s_openapi::api::core::v1::PodTemplateSpec) -> Option<String> {
    if let Some(labels) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        labels.remove("pod-template-hash");
    }
    // serde_json's maps are ordered by key, so equal templates give equal text.
    let text = serde_json::to_value(&t).ok()?.to_string();
    Some(crate::units::digest(text.as_bytes()))
}

/// Keeps of a ReplicaSet what Place reads: its name, owner, creation time, revision, model label,
/// and its pod template as a digest (the template is as large as the Deployment's).
pub fn slim_replica_set(rs: ReplicaSet) -> CachedReplicaSet {
    let digest = rs.spec.and_then(|s| s.template).and_then(template_digest);
    let mut meta = rs.metadata;
    meta.managed_fields = None;
    if let Some(labels) = meta.labels.as_mut() {
        labels.retain(|k, _| k == crate::names::MODEL_LABEL);
    }
    let annotations = meta.annotations.get_or_insert_default();
    annotations.retain(|k, _| k == REVISION);
    if let Some(d) = digest {
        annotations.insert(TEMPLATE_DIGEST.into(), d);
    }
    meta.into_response_partial()
}

const REVISION: &str = "deployment.kubernetes.io/revision";

fn controlled_by(meta: &ObjectMeta, owner_uid: Option<&str>) -> bool {
    owner_uid.is_some_and(|uid| {
        meta.owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && o.uid == uid)
    })
}

fn revision(rs: &CachedReplicaSet) -> i64 {
    rs.annotations()
        .get(REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

pub fn created(meta: &ObjectMeta) -> Option<Timestamp> {
    meta.creation_timestamp.as_ref().map(|t| t.0)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{POLL, decide};
    use super::*;
    use crate::pipeline::{Outcome, Progress};
    use serde_json::json;

    #[test]
    fn pods_of_an_older_replica_set_are_ignored_while_a_newer_one_exists() {
        let mut old = fixture(READY);
        old.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-rs1".into();
        let new = pod("m-new", "rs10", None, json!({"phase": "Pending"}));
        let observed = Observed {
            deployment: Some(deployment()),
            // Revision 10 is newer than 9: compared as numbers, not as text.
            replica_sets: vec![replica_set("rs1", "9"), replica_set("rs10", "10")],
            pods: vec![old, new],
        };
        let (pods, since) = current_pods(&observed);
        assert_eq!(
            pods.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
            ["m-new"]
        );
        assert_eq!(since, Some(ts("2026-11-29T20:00:00Z")));
        let d = decide(
            "m",
            "ns",
            &observed,
            ts("2026-11-29T20:00:05Z"),
            &LIMITS,
            None,
            None,
        );
        assert_eq!(
            d.outcome,
            Outcome::Waiting {
                reason: Progress::Placing,
                message: "m-new is Pending: waiting for the scheduler".into(),
                after: POLL
            }
        );
        assert_eq!(
            (d.replicas, d.ready_replicas),
            (2, 1),
            "from the Deployment"
        );
        assert_eq!(d.placement, None);
    }

    #[test]
    fn a_replica_set_of_another_owner_does_not_count() {
        let mut foreign = replica_set("rs9", "99");
        foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-other".into();
        let observed = Observed {
            deployment: Some(deployment()),
            replica_sets: vec![replica_set("rs1", "1"), foreign],
            pods: vec![
                pod("m-a", "rs1", None, json!({})),
                pod("m-b", "rs9", None, json!({})),
            ],
        };
        let (pods, _) = current_pods(&observed);
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].name_any(), "m-a");
    }

    #[test]
    fn a_slimmed_replica_set_still_tells_whether_it_runs_the_current_template() {
        let template = json!({"metadata": {"labels": {"modelserve.dev/model": "m"}},
            "spec": {"containers": [{"name": "llama-server", "image": "i"}]}});
        let mut d = deployment();
        d.spec.as_mut().unwrap().template = serde_json::from_value(template.clone()).unwrap();
        let mut rs = full_replica_set("rs1", "3");
        let mut with_hash = template.clone();
        with_hash["metadata"]["labels"]["pod-template-hash"] = json!("abc");
        rs.spec =
            Some(serde_json::from_value(json!({"selector": {}, "template": with_hash})).unwrap());
        rs.metadata.labels = Some(
            [
                ("modelserve.dev/model".to_string(), "m".to_string()),
                ("pod-template-hash".to_string(), "abc".to_string()),
            ]
            .into(),
        );
        let rs = slim_replica_set(rs);
        assert_eq!(rs.labels().len(), 1, "only the model label stays");
        assert_eq!(revision(&rs), 3);
        let mut slim = Observed {
            deployment: Some(d.clone()),
            replica_sets: vec![rs],
            pods: vec![],
        };
        assert!(template_current(&slim));
        // A new template in the Deployment: the old ReplicaSet no longer runs it.
        slim.deployment
            .as_mut()
            .unwrap()
            .spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .image = Some("j".into());
        assert!(!template_current(&slim));
    }
}
