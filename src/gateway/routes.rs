//! Which ModelServe a request's `model` names, and which of its replicas may answer. Both are
//! indexes rebuilt when the watched objects change, so a request costs a hash lookup.
//!
//! A name is a served name or an alias. The same name in two namespaces is told apart by
//! asking for `NAMESPACE/NAME`; a key limited to one namespace sees only that one.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use axum::http::StatusCode;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::keys::Scope;
use super::openai::ApiError;
use crate::api::ModelServe;
use crate::names::{MODEL_LABEL, PORT, model_names, secret_name};

/// The most names a 404 lists.
const LISTED: usize = 100;

/// A ModelServe as the gateway routes to it.
#[derive(Clone, Debug)]
pub struct Model {
    pub namespace: String,
    pub name: String,
    /// Every name it answers to, the served name first.
    pub names: Vec<String>,
    pub object: Arc<ModelServe>,
    /// `namespace/name`, made once.
    key: String,
    /// `namespace/name` of its engine-key Secret, made once.
    engine_key: String,
}

impl Model {
    /// `namespace/name`, the key of the model's state in the gateway.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// `namespace/name` of the Secret that holds the model's engine key.
    pub fn engine_key_secret(&self) -> &str {
        &self.engine_key
    }

    pub fn served(&self) -> &str {
        self.names
            .first()
            .map_or(self.name.as_str(), String::as_str)
    }
}

/// Every model by each name it answers to.
#[derive(Default)]
pub struct ModelIndex {
    by_name: HashMap<String, Vec<Arc<Model>>>,
    by_key: HashMap<String, Arc<Model>>,
    all: Vec<Arc<Model>>,
}

impl ModelIndex {
    pub fn build<'a>(models: impl IntoIterator<Item = &'a Arc<ModelServe>>) -> ModelIndex {
        let mut idx = ModelIndex::default();
        for ms in models {
            if ms.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let (namespace, name) = (ms.namespace().unwrap_or_default(), ms.name_any());
            let m = Arc::new(Model {
                key: format!("{namespace}/{name}"),
                engine_key: format!("{namespace}/{}", secret_name(ms)),
                namespace,
                name,
                names: model_names(ms),
                object: ms.clone(),
            });
            for n in &m.names {
                idx.by_name.entry(n.clone()).or_default().push(m.clone());
            }
            idx.by_key.insert(m.key.clone(), m.clone());
            idx.all.push(m);
        }
        idx
    }

    /// The model with key `namespace/name`.
    pub fn get(&self, key: &str) -> Option<&Model> {
        self.by_key.get(key).map(|m| &**m)
    }

    /// Every model.
    pub fn all(&self) -> &[Arc<Model>] {
        &self.all
    }

    /// Every model `scope` may use.
    pub fn visible<'a>(&'a self, scope: &'a Scope) -> impl Iterator<Item = &'a Model> {
        self.all
            .iter()
            .map(|m| &**m)
            .filter(|m| scope.allows(&m.namespace, &m.names))
    }

    /// The model `requested` names for `scope`, or the answer that says why there is none.
    pub fn find(&self, requested: &str, scope: &Scope) -> Result<Arc<Model>, ApiError> {
        let (namespace, name) = match requested.split_once('/') {
            Some((ns, n)) => (Some(ns), n),
            None => (None, requested),
        };
        let candidates: Vec<&Arc<Model>> = self
            .by_name
            .get(name)
            .into_iter()
            .flatten()
            .filter(|m| namespace.is_none_or(|ns| m.namespace == ns))
            .collect();
        let allowed: Vec<&Arc<Model>> = candidates
            .iter()
            .copied()
            .filter(|m| scope.allows(&m.namespace, &m.names))
            .collect();
        match allowed.as_slice() {
            [one] => Ok((*one).clone()),
            [] if !candidates.is_empty() => {
                let places: BTreeSet<&str> =
                    candidates.iter().map(|m| m.namespace.as_str()).collect();
                Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "model_not_permitted",
                    format!(
                        "the key {:?} may use {}; {requested} is served in namespace {}",
                        scope.name,
                        scope.describe(),
                        places.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                ))
            }
            [] => {
                let mut known: Vec<String> = self
                    .visible(scope)
                    .map(|m| m.served().to_string())
                    .collect();
                known.sort();
                known.dedup();
                let more = known.len().saturating_sub(LISTED);
                known.truncate(LISTED);
                let list = if known.is_empty() {
                    "none".to_string()
                } else if more > 0 {
                    format!("{} and {more} more", known.join(", "))
                } else {
                    known.join(", ")
                };
                Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "model_not_found",
                    format!("no model is named {requested:?}; the models this key can use: {list}"),
                ))
            }
            many => {
                let mut q: Vec<String> = many
                    .iter()
                    .map(|m| format!("{}/{name}", m.namespace))
                    .collect();
                q.sort();
                Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "model_ambiguous",
                    format!(
                        "{requested:?} is served in several namespaces; ask for one of {}",
                        q.join(", ")
                    ),
                ))
            }
        }
    }
}

/// A ready replica: its pod and where it listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    /// `namespace/pod`, the key of its in-flight counter.
    pub pod: String,
    /// `IP:PORT`.
    pub addr: String,
}

