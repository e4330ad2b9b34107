//! Applying the serving objects without asking the API server what it already has: the cache
//! shows the live object, and an apply is sent only when the live object no longer carries
//! every field the operator would apply (a hand edit, a deletion, a new spec).

use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::CatalogFailure;
use super::objects::owner;
use crate::api::ModelServe;
use crate::names::{FIELD_MANAGER, KEY_FIELD, pod_labels, secret_name};
use crate::pipeline::env::Env;

/// Whether `live` carries every field of `desired` with the same value: objects field by
/// field, lists element by element. What the API server adds (defaults, status, metadata of
/// its own) does not count; a field the operator sets and someone changed does.
pub fn covers(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (_, Value::Null) => true,
        (Value::Object(l), Value::Object(d)) => d
            .iter()
            .all(|(k, dv)| dv.is_null() || l.get(k).is_some_and(|lv| covers(lv, dv))),
        (Value::Array(l), Value::Array(d)) => {
            l.len() == d.len() && l.iter().zip(d).all(|(lv, dv)| covers(lv, dv))
        }
        (Value::Number(l), Value::Number(d)) => l.as_f64() == d.as_f64(),
        (l, d) => l == d,
    }
}

/// Refuses an object of that name that belongs to something else: never taken over.
pub fn ensure_ours(
    meta: Option<&ObjectMeta>,
    kind: &'static str,
    name: &str,
    uid: &str,
) -> Result<(), CatalogFailure> {
    let Some(meta) = meta else { return Ok(()) };
    if meta.owner_references.iter().flatten().any(|o| o.uid == uid) {
        Ok(())
    } else {
        Err(CatalogFailure::NameTaken {
            kind,
            name: name.to_string(),
        })
    }
}

/// Applies `desired` unless the cached `live` object already covers it; returns the object as
/// it now is (the cached one when nothing was sent).
pub async fn apply_if_drifted<K>(
    env: &Env,
    ms: &ModelServe,
    kind: &'static str,
    live: Option<Arc<K>>,
    desired: &K,
) -> Result<Arc<K>, CatalogFailure>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    let name = desired.name_any();
    let uid = ms.uid().unwrap_or_default();
    ensure_ours(live.as_ref().map(|l| l.meta()), kind, &name, &uid)?;
    let want = serde_json::to_value(desired)
        .map_err(|e| CatalogFailure::CatalogInvalid(format!("cannot serialise the {kind}: {e}")))?;
    if let Some(l) = &live
        && let Ok(have) = serde_json::to_value(l.as_ref())
        && covers(&have, &want)
    {
        return Ok(l.clone());
    }
    let ns = ms.namespace().unwrap_or_else(|| "default".into());
    let applied = Api::<K>::namespaced(env.client.clone(), &ns)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(desired),
        )
        .await
        .map_err(|source| CatalogFailure::ApiError {
            what: format!("applying the {kind} {name}"),
            source,
        })?;
    Ok(Arc::new(applied))
}

/// The engine-key Secret: the cached one when it is ours and holds a key, else a new one. It is
/// created, never applied over: a key that exists is never replaced under running replicas,
/// even when the cache has not seen it yet.
pub async fn engine_key(env: &Env, ms: &ModelServe) -> Result<Arc<Secret>, CatalogFailure> {
    let ns = ms.namespace().unwrap_or_else(|| "default".into());
    let name = secret_name(ms);
    let uid = ms.uid().unwrap_or_default();
    let cached = env.cache.secret(&ns, &name);
    ensure_ours(cached.as_ref().map(|s| s.meta()), "Secret", &name, &uid)?;
    if let Some(s) = cached.filter(|s| key_of(s).is_some()) {
        return Ok(s);
    }
    let api: Api<Secret> = Api::namespaced(env.client.clone(), &ns);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            labels: Some(pod_labels(ms)),
            owner_references: Some(vec![owner(ms).map_err(CatalogFailure::CatalogInvalid)?]),
            ..Default::default()
        },
        data: Some([(KEY_FIELD.to_string(), ByteString(new_key()?.into_bytes()))].into()),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    let api_error = |what: &str, source| CatalogFailure::ApiError {
        what: format!("{what} the engine-key Secret {name}"),
        source,
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(s) => Ok(Arc::new(s)),
        // It exists and the cache has not seen it yet: use it as it is.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let s = api.get(&name).await.map_err(|e| api_error("reading", e))?;
            ensure_ours(Some(s.meta()), "Secret", &name, &uid)?;
            if key_of(&s).is_some() {
                Ok(Arc::new(s))
            } else {
                // Ours, and someone emptied it: the key is made anew (the replicas roll).
                api.patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&secret),
                )
                .await
                .map(Arc::new)
                .map_err(|e| api_error("refilling", e))
            }
        }
        Err(e) => Err(api_error("creating", e)),
    }
}

/// The key held by an engine-key Secret.
pub fn key_of(s: &Secret) -> Option<&[u8]> {
    s.data
        .as_ref()?
        .get(KEY_FIELD)
        .map(|b| b.0.as_slice())
        .filter(|b| !b.is_empty())
}

/// A new random engine key: 32 bytes from the OS, hex.
fn new_key() -> Result<String, CatalogFailure> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| {
        CatalogFailure::EngineKeyFailed(format!("the OS gave no random bytes: {e}"))
    })?;
    Ok(hex::encode(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_the_api_server_adds_is_not_drift() {
        let desired = json!({"spec": {"replicas": 1, "template": {"spec": {"containers": [
            {"name": "s", "args": ["--a", "1"], "ports": [{"containerPort": 8080}]}]}}}});
        let live = json!({"spec": {"replicas": 1, "revisionHistoryLimit": 10, "template": {"spec": {
            "containers": [{"name": "s", "args": ["--a", "1"], "imagePullPolicy": "Always",
            "ports": [{"containerPort": 8080, "protocol": "TCP"}]}], "dnsPolicy": "ClusterFirst"}}},
            "status": {"readyReplicas": 1}});
        assert!(covers(&live, &desired));
    }

    #[test]
    fn a_hand_edit_of_an_owned_field_is_drift() {
        let desired = json!({"spec": {"replicas": 1, "args": ["--a", "1"]}});
        assert!(!covers(
            &json!({"spec": {"replicas": 3, "args": ["--a", "1"]}}),
            &desired
        ));
        assert!(!covers(
            &json!({"spec": {"replicas": 1, "args": ["--a"]}}),
            &desired
        ));
        assert!(!covers(&json!({"spec": {"replicas": 1}}), &desired));
        assert!(!covers(&json!({}), &desired));
    }

    #[test]
    fn keys_are_random_and_long() {
        let (a, b) = (new_key().unwrap(), new_key().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn someone_elses_object_is_never_taken_over() {
        let meta = ObjectMeta {
            owner_references: Some(vec![Default::default()]),
            ..Default::default()
        };
        assert!(ensure_ours(None, "Service", "m", "u").is_ok());
        let err = ensure_ours(Some(&meta), "Service", "m", "u").unwrap_err();
        assert!(
            err.to_string().contains("a Service named m already exists"),
            "{err}"
        );
    }
}
