//! The gateway's view of the cluster: ModelServes, their pods, their engine keys and the
//! gateway's own API keys, each watched once and turned into an index whenever it changes. A
//! request reads the latest index without waiting or asking the API server.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::keys::{KEY_LABEL, KeyTable};
use super::routes::{ModelIndex, ReplicaIndex};
use crate::api::ModelServe;
use crate::names::{KEY_FIELD, managed_selector};

/// The latest of an index; readers take an `Arc` and never block a rebuild.
pub struct Latest<T>(RwLock<Arc<T>>);

impl<T: Default> Default for Latest<T> {
    fn default() -> Self {
        Latest(RwLock::new(Arc::new(T::default())))
    }
}

impl<T> Latest<T> {
    pub fn get(&self) -> Arc<T> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, v: T) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(v);
    }
}

/// Engine keys by `namespace/secret-name`.
pub type EngineKeys = HashMap<String, String>;

/// Every index, and whether each watch has listed once.
#[derive(Default)]
pub struct Views {
    pub models: Latest<ModelIndex>,
    pub replicas: Latest<ReplicaIndex>,
    pub engine_keys: Latest<EngineKeys>,
    pub keys: Latest<KeyTable>,
    synced: [AtomicBool; 4],
}

impl Views {
    /// True once every watch has listed.
    pub fn synced(&self) -> bool {
        self.synced.iter().all(|s| s.load(Ordering::Relaxed))
    }
}

/// An Api of `K` in `namespace`, or in every namespace.
fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Starts the four watches; `namespace` limits the models (and their pods and engine keys),
/// `keys_namespace` is where the gateway's API keys live.
pub fn start(client: &Client, namespace: Option<&str>, keys_namespace: &str) -> Arc<Views> {
    let views = Arc::new(Views::default());
    let managed = watcher::Config::default().labels(&managed_selector());
    let v = views.clone();
    spawn(
        "ModelServes",
        api::<ModelServe>(client, namespace),
        watcher::Config::default(),
        |ms: &mut ModelServe| {
            ms.managed_fields_mut().clear();
            ms.annotations_mut().clear();
        },
        move |store: &Store<ModelServe>| v.models.set(ModelIndex::build(&store.state())),
        (views.clone(), 0),
    );
    let v = views.clone();
    spawn(
        "pods",
        api::<Pod>(client, namespace),
        managed.clone(),
        |p: &mut Pod| {
            // Only the labels, the IP and the Ready condition are read.
            p.managed_fields_mut().clear();
            p.annotations_mut().clear();
            p.spec = None;
            if let Some(s) = p.status.as_mut() {
                s.container_statuses = None;
                s.init_container_statuses = None;
            }
        },
        move |store: &Store<Pod>| v.replicas.set(ReplicaIndex::build(&store.state())),
        (views.clone(), 1),
    );
    let v = views.clone();
    spawn(
        "engine keys",
        api::<Secret>(client, namespace),
        managed,
        |s: &mut Secret| s.managed_fields_mut().clear(),
        move |store: &Store<Secret>| v.engine_keys.set(engine_keys(&store.state())),
        (views.clone(), 2),
    );
    let v = views.clone();
    spawn(
        "gateway keys",
        Api::<Secret>::namespaced(client.clone(), keys_namespace),
        watcher::Config::default().labels(&format!("{KEY_LABEL}=true")),
        |s: &mut Secret| s.managed_fields_mut().clear(),
        move |store: &Store<Secret>| {
            let table = KeyTable::build(store.state().iter().map(|s| s.as_ref()));
            for (name, why) in &table.invalid {
                tracing::warn!(secret = %name, %why, "a gateway key Secret is not used");
            }
            for (name, first) in &table.shared {
                tracing::warn!(secret = %name, same_as = %first, "a gateway key is in more than one Secret: it may use only what all of them allow");
            }
            tracing::info!(keys = table.len(), "gateway keys read");
            v.keys.set(table)
        },
        (views.clone(), 3),
    );
    views
}

fn engine_keys(secrets: &[Arc<Secret>]) -> EngineKeys {
    secrets
        .iter()
        .filter_map(|s| {
            let key = s.data.as_ref()?.get(KEY_FIELD)?;
            let key = String::from_utf8(key.0.clone()).ok()?;
            Some((
                format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any()),
                key.trim().to_string(),
            ))
        })
        .collect()
}

/// Drives one reflector, calling `rebuild` once it has listed and after every change.
fn spawn<K>(
    what: &'static str,
    api: Api<K>,
    config: watcher::Config,
    trim: impl FnMut(&mut K) + Send + 'static,
    rebuild: impl Fn(&Store<K>) + Send + 'static,
    (views, slot): (Arc<Views>, usize),
) where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(trim)
        .reflect(writer);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut listed = false;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) => {
                    listed = true;
                    rebuild(&store);
                    if !views.synced[slot].swap(true, Ordering::Relaxed) {
                        tracing::info!(what, "listed");
                    }
                }
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) if listed => {
                    rebuild(&store)
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(what, error = %e, "watch failed; retrying"),
            }
        }
    });
}
