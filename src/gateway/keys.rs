//! Gateway API keys: Secrets labelled `modelserve.dev/gateway-key=true` in the gateway's keys
//! namespace. Each holds the key in `data.key` and may limit it with `data.namespaces` and
//! `data.models` (comma-separated). A key is looked up by its sha256, so the table never holds
//! a key itself and a lookup costs one hash whatever the number of keys.

use std::collections::{BTreeSet, HashMap};

use axum::http::{HeaderMap, StatusCode, header};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use sha2::{Digest, Sha256};

use super::openai::ApiError;

/// The label that marks a Secret as a gateway key.
pub const KEY_LABEL: &str = "modelserve.dev/gateway-key";
/// The shortest and longest key accepted, in bytes of visible ASCII.
pub const MIN_KEY: usize = 16;
pub const MAX_KEY: usize = 4096;
/// The most namespaces or models one key may list.
const MAX_LIST: usize = 256;

/// What one key may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    /// The Secret that holds the key, for logs and messages (never the key).
    pub name: String,
    /// Only models in these namespaces; None: any watched namespace.
    pub namespaces: Option<BTreeSet<String>>,
    /// Only models answering to one of these names; None: any model.
    pub models: Option<BTreeSet<String>>,
}

impl Scope {
    /// A scope with no limits, for `--auth none`.
    pub fn everything() -> Scope {
        Scope {
            name: "anonymous".into(),
            namespaces: None,
            models: None,
        }
    }

    pub fn allows_namespace(&self, namespace: &str) -> bool {
        self.namespaces
            .as_ref()
            .is_none_or(|n| n.contains(namespace))
    }

    /// Whether a model answering to `names` in `namespace` is within the key's limits.
    pub fn allows(&self, namespace: &str, names: &[String]) -> bool {
        self.allows_namespace(namespace)
            && self
                .models
                .as_ref()
                .is_none_or(|m| names.iter().any(|n| m.contains(n)))
    }

    /// What both `self` and `other` allow, named after both Secrets.
    fn narrowed(&self, other: Scope) -> Scope {
        let both = |a: &Option<BTreeSet<String>>, b: Option<BTreeSet<String>>| match (a, b) {
            (None, b) => b,
            (Some(a), None) => Some(a.clone()),
            (Some(a), Some(b)) => Some(a.intersection(&b).cloned().collect()),
        };
        Scope {
            name: format!("{}+{}", self.name, other.name),
            namespaces: both(&self.namespaces, other.namespaces),
            models: both(&self.models, other.models),
        }
    }

    /// The limits as a sentence, for a 403.
    pub fn describe(&self) -> String {
        // Empty only where Secrets holding the same key have no limit in common.
        let list = |s: &BTreeSet<String>| {
            if s.is_empty() {
                "(none: the Secrets holding this key allow nothing in common)".to_string()
            } else {
                s.iter().cloned().collect::<Vec<_>>().join(", ")
            }
        };
        match (&self.namespaces, &self.models) {
            (None, None) => "any model".into(),
            (Some(n), None) => format!("models in namespaces {}", list(n)),
            (None, Some(m)) => format!("the models {}", list(m)),
            (Some(n), Some(m)) => format!("the models {} in namespaces {}", list(m), list(n)),
        }
    }
}

/// Every valid key, by its sha256.
#[derive(Clone, Debug, Default)]
pub struct KeyTable {
    by_hash: HashMap<[u8; 32], Scope>,
    /// Secrets that carry the label but no usable key, and why: logged once per rebuild.
    pub invalid: Vec<(String, String)>,
    /// Secrets that hold the same key as an earlier one (by name), and which: logged too.
    pub shared: Vec<(String, String)>,
}

impl KeyTable {
    /// The table of `secrets` (those with the label).
    ///
    /// The same key in several Secrets may use only what all of them allow (a copy left behind
    /// never widens a key that was narrowed), whatever order the Secrets are listed in.
    pub fn build<'a>(secrets: impl IntoIterator<Item = &'a Secret>) -> KeyTable {
        let mut t = KeyTable::default();
        let mut secrets: Vec<&Secret> = secrets.into_iter().collect();
        secrets.sort_by_key(|s| s.name_any());
        for s in secrets {
            match parse(s) {
                Ok((key, scope)) => {
                    let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
                    match t.by_hash.get_mut(&hash) {
                        Some(first) => {
                            t.shared.push((scope.name.clone(), first.name.clone()));
                            *first = first.narrowed(scope);
                        }
                        None => {
                            t.by_hash.insert(hash, scope);
                        }
                    }
                }
                Err(why) => t.invalid.push((s.name_any(), why)),
            }
        }
        t
    }

    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// The scope of the request's bearer key, or the 401 that says why there is none.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Scope, ApiError> {
        let key = bearer(headers)?;
        let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.by_hash.get(&hash).cloned().ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "the API key is not one of the gateway's keys (Secrets labelled modelserve.dev/gateway-key=true)",
            )
        })
    }
}

/// The key of "Authorization: Bearer KEY".
fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "invalid_api_key", m);
    let value = headers.get(header::AUTHORIZATION).ok_or_else(|| {
        unauthorized(
            "no API key: send \"Authorization: Bearer KEY\" with a key of the gateway's (a Secret labelled modelserve.dev/gateway-key=true)",
        )
    })?;
    value
        .to_str()
        .ok()
        .and_then(|v| {
            let (scheme, key) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
        })
        .filter(|k| (1..=MAX_KEY).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| {
            unauthorized(&format!(
                "the Authorization header must be \"Bearer KEY\", KEY at most {MAX_KEY} visible ASCII characters"
            ))
        })
}

