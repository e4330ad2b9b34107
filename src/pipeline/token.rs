//! The registry token of a ModelServe: `spec.tokenSecretRef` in its namespace, else the
//! operator's default Secret, else none. Read only when a stage is about to ask the registry or
//! the mirror for something, never for a stage that is settled.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret as KubeSecret;
use kube::{Api, ResourceExt};

use super::env::Env;
use super::outcome::{Failure, Recovery};
use crate::api::ModelServe;
use crate::secret::Secret;

/// How often a missing token Secret is looked for again.
pub const RECHECK: Duration = Duration::from_secs(30);
/// The largest token accepted from a Secret.
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Why there is no token when one is asked for.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
pub enum TokenFailure {
    #[error(
        "the token Secret {namespace}/{name} does not exist; create it with the registry token under key {key}"
    )]
    TokenSecretMissing {
        namespace: String,
        name: String,
        key: String,
    },
    #[error(
        "the Secret {namespace}/{name} has no usable key {key} (missing, empty, not text, or over 16 KiB); put the registry token there"
    )]
    #[strum(serialize = "TokenSecretMissing")]
    TokenKeyMissing {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("cannot read the token Secret {namespace}/{name}: {source}")]
    KubernetesApiError {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

impl Failure for TokenFailure {
    fn reason(&self) -> &'static str {
        self.into()
    }

    fn recovery(&self) -> Recovery {
        match self {
            TokenFailure::KubernetesApiError { .. } => Recovery::TRANSIENT,
            // Creating the Secret fixes it without a spec change.
            _ => Recovery::Heals(RECHECK),
        }
    }
}

/// Where the token of `ms` comes from: (namespace, name, key), or None.
pub fn source(ms: &ModelServe, default: Option<&str>) -> Option<(String, String, String)> {
    match (&ms.spec.token_secret_ref, default) {
        (Some(r), _) => Some((
            ms.namespace().unwrap_or_default(),
            r.name.clone(),
            r.key.clone(),
        )),
        (None, Some(d)) => {
            let (ns, name) = d.split_once('/')?;
            Some((ns.to_string(), name.to_string(), "token".to_string()))
        }
        (None, None) => None,
    }
}

/// Reads the token of `ms`.
pub async fn token(env: &Env, ms: &ModelServe) -> Result<Option<Secret>, TokenFailure> {
    let Some((namespace, name, key)) = source(ms, env.settings.default_token_secret.as_deref())
    else {
        return Ok(None);
    };
    let secret = Api::<KubeSecret>::namespaced(env.client.clone(), &namespace)
        .get_opt(&name)
        .await;
    let secret = match secret {
        Ok(Some(s)) => s,
        Ok(None) => {
            return Err(TokenFailure::TokenSecretMissing {
                namespace,
                name,
                key,
            });
        }
        Err(source) => {
            return Err(TokenFailure::KubernetesApiError {
                namespace,
                name,
                source,
            });
        }
    };
    match secret
        .data
        .as_ref()
        .and_then(|d| d.get(&key))
        .and_then(text)
    {
        Some(t) => Ok(Some(t)),
        None => Err(TokenFailure::TokenKeyMissing {
            namespace,
            name,
            key,
        }),
    }
}

fn text(b: &ByteString) -> Option<Secret> {
    if b.0.len() > MAX_TOKEN_BYTES {
        return None;
    }
    let t = std::str::from_utf8(&b.0).ok()?.trim();
    (!t.is_empty()).then(|| Secret::new(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_trimmed_text_of_bounded_size() {
        assert_eq!(
            text(&ByteString(b" hf_abc\n".to_vec())).map(|s| s.expose().to_string()),
            Some("hf_abc".into())
        );
        assert!(text(&ByteString(vec![0xff, 0xfe])).is_none());
        assert!(text(&ByteString(b"  ".to_vec())).is_none());
        assert!(text(&ByteString(vec![b'a'; MAX_TOKEN_BYTES + 1])).is_none());
    }

    #[test]
    fn the_spec_ref_wins_over_the_default_secret() {
        let mut ms = ModelServe::new(
            "m",
            serde_json::from_value(serde_json::json!({"repo": "a/b"})).unwrap(),
        );
        ms.metadata.namespace = Some("team".into());
        assert_eq!(source(&ms, None), None);
        assert_eq!(
            source(&ms, Some("ops/hf")),
            Some(("ops".into(), "hf".into(), "token".into()))
        );
        assert_eq!(source(&ms, Some("no-namespace")), None);
        ms.spec.token_secret_ref =
            Some(serde_json::from_value(serde_json::json!({"name": "mine", "key": "k"})).unwrap());
        assert_eq!(
            source(&ms, Some("ops/hf")),
            Some(("team".into(), "mine".into(), "k".into()))
        );
    }

    #[test]
    fn a_missing_secret_heals_and_an_api_error_is_transient() {
        let f = TokenFailure::TokenKeyMissing {
            namespace: "n".into(),
            name: "s".into(),
            key: "token".into(),
        };
        assert_eq!(f.reason(), "TokenSecretMissing");
        assert_eq!(f.recovery(), Recovery::Heals(RECHECK));
    }
}
