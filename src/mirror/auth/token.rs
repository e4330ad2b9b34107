//! The token of a request and what the API server's review of it means: the bearer token
//! (bounded, visible ASCII), the TokenReview verdict as a ServiceAccount or a refusal that says
//! why, and the token file a client of the mirror reads before each request.

use axum::http::{HeaderMap, header};

use super::{Caller, MAX_TOKEN, QUOTED, Refusal};

/// The bearer token of a request, or why there is none to check.
pub(super) fn bearer<'a>(headers: &'a HeaderMap, audience: &str) -> Result<&'a str, Refusal> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(Refusal::unauthenticated(format!(
            "no token: the request must carry \"Authorization: Bearer TOKEN\" with a ServiceAccount token for the audience {audience} (a projected serviceAccountToken volume)"
        )));
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .filter(|t| !t.is_empty() && t.len() <= MAX_TOKEN)
        .filter(|t| t.bytes().all(|b| b.is_ascii_graphic()));
    token.ok_or_else(|| {
        Refusal::unauthenticated(format!(
            "the Authorization header must be \"Bearer TOKEN\", TOKEN a ServiceAccount token of at most {MAX_TOKEN} visible ASCII characters"
        ))
    })
}

/// What a TokenReview's status means for the mirror.
pub(super) fn verdict(
    status: &k8s_openapi::api::authentication::v1::TokenReviewStatus,
    audience: &str,
) -> Result<Caller, Refusal> {
    if status.authenticated != Some(true) {
        let why = status
            .error
            .as_deref()
            .filter(|e| !e.is_empty())
            .map(quoted)
            .unwrap_or_else(|| "it is not valid".into());
        return Err(Refusal::unauthenticated(format!(
            "the API server did not accept the token for the audience {audience}: {why}"
        )));
    }
    // An API server that reviewed for other audiences than the one asked for, or that names
    // none (a token then is for the API server's own audience), did not vouch for this one.
    if !status
        .audiences
        .as_ref()
        .is_some_and(|auds| auds.iter().any(|a| a == audience))
    {
        return Err(Refusal::unauthenticated(format!(
            "the token is not for the audience {audience}; mount a projected serviceAccountToken with audience: {audience}"
        )));
    }
    let username = status
        .user
        .as_ref()
        .and_then(|u| u.username.as_deref())
        .unwrap_or_default();
    let caller = username
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .map(|(namespace, name)| Caller {
            namespace: namespace.into(),
            name: name.into(),
        });
    caller.ok_or_else(|| {
        Refusal::forbidden(format!(
            "only ServiceAccount tokens are accepted; this one is for {}",
            quoted(username)
        ))
    })
}

/// The largest token file read.
const MAX_TOKEN_FILE: u64 = 64 << 10;

/// The token a client of the mirror presents, read from `path` (a projected ServiceAccount
/// token the kubelet rotates, so it is read again before each request), or why it cannot be.
pub fn read_token_file(path: &std::path::Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if meta.len() > MAX_TOKEN_FILE {
        return Err(format!(
            "it has {} bytes; a token has at most {MAX_TOKEN_FILE}",
            meta.len()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let token = text.trim();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("it must hold one token of visible ASCII characters".into());
    }
    Ok(token.to_string())
}

pub(super) fn quoted(s: &str) -> String {
    s.chars().take(QUOTED).collect()
}

#[cfg(test)]
mod tests {
    use super::super::{AuthArgs, DEFAULT_AUDIENCE, Mode};
    use super::*;
    use axum::http::{HeaderValue, StatusCode};
    use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};

    fn reviewed(authenticated: bool, user: &str, auds: Option<&[&str]>) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(authenticated),
            audiences: auds.map(|a| a.iter().map(|s| s.to_string()).collect()),
            user: Some(UserInfo {
                username: Some(user.into()),
                ..Default::default()
            }),
            error: (!authenticated).then(|| "token has expired".into()),
        }
    }

    #[test]
    fn a_service_account_token_for_the_audience_names_its_account() {
        let s = reviewed(
            true,
            "system:serviceaccount:team-a:default",
            Some(&[DEFAULT_AUDIENCE]),
        );
        assert_eq!(
            verdict(&s, DEFAULT_AUDIENCE),
            Ok(Caller {
                namespace: "team-a".into(),
                name: "default".into()
            })
        );
    }

    #[test]
    fn refused_tokens_say_why() {
        let expired = verdict(&reviewed(false, "", None), DEFAULT_AUDIENCE).unwrap_err();
        assert_eq!(expired.status, StatusCode::UNAUTHORIZED);
        assert!(expired.message.contains("token has expired"), "{expired:?}");
        let other = verdict(
            &reviewed(true, "system:serviceaccount:a:b", Some(&["api"])),
            DEFAULT_AUDIENCE,
        )
        .unwrap_err();
        assert_eq!(other.status, StatusCode::UNAUTHORIZED);
        assert!(other.message.contains("not for the audience"), "{other:?}");
        // No audiences in the answer: the token was for the API server, not the mirror.
        let unnamed = verdict(
            &reviewed(true, "system:serviceaccount:a:b", None),
            DEFAULT_AUDIENCE,
        )
        .unwrap_err();
        assert_eq!(unnamed.status, StatusCode::UNAUTHORIZED);
        assert!(
            unnamed.message.contains("not for the audience"),
            "{unnamed:?}"
        );
        let user = verdict(
            &reviewed(true, "alice", Some(&[DEFAULT_AUDIENCE])),
            DEFAULT_AUDIENCE,
        )
        .unwrap_err();
        assert_eq!(user.status, StatusCode::FORBIDDEN);
        assert!(user.message.contains("alice"), "{user:?}");
    }

    #[test]
    fn a_missing_or_malformed_authorization_is_a_401_that_says_what_to_send() {
        let none = bearer(&HeaderMap::new(), "aud").unwrap_err();
        assert_eq!(none.status, StatusCode::UNAUTHORIZED);
        assert!(none.message.contains("no token"), "{none:?}");
        for bad in ["Basic abc", "Bearer ", "Bearer a b", "token"] {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(bad).unwrap());
            let e = bearer(&h, "aud").unwrap_err();
            assert_eq!(e.status, StatusCode::UNAUTHORIZED, "{bad}");
        }
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer eyJabc.def"),
        );
        assert_eq!(bearer(&h, "aud"), Ok("eyJabc.def"));
        let long = format!("Bearer {}", "a".repeat(MAX_TOKEN + 1));
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(&long).unwrap());
        assert!(bearer(&h, "aud").is_err());
    }

    #[test]
    fn the_flags_name_what_is_wrong() {
        let mut a = AuthArgs {
            mode: Mode::Kubernetes,
            ..Default::default()
        };
        assert!(
            a.validate()
                .unwrap_err()
                .contains("--operator-service-account")
        );
        a.operators = vec!["modelserve".into()];
        assert!(a.validate().unwrap_err().contains("NAMESPACE/NAME"));
        a.operators = vec!["modelserve/ms-modelserve".into()];
        assert_eq!(
            a.validate(),
            Ok(vec![("modelserve".into(), "ms-modelserve".into())])
        );
        a.audience = String::new();
        assert!(a.validate().unwrap_err().contains("--audience"));
        let open = AuthArgs::default();
        assert_eq!(open.validate(), Ok(vec![]));
    }
}