/// The key and scope of one Secret, or why it cannot be a key.
pub fn parse(s: &Secret) -> Result<(String, Scope), String> {
    let field = |k: &str| -> Result<Option<String>, String> {
        match s.data.as_ref().and_then(|d| d.get(k)) {
            None => Ok(None),
            Some(v) => String::from_utf8(v.0.clone())
                .map(Some)
                .map_err(|_| format!("data.{k} is not UTF-8")),
        }
    };
    let key = field("key")?
        .map(|k| k.trim().to_string())
        .ok_or("it has no data.key")?;
    if key.len() < MIN_KEY || key.len() > MAX_KEY || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "data.key must be {MIN_KEY} to {MAX_KEY} visible ASCII characters"
        ));
    }
    let list = |k: &str| -> Result<Option<BTreeSet<String>>, String> {
        let Some(text) = field(k)? else {
            return Ok(None);
        };
        let items: BTreeSet<String> = text
            .split([',', '\n', ' '])
            .map(str::trim)
            .filter(|i| !i.is_empty())
            .map(str::to_string)
            .collect();
        if items.is_empty() || items.len() > MAX_LIST {
            return Err(format!(
                "data.{k} must list 1 to {MAX_LIST} names, comma-separated (leave it out for no limit)"
            ));
        }
        if let Some(bad) = items.iter().find(|i| i.len() > 253) {
            return Err(format!("data.{k}: {bad:?} is longer than 253 characters"));
        }
        Ok(Some(items))
    };
    let scope = Scope {
        name: s.name_any(),
        namespaces: list("namespaces")?,
        models: list("models")?,
    };
    Ok((key, scope))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use k8s_openapi::ByteString;

    fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        );
        s
    }

    fn with_key(key: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
        );
        h
    }

    #[test]
    fn a_key_is_found_by_its_hash_with_its_limits() {
        let t = KeyTable::build(&[
            secret(
                "team-a",
                &[("key", "sk-team-a-0123456789"), ("namespaces", "team-a")],
            ),
            secret("all", &[("key", "sk-everything-0123456789")]),
        ]);
        assert_eq!(t.len(), 2);
        let a = t.authenticate(&with_key("sk-team-a-0123456789")).unwrap();
        assert_eq!(a.name, "team-a");
        assert!(a.allows("team-a", &["tiny".into()]));
        assert!(!a.allows("team-b", &["tiny".into()]));
        let all = t
            .authenticate(&with_key("sk-everything-0123456789"))
            .unwrap();
        assert!(all.allows("anywhere", &["x".into()]));
    }

    #[test]
    fn a_wrong_or_missing_key_is_a_401_that_says_what_to_send() {
        let t = KeyTable::build(&[secret("k", &[("key", "sk-good-0123456789ab")])]);
        let e = t
            .authenticate(&with_key("sk-bad-0123456789abc"))
            .unwrap_err();
        assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        let e = t.authenticate(&HeaderMap::new()).unwrap_err();
        assert!(e.message.contains("no API key"), "{e:?}");
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert!(t.authenticate(&h).unwrap_err().message.contains("Bearer"));
    }

    #[test]
    fn a_model_list_limits_by_any_name_the_model_answers_to() {
        let (_, s) = parse(&secret(
            "k",
            &[("key", "sk-models-0123456789"), ("models", "tiny, qwen")],
        ))
        .unwrap();
        assert!(s.allows("ns", &["tiny-llama".into(), "tiny".into()]));
        assert!(!s.allows("ns", &["other".into()]));
        assert_eq!(s.describe(), "the models qwen, tiny");
    }

    #[test]
    fn secrets_without_a_usable_key_are_left_out_and_say_why() {
        let t = KeyTable::build(&[
            secret("none", &[]),
            secret("short", &[("key", "abc")]),
            secret(
                "empty-list",
                &[("key", "sk-0123456789abcdef"), ("models", " , ")],
            ),
        ]);
        assert!(t.is_empty());
        let why = |name: &str| {
            t.invalid
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, w)| w.clone())
                .unwrap()
        };
        assert!(why("none").contains("no data.key"), "{:?}", t.invalid);
        assert!(why("short").contains("16 to 4096"), "{:?}", t.invalid);
        assert!(why("empty-list").contains("data.models"), "{:?}", t.invalid);
    }

    #[test]
    fn a_key_in_two_secrets_may_use_only_what_both_allow_in_any_order() {
        let key = "sk-0123456789abcdef";
        let wide = secret("a-wide", &[("key", key)]);
        let narrow = secret("b-narrow", &[("key", key), ("namespaces", "team-a,team-b")]);
        let narrower = secret("c-narrower", &[("key", key), ("namespaces", "team-b")]);
        for order in [
            [&wide, &narrow, &narrower],
            [&narrower, &wide, &narrow],
            [&narrow, &narrower, &wide],
        ] {
            let t = KeyTable::build(order);
            assert_eq!(t.len(), 1);
            let s = t.authenticate(&with_key(key)).unwrap();
            assert!(s.allows_namespace("team-b"));
            assert!(!s.allows_namespace("team-a"), "{s:?}");
            assert_eq!(s.name, "a-wide+b-narrow+c-narrower");
            assert_eq!(
                t.shared,
                [
                    ("b-narrow".to_string(), "a-wide".to_string()),
                    ("c-narrower".to_string(), "a-wide+b-narrow".to_string())
                ]
            );
        }
    }
}
