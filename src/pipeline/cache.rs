//! The objects the stages read, from the controller's watches: Deployments, ReplicaSets, pods,
//! Services and Secrets the operator manages, and the Nodes. A reconcile reads these in memory
//! and asks the API server nothing, so an idle model costs no request however often it is
//! looked at.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::names::MODEL_LABEL;

/// Where a cached Deployment keeps its pod template (and a cached Service its spec), as JSON
/// text: the template's structs take about 14 KB in memory against 3 KB of text, and it is read
/// only when its model reconciles.
pub const CACHED_TEMPLATE: &str = "modelserve.dev/cached-template";

/// Replaces a Deployment's pod template by its JSON text in an annotation (for the cache).
pub fn compact_deployment(d: &mut Deployment) {
    let Some(template) = d.spec.as_mut().map(|s| std::mem::take(&mut s.template)) else {
        return;
    };
    if let (Some(back), Some(spec)) = (stash(d, template), d.spec.as_mut()) {
        spec.template = back;
    }
}

/// Replaces a Service's spec by its JSON text in an annotation (for the cache): 0.7 KB less in
/// memory for each.
pub fn compact_service(s: &mut Service) {
    let Some(spec) = s.spec.take() else { return };
    s.spec = stash(s, spec);
}

/// Puts `part`'s JSON text in the object's [`CACHED_TEMPLATE`] annotation; gives the part back
/// when it cannot be written as text.
fn stash<K: Resource, P: serde::Serialize>(o: &mut K, part: P) -> Option<P> {
    match serde_json::to_string(&part) {
        Ok(text) => {
            o.meta_mut()
                .annotations
                .get_or_insert_default()
                .insert(CACHED_TEMPLATE.into(), text);
            None
        }
        Err(_) => Some(part),
    }
}

/// The Deployment with the pod template that [`compact_deployment`] put aside.
fn inflate_deployment(cached: Arc<Deployment>) -> Arc<Deployment> {
    inflate(cached, |d: &mut Deployment, template| {
        if let Some(spec) = d.spec.as_mut() {
            spec.template = template;
        }
    })
}

/// The object with the part a compacting put aside as text, put back by `restore`.
fn inflate<K, P>(cached: Arc<K>, restore: impl FnOnce(&mut K, P)) -> Arc<K>
where
    K: Resource + Clone,
    P: serde::de::DeserializeOwned,
{
    let Some(text) = cached
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(CACHED_TEMPLATE))
    else {
        return cached;
    };
    let Ok(part) = serde_json::from_str(text) else {
        return cached;
    };
    let mut o = (*cached).clone();
    let meta = o.meta_mut();
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(CACHED_TEMPLATE);
        if a.is_empty() {
            meta.annotations = None;
        }
    }
    restore(&mut o, part);
    Arc::new(o)
}

/// Read-only views of the watched objects.
#[derive(Clone)]
pub struct Cache {
    pub deployments: Store<Deployment>,
    pub replica_sets: Store<ReplicaSet>,
    pub pods: Store<Pod>,
    pub services: Store<Service>,
    pub secrets: Store<Secret>,
    pub nodes: Store<Node>,
    /// True once every store has listed (see [`announce_synced`]).
    pub synced: tokio::sync::watch::Receiver<bool>,
}

impl Cache {
    /// The Deployment as the API server has it (its pod template restored, see
    /// [`compact_deployment`]).
    pub fn deployment(&self, namespace: &str, name: &str) -> Option<Arc<Deployment>> {
        let cached = self
            .deployments
            .get(&ObjectRef::new(name).within(namespace))?;
        Some(inflate_deployment(cached))
    }

    /// The Service as the API server has it (its spec restored, see [`compact_service`]).
    pub fn service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        let cached = self.services.get(&ObjectRef::new(name).within(namespace))?;
        Some(inflate(cached, |s: &mut Service, spec| s.spec = Some(spec)))
    }

    pub fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>> {
        self.secrets.get(&ObjectRef::new(name).within(namespace))
    }

    /// The ReplicaSets of the model `model` in `namespace`.
    pub fn replica_sets_of(&self, namespace: &str, model: &str) -> Vec<Arc<ReplicaSet>> {
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
        pub replica_sets: Vec<ReplicaSet>,
        pub pods: Vec<Pod>,
        pub services: Vec<Service>,
        pub secrets: Vec<Secret>,
        pub nodes: Vec<Node>,
    }

    impl Objects {
        pub fn cache(self) -> Cache {
            Cache {
                deployments: store(self.deployments),
                replica_sets: store(self.replica_sets),
                pods: store(self.pods),
                services: store(self.services),
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
    fn a_compacted_deployment_comes_back_as_the_api_server_had_it() {
        let d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "m", "namespace": "a", "annotations": {"x": "1"}},
            "spec": {"replicas": 2, "selector": {}, "template": {
                "metadata": {"labels": {"app": "m"}},
                "spec": {"containers": [{"name": "llama-server", "image": "i", "args": ["-m", "f"]}]}
            }}
        }))
        .unwrap();
        let mut compacted = d.clone();
        compact_deployment(&mut compacted);
        assert_eq!(
            compacted.spec.as_ref().unwrap().template,
            Default::default()
        );
        let cache = Objects {
            deployments: vec![compacted],
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
        let mut compacted = svc.clone();
        compact_service(&mut compacted);
        assert!(compacted.spec.is_none());
        let cache = Objects {
            services: vec![compacted],
            ..Default::default()
        }
        .cache();
        assert_eq!(*cache.service("a", "m").unwrap(), svc);
    }
}
