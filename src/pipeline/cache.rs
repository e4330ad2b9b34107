//! The objects the stages read, from the controller's watches: Deployments, ReplicaSets, pods,
//! Services and Secrets the operator manages, and the Nodes. A reconcile reads these in memory
//! and asks the API server nothing, so an idle model costs no request however often it is
//! looked at.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use kube::Resource;
use kube::core::{PartialObjectMeta, PartialObjectMetaExt};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::names::MODEL_LABEL;

/// Where a cached object keeps everything but its metadata (spec, status), as JSON text. The
/// structs of a Deployment take 2.4 KB before any content (its spec holds a whole pod spec
/// inline) and its pod template about 14 KB in memory against 3 KB of text; a Deployment or
/// Service is read only when its model reconciles.
pub const CACHED_BODY: &str = "modelserve.dev/cached-body";

/// A ReplicaSet as the cache keeps it: metadata only (see
/// `place::observe::slim_replica_set`). A `ReplicaSet` struct takes 2.3 KB before any of its
/// contents (its spec holds a whole pod template inline), its metadata 0.4 KB.
pub type CachedReplicaSet = PartialObjectMeta<ReplicaSet>;

/// An object as the cache keeps it: its metadata, with the rest of it as text in the
/// [`CACHED_BODY`] annotation.
pub type Compacted<K> = PartialObjectMeta<K>;

/// `o` as the cache keeps it (see [`Compacted`]).
pub fn compact<K: Resource + serde::Serialize>(mut o: K) -> Compacted<K> {
    let mut meta = std::mem::take(o.meta_mut());
    let mut body = serde_json::to_value(&o).unwrap_or_default();
    if let Some(fields) = body.as_object_mut() {
        for key in ["metadata", "apiVersion", "kind"] {
            fields.remove(key);
        }
    }
    meta.annotations
        .get_or_insert_default()
        .insert(CACHED_BODY.into(), body.to_string());
    meta.into_response_partial()
}

/// The object as the API server had it, from what [`compact`] kept; None when the text does not
/// read back as one (it always does: it was written from one).
pub fn inflate<K: serde::de::DeserializeOwned>(cached: &Compacted<K>) -> Option<K> {
    let mut meta = cached.metadata.clone();
    let text = meta
        .annotations
        .as_mut()
        .and_then(|a| a.remove(CACHED_BODY))
        .unwrap_or_else(|| "{}".into());
    if meta.annotations.as_ref().is_some_and(|a| a.is_empty()) {
        meta.annotations = None;
    }
    let mut body: serde_json::Value = serde_json::from_str(&text).ok()?;
    body.as_object_mut()?
        .insert("metadata".into(), serde_json::to_value(meta).ok()?);
    serde_json::from_value(body).ok()
}

/// Read-only views of the watched objects.
#[derive(Clone)]
pub struct Cache {
    pub deployments: Store<Compacted<Deployment>>,
    pub replica_sets: Store<CachedReplicaSet>,
    pub pods: Store<Pod>,
    pub services: Store<Compacted<Service>>,
    pub secrets: Store<Secret>,
    pub nodes: Store<Node>,
    /// True once every store has listed (see [`announce_synced`]).
    pub synced: tokio::sync::watch::Receiver<bool>,
}

impl Cache {
    /// The Deployment as the API server has it (see [`compact`]).
    pub fn deployment(&self, namespace: &str, name: &str) -> Option<Arc<Deployment>> {
        let cached = self
            .deployments
            .get(&ObjectRef::new(name).within(namespace))?;
        inflate(&cached).map(Arc::new)
    }

    /// The Service as the API server has it (see [`compact`]).
    pub fn service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        let cached = self.services.get(&ObjectRef::new(name).within(namespace))?;
        inflate(&cached).map(Arc::new)
    }

    pub fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>> {
        self.secrets.get(&ObjectRef::new(name).within(namespace))
    }

    /// The ReplicaSets of the model `model` in `namespace`.
    pub fn replica_sets_of(&self, namespace: &str, model: &str) -> Vec<Arc<CachedReplicaSet>> {
        of_model(&self.replica_sets, namespace, model)
    }

    /// The pods of the model `model` in `namespace`.
    pub fn pods_of(&self, namespace: &str, model: &str) -> Vec<Arc<Pod>> {
        of_model(&self.pods, namespace, model)
    }

    pub fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.state()
    }

    /// Whether every watch has listed once: before that, an absent object may only be unseen.
    pub fn synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until every watch has listed once.
    pub async fn wait_until_synced(&self) {
        let mut rx = self.synced.clone();
        // An Err means the sender is gone: the process is shutting down.
        let _ = rx.wait_for(|synced| *synced).await;
    }
}