/// Every model's ready replicas, by `namespace/model`. Read from the pods (IP and Ready
/// condition), not from Endpoints: that works in every cluster, the test bed's loopback pod IPs
/// included, which the API server refuses in Endpoints.
#[derive(Default)]
pub struct ReplicaIndex {
    by_model: HashMap<String, Vec<Replica>>,
}

impl ReplicaIndex {
    pub fn build<'a>(pods: impl IntoIterator<Item = &'a Arc<Pod>>) -> ReplicaIndex {
        let mut idx = ReplicaIndex::default();
        for p in pods {
            let (Some(model), Some(ip)) = (p.labels().get(MODEL_LABEL), ready_ip(p)) else {
                continue;
            };
            let ns = p.namespace().unwrap_or_default();
            let addr = if ip.contains(':') {
                format!("[{ip}]:{PORT}")
            } else {
                format!("{ip}:{PORT}")
            };
            idx.by_model
                .entry(format!("{ns}/{model}"))
                .or_default()
                .push(Replica {
                    pod: format!("{ns}/{}", p.name_any()),
                    addr,
                });
        }
        for r in idx.by_model.values_mut() {
            r.sort_by(|a, b| a.pod.cmp(&b.pod));
        }
        idx
    }

    /// The ready replicas of the model with key `namespace/name`.
    pub fn of(&self, model_key: &str) -> &[Replica] {
        self.by_model.get(model_key).map_or(&[], Vec::as_slice)
    }
}

/// The pod's IP when it is Ready and not going away.
fn ready_ip(p: &Pod) -> Option<&str> {
    if p.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let s = p.status.as_ref()?;
    let ready = s
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let ip = s.pod_ip.as_deref().filter(|ip| !ip.is_empty())?;
    ready.then_some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(ns: &str, name: &str, served: &str, aliases: &[&str]) -> Arc<ModelServe> {
        let mut ms = ModelServe::new(
            name,
            serde_json::from_value(serde_json::json!({
                "repo": "o/r", "servedName": served, "aliases": aliases,
            }))
            .unwrap(),
        );
        ms.metadata.namespace = Some(ns.into());
        Arc::new(ms)
    }

    fn scope(namespaces: Option<&[&str]>) -> Scope {
        Scope {
            name: "k".into(),
            namespaces: namespaces.map(|n| n.iter().map(|s| s.to_string()).collect()),
            models: None,
        }
    }

    #[test]
    fn a_model_is_found_by_its_served_name_or_an_alias() {
        let idx = ModelIndex::build(&[model("a", "tiny", "tiny-llama", &["tl"])]);
        for n in ["tiny-llama", "tl", "a/tl"] {
            let m = idx.find(n, &Scope::everything()).unwrap();
            assert_eq!(m.key(), "a/tiny", "{n}");
        }
    }

    #[test]
    fn an_unknown_model_is_a_404_listing_the_names_the_key_can_use() {
        let idx =
            ModelIndex::build(&[model("a", "one", "one", &[]), model("b", "two", "two", &[])]);
        let e = idx.find("three", &scope(Some(&["a"]))).unwrap_err();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert!(
            e.message.contains("the models this key can use: one"),
            "{e:?}"
        );
        assert!(
            !e.message.contains("two"),
            "another namespace's names stay hidden"
        );
    }

    #[test]
    fn a_model_of_another_namespace_is_a_403_naming_the_keys_limits() {
        let idx = ModelIndex::build(&[model("b", "two", "two", &[])]);
        let e = idx.find("two", &scope(Some(&["a"]))).unwrap_err();
        assert_eq!(e.status, StatusCode::FORBIDDEN);
        assert!(e.message.contains("models in namespaces a"), "{e:?}");
        assert!(e.message.contains("namespace b"), "{e:?}");
    }

    #[test]
    fn one_name_in_two_namespaces_asks_for_the_namespace() {
        let idx = ModelIndex::build(&[model("a", "m", "same", &[]), model("b", "m", "same", &[])]);
        let e = idx.find("same", &Scope::everything()).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("a/same, b/same"), "{e:?}");
        assert_eq!(
            idx.find("b/same", &Scope::everything()).unwrap().key(),
            "b/m"
        );
        assert_eq!(idx.find("same", &scope(Some(&["a"]))).unwrap().key(), "a/m");
    }

    fn pod(name: &str, model: &str, ip: &str, ready: bool) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "a", "labels": {MODEL_LABEL: model}},
                "status": {"podIP": ip, "conditions": [
                    {"type": "Ready", "status": if ready {"True"} else {"False"}}]},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn only_ready_pods_with_an_ip_are_replicas() {
        let idx = ReplicaIndex::build(&[
            pod("p2", "tiny", "127.1.0.3", true),
            pod("p1", "tiny", "127.1.0.2", true),
            pod("p3", "tiny", "127.1.0.4", false),
            pod("p4", "tiny", "", true),
            pod("q1", "other", "127.1.0.5", true),
        ]);
        let r = idx.of("a/tiny");
        assert_eq!(
            r.iter().map(|r| r.addr.as_str()).collect::<Vec<_>>(),
            ["127.1.0.2:8080", "127.1.0.3:8080"]
        );
        assert!(idx.of("a/none").is_empty());
    }
}
