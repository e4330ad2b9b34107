//! The controller's watches. Each feeds a cache the stages read and, where a change should wake
//! a ModelServe, the controller: a new generation of the ModelServe itself, any change of the
//! Deployment, Service or Secret it owns (so a deletion or hand edit is repaired in seconds),
//! and any change of its ReplicaSets and pods (found by their model label). Nodes only feed the
//! cache. Owned objects are watched by the operator's own label, and every cached object drops
//! its managedFields, so the caches hold what the stages read and little else.

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::api::ModelServe;
use crate::names::{MODEL_LABEL, managed_selector};
use crate::pipeline::cache::{Cache, Compacted, compact};
use crate::pipeline::place::observe::{CachedReplicaSet, slim_replica_set};

type Events<K> = BoxStream<'static, Result<K, watcher::Error>>;

/// The caches, and the streams that fill them until the controller consumes them.
pub struct Watches {
    pub models: Store<ModelServe>,
    /// True once the ModelServes have been listed, so an empty cache is known to be empty.
    pub models_listed: tokio::sync::watch::Receiver<bool>,
    pub cache: Cache,
    model_events: Events<ModelServe>,
    deployments: Events<Compacted<Deployment>>,
    services: Events<Compacted<Service>>,
    secrets: Events<Secret>,
    pods: Events<Pod>,
    replica_sets: Events<CachedReplicaSet>,
}

impl Watches {
    /// Sets up every watch (in `namespace`, or everywhere) and starts the one on Nodes.
    pub fn start(client: &Client, namespace: Option<&str>) -> Watches {
        let managed = || watcher::Config::default().labels(&managed_selector());
        let (models, writer) = reflector::store();
        let (listed_tx, models_listed) = tokio::sync::watch::channel(false);
        let model_events = watcher(api::<ModelServe>(client, namespace), Default::default())
            .default_backoff()
            .modify(slim)
            .reflect(writer)
            .inspect_ok(move |e| {
                if matches!(e, watcher::Event::InitDone) {
                    listed_tx.send_replace(true);
                }
            })
            .applied_objects()
            // Only a new generation (a spec change, or a new object) wakes a ModelServe: its own
            // status writes do not, so progress is written at the pace the stages ask for.
            .predicate_filter(predicates::generation, Default::default())
            .boxed();
        // Deployments and Services are read only when their model reconciles: the cache keeps
        // their metadata, and the rest as text. A ReplicaSet's template is as large as its
        // Deployment's: the cache keeps its metadata with a digest of the template.
        let (deployments, deployment_events) =
            cached(client, namespace, managed(), compacted::<Deployment>);
        let (services, service_events) = cached(client, namespace, managed(), compacted::<Service>);
        let (secrets, secret_events) = cached(client, namespace, managed(), slimmed::<Secret>);
        let (pods, pod_events) = cached(client, namespace, managed(), slimmed::<Pod>);
        let (replica_sets, replica_set_events) =
            cached(client, namespace, managed(), slim_replica_set);

        let (nodes, node_writer) = reflector::store();
        let node_events = watcher(Api::<Node>::all(client.clone()), Default::default())
            .default_backoff()
            .modify(|n: &mut Node| {
                slim(n);
                // The image list of a busy node is large and nothing here reads it.
                if let Some(s) = n.status.as_mut() {
                    s.images = None;
                }
            })
            .reflect(node_writer)
            .applied_objects();
        tokio::spawn(node_events.for_each(|e| async move {
            if let Err(e) = e {
                tracing::warn!(error = %e, "watching Nodes failed; retrying");
            }
        }));

        let (synced_tx, synced) = tokio::sync::watch::channel(false);
        let cache = Cache {
            deployments,
            replica_sets,
            pods,
            services,
            secrets,
            nodes,
            synced,
        };
        tokio::spawn(crate::pipeline::cache::announce_synced(
            cache.clone(),
            synced_tx,
        ));
        Watches {
            models,
            models_listed,
            cache,
            model_events,
            deployments: deployment_events,
            services: service_events,
            secrets: secret_events,
            pods: pod_events,
            replica_sets: replica_set_events,
        }
    }

    /// The controller, woken by every watch but the Nodes'.
    pub fn controller(self) -> Controller<ModelServe> {
        Controller::for_stream(self.model_events, self.models)
            .owns_stream(self.deployments)
            .owns_stream(self.services)
            .owns_stream(self.secrets)
            .watches_stream(self.pods, model_of)
            .watches_stream(self.replica_sets, model_of)
    }
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// A cache of the operator's objects of one kind, each kept in the form `keep` makes of it, and
/// the stream of their changes (deletions included, so a deleted object is put back).
fn cached<K, T>(
    client: &Client,
    namespace: Option<&str>,
    config: watcher::Config,
    keep: fn(K) -> T,
) -> (Store<T>, Events<T>)
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
    T: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let events = watcher(api::<K>(client, namespace), config)
        .default_backoff()
        .map_ok(move |e| kept(e, keep))
        .reflect(writer)
        .touched_objects()
        .boxed();
    (store, events)
}

/// A watch event with its object turned into the form the cache keeps.
fn kept<A, B>(e: watcher::Event<A>, keep: impl Fn(A) -> B) -> watcher::Event<B> {
    use watcher::Event;
    match e {
        Event::Apply(o) => Event::Apply(keep(o)),
        Event::Delete(o) => Event::Delete(keep(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(keep(o)),
        Event::InitDone => Event::InitDone,
    }
}

/// An object without what no stage reads (see [`slim`]).
fn slimmed<K: Resource>(mut o: K) -> K {
    slim(&mut o);
    o
}

/// An object slimmed and compacted (see [`Compacted`]).
fn compacted<K: Resource + serde::Serialize>(o: K) -> Compacted<K> {
    compact(slimmed(o))
}

/// Drops what no stage reads from a cached object: managed fields, and the copy of the whole
/// object that a client-side `kubectl apply` keeps in an annotation.
fn slim<K: Resource>(o: &mut K) {
    let meta = o.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
        if a.is_empty() {
            meta.annotations = None;
        }
    }
}

/// The ModelServe a pod or ReplicaSet belongs to, by its model label.
fn model_of<K: Resource>(o: K) -> Option<ObjectRef<ModelServe>> {
    let model = o.labels().get(MODEL_LABEL)?;
    let ns = o.namespace()?;
    Some(ObjectRef::new(model).within(&ns))
}
