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
    pub fn deployment(&self, namespace: &str, name: &str) -> Option<Arc<Deployment>> {
        self.deployments
            .get(&ObjectRef::new(name).within(namespace))
    }

    pub fn service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        self.services.get(&ObjectRef::new(name).within(namespace))
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
}
