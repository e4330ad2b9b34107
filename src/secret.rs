//! A value that must never reach a log, an Event or a status: registry tokens and engine keys.
//! Debug and Display print a placeholder; only [`Secret::expose`] gives the value, so every
//! place that uses it is found by one search.

use serde::{Deserialize, Serialize};

/// A token or key. Serializes as the plain string (it goes over the wire to the mirror), but
/// never prints.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value itself, for the one request header or file that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Secret {
        Secret(s)
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn a_secret_never_prints_but_still_serializes() {
        let s = Secret::new("hf_abcdef");
        assert!(!format!("{s:?} {s}").contains("hf_abcdef"));
        assert!(!format!("{:?}", Some(s.clone())).contains("hf_abcdef"));
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"hf_abcdef\"");
        assert_eq!(s.expose(), "hf_abcdef");
    }
}