/// Says once, to any number of waiters, when every store of `cache` has listed. Each store is
/// awaited by this one task only: a store's readiness is a oneshot that wakes one waiter.
pub async fn announce_synced(cache: Cache, tx: tokio::sync::watch::Sender<bool>) {
    let ready = futures::join!(
        cache.deployments.wait_until_ready(),
        cache.replica_sets.wait_until_ready(),
        cache.pods.wait_until_ready(),
        cache.services.wait_until_ready(),
        cache.secrets.wait_until_ready(),
        cache.nodes.wait_until_ready(),
    );
    // A writer dropped before listing means the watches are gone with the process.
    let all = [
        ready.0.is_ok(),
        ready.1.is_ok(),
        ready.2.is_ok(),
        ready.3.is_ok(),
        ready.4.is_ok(),
        ready.5.is_ok(),
    ];
    if all.iter().all(|ok| *ok) {
        let _ = tx.send(true);
    }
}

fn of_model<K>(store: &Store<K>, namespace: &str, model: &str) -> Vec<Arc<K>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let mut found: Vec<Arc<K>> = store
        .state()
        .into_iter()
        .filter(|o| {
            let meta = o.meta();
            meta.namespace.as_deref() == Some(namespace)
                && meta
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(MODEL_LABEL))
                    .is_some_and(|m| m == model)
        })
        .collect();
    // The store's order is a hash map's; the stages' decisions must not depend on it.
    found.sort_by(|a, b| a.meta().name.cmp(&b.meta().name));
    found
}

/// A cache filled from object lists, for tests of the stages' decisions.
#[cfg(test)]
pub mod fixture {
    use super::*;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;

    fn store<K>(objects: Vec<K>) -> Store<K>
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Default,
    {
        let mut w: Writer<K> = Writer::default();
        w.apply_watcher_event(&Event::Init);
        for o in objects {
            w.apply_watcher_event(&Event::InitApply(o));
        }
        w.apply_watcher_event(&Event::InitDone);
        w.as_reader()
    }

    /// A synced cache holding exactly these objects.
    #[derive(Default)]
    pub struct Objects {
        pub deployments: Vec<Deployment>,
        pub replica_sets: Vec<CachedReplicaSet>,
        pub pods: Vec<Pod>,
        pub services: Vec<Service>,
        pub secrets: Vec<Secret>,
        pub nodes: Vec<Node>,
    }

    impl Objects {
        pub fn cache(self) -> Cache {
            Cache {
                deployments: store(self.deployments.into_iter().map(compact).collect()),
                replica_sets: store(self.replica_sets),
                pods: store(self.pods),
                services: store(self.services.into_iter().map(compact).collect()),
                secrets: store(self.secrets),
                nodes: store(self.nodes),
                synced: tokio::sync::watch::channel(true).1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::Objects;
    use super::*;

    fn pod(ns: &str, name: &str, model: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some(ns.into());
        p.metadata.labels = Some([(MODEL_LABEL.to_string(), model.to_string())].into());
        p
    }

    #[test]
    fn a_models_pods_are_found_by_label_and_namespace_in_name_order() {
        let cache = Objects {
            pods: vec![
                pod("a", "m-2", "m"),
                pod("a", "m-1", "m"),
                pod("b", "m-3", "m"),
                pod("a", "other-1", "other"),
            ],
            ..Default::default()
        }
        .cache();
        let names: Vec<_> = cache
            .pods_of("a", "m")
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["m-1", "m-2"]);
        assert!(cache.synced());
    }

    #[test]
    fn a_compacted_deployment_keeps_only_metadata_and_comes_back_as_the_api_server_had_it() {
        let d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "m", "namespace": "a", "annotations": {"x": "1"}, "generation": 3},
            "spec": {"replicas": 2, "selector": {}, "template": {
                "metadata": {"labels": {"app": "m"}},
                "spec": {"containers": [{"name": "llama-server", "image": "i", "args": ["-m", "f"]}]}
            }},
            "status": {"replicas": 2, "readyReplicas": 1, "observedGeneration": 3}
        }))
        .unwrap();
        let compacted = compact(d.clone());
        assert_eq!(compacted.metadata.generation, Some(3));
        assert!(
            compacted
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(CACHED_BODY)
        );
        assert_eq!(inflate(&compacted), Some(d.clone()));
        let cache = Objects {
            deployments: vec![d.clone()],
            ..Default::default()
        }
        .cache();
        assert_eq!(*cache.deployment("a", "m").unwrap(), d);
    }

    #[test]
    fn a_compacted_service_comes_back_as_the_api_server_had_it() {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "m", "namespace": "a"},
            "spec": {"ports": [{"name": "http", "port": 8080}], "selector": {"app": "m"}}
        }))
        .unwrap();
        let cache = Objects {
            services: vec![svc.clone()],
            ..Default::default()
        }
        .cache();
        assert_eq!(*cache.service("a", "m").unwrap(), svc);
        assert_eq!(
            cache.services.state()[0].metadata.annotations,
            compact(svc).metadata.annotations,
            "the cache holds the compacted form"
        );
    }
}
