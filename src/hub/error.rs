//! Registry failures named by their cause, and the mapping from an HTTP answer (status,
//! `X-Error-Code`, `X-Error-Message`) to the cause a person can act on.

use std::time::Duration;

use reqwest::header::HeaderMap;

use crate::units::human_bytes;

/// A registry failure, named by its cause.
#[derive(Debug, Clone, PartialEq, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
pub enum HubError {
    #[error(
        "the registry has no repository {repo}, or it is private and the request had no token with access (the registry answers both the same way); check spec.repo, or set spec.tokenSecretRef"
    )]
    RepoNotFound { repo: String },
    #[error("{repo} has no branch, tag or commit named {revision}; check spec.revision")]
    RevisionNotFound { repo: String, revision: String },
    #[error(
        "{repo} is gated and the request had no token: set spec.tokenSecretRef to a Secret holding the token of an account that was granted access at {url}"
    )]
    #[strum(serialize = "GatedRepoNoToken")]
    GatedNoToken { repo: String, url: String },
    #[error(
        "{repo} is gated and the token's account is not in its authorized list yet: ask for access at {url}, then change the spec to retry"
    )]
    #[strum(serialize = "GatedRepoNotApproved")]
    GatedNotApproved { repo: String, url: String },
    #[error("{repo} at {revision} has no file {path}")]
    FileNotFound {
        repo: String,
        revision: String,
        path: String,
    },
    #[error(
        "{repo} is disabled on the registry (access to it is turned off by its owner or the registry)"
    )]
    #[strum(serialize = "RepoDisabled")]
    Disabled { repo: String },
    #[error(
        "the registry rejected the token (invalid credentials) for {repo}: check the Secret the token comes from"
    )]
    #[strum(serialize = "InvalidToken")]
    BadToken { repo: String },
    #[error("the registry refused access to {repo} ({status}): {message}")]
    #[strum(serialize = "AccessDenied")]
    Forbidden {
        repo: String,
        status: u16,
        message: String,
    },
    #[error("the registry is rate-limiting these requests; its limit resets in {}s", retry_after.as_secs())]
    RateLimited { retry_after: Duration },
    #[error("the registry is unavailable ({cause}) after {attempts} attempts")]
    #[strum(serialize = "RegistryUnavailable")]
    Unavailable { cause: String, attempts: u32 },
    #[error(
        "the registry at {endpoint} did not answer {what} within {}s ({attempts} attempts, timed out)",
        waited.as_secs()
    )]
    #[strum(serialize = "RegistryNotAnswering")]
    NoAnswer {
        endpoint: String,
        what: String,
        waited: Duration,
        attempts: u32,
    },
    #[error("the registry sent a response that cannot be used ({what})")]
    #[strum(serialize = "InvalidRegistryResponse")]
    Malformed { what: String },
    #[error(
        "the registry at {endpoint} answered {what} with something that is not the JSON expected ({expected}): {error}; it begins {begins:?} (a proxy in the way or a registry in trouble sends this)"
    )]
    #[strum(serialize = "MalformedRegistryJson")]
    MalformedJson {
        endpoint: String,
        what: String,
        expected: &'static str,
        error: String,
        begins: String,
    },
    #[error(
        "the registry at {endpoint} sent more than {} for {what}; modelserve reads at most that much of it",
        human_bytes(*cap as u64)
    )]
    #[strum(serialize = "RegistryResponseTooLarge")]
    TooLarge {
        endpoint: String,
        what: String,
        cap: usize,
    },
    #[error(
        "the registry at {endpoint} redirected {what} more than {max} times; check the endpoint and any proxy in the way"
    )]
    TooManyRedirects {
        endpoint: String,
        what: String,
        max: usize,
    },
    #[error("{repo} lists more than {max} files; this is more than the operator reads")]
    TooManyFiles { repo: String, max: usize },
    #[error(
        "the file tree of {repo} runs past {max} pages ({files} files so far); this is more than the operator reads"
    )]
    #[strum(serialize = "TooManyTreePages")]
    TooManyPages {
        repo: String,
        max: usize,
        files: usize,
    },
    #[error(
        "the registry CA bundle {path} cannot be used: {why}; it must be a PEM file of root certificates (-----BEGIN CERTIFICATE-----)"
    )]
    #[strum(serialize = "InvalidCaBundle")]
    CaBundle { path: String, why: String },
    #[error("{what} {value:?} is not valid: {why}")]
    #[strum(serialize = "InvalidSpec")]
    InvalidInput {
        what: &'static str,
        value: String,
        why: &'static str,
    },
}

impl HubError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        self.into()
    }

    /// The reasons of the failures [`HubError::is_transient`] says are transient.
    pub const TRANSIENT_REASONS: [&'static str; 6] = [
        "RateLimited",
        "RegistryUnavailable",
        "RegistryNotAnswering",
        "InvalidRegistryResponse",
        "MalformedRegistryJson",
        "TooManyRedirects",
    ];

    /// Whether retrying later can help without a change of spec. A registry that does not
    /// answer, answers garbage or loops on redirects is often a proxy or an outage that heals;
    /// a repository too big to read, or a bad setting, stays so until someone changes it.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            HubError::RateLimited { .. }
                | HubError::Unavailable { .. }
                | HubError::NoAnswer { .. }
                | HubError::Malformed { .. }
                | HubError::MalformedJson { .. }
                | HubError::TooManyRedirects { .. }
        )
    }
}

/// What a request was about, for error messages.
pub(super) struct Ctx<'a> {
    pub repo: &'a str,
    pub revision: Option<&'a str>,
    pub path: Option<&'a str>,
    /// The page number, for a tree page.
    pub page: Option<usize>,
}

impl<'a> Ctx<'a> {
    /// The model info of a repository at a revision.
    pub fn info(repo: &'a str, revision: &'a str) -> Ctx<'a> {
        Ctx {
            repo,
            revision: Some(revision),
            path: None,
            page: None,
        }
    }

    /// One page of the file tree at a commit.
    pub fn tree_page(repo: &'a str, commit: &'a str, page: usize) -> Ctx<'a> {
        Ctx {
            page: Some(page),
            ..Ctx::info(repo, commit)
        }
    }

    /// One file at a revision.
    pub fn file(repo: &'a str, revision: &'a str, path: &'a str) -> Ctx<'a> {
        Ctx {
            path: Some(path),
            ..Ctx::info(repo, revision)
        }
    }

    /// The request in words: "the model info of o/r at main".
    pub fn what(&self) -> String {
        let rev = self.revision.unwrap_or("main");
        match (self.path, self.page) {
            (Some(path), _) => format!("{path} of {} at {rev}", self.repo),
            (None, Some(page)) => format!("page {page} of the file tree of {} at {rev}", self.repo),
            (None, None) => format!("the model info of {} at {rev}", self.repo),
        }
    }
}

/// An error answer (not 2xx/3xx, not retried) mapped to its cause. `body` is the start of the
/// answer's body as read (capped), `cut` whether there was more.
pub(super) fn from_status(
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    cut: bool,
    ctx: &Ctx<'_>,
    repo_url: String,
    had_token: bool,
) -> HubError {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let code = header("x-error-code").unwrap_or_default();
    let message = header("x-error-message").unwrap_or_default();
    let repo = ctx.repo.to_string();
    match (status, code.as_str()) {
        (_, "EntryNotFound") => HubError::FileNotFound {
            repo,
            revision: ctx.revision.unwrap_or_default().into(),
            path: ctx.path.unwrap_or_default().into(),
        },
        (416, _) => HubError::Malformed {
            what: format!(
                "a byte range beyond the end of {}",
                ctx.path.unwrap_or_default()
            ),
        },
        (_, "RevisionNotFound") => HubError::RevisionNotFound {
            repo,
            revision: ctx.revision.unwrap_or_default().into(),
        },
        (_, "GatedRepo") if !had_token || status == 401 => HubError::GatedNoToken {
            repo,
            url: repo_url,
        },
        (_, "GatedRepo") => HubError::GatedNotApproved {
            repo,
            url: repo_url,
        },
        (_, "RepoNotFound") => HubError::RepoNotFound { repo },
        (403, _) if message.contains("disabled") => HubError::Disabled { repo },
        (401, _) if message.contains("Invalid credentials") => HubError::BadToken { repo },
        (401, _) | (404, _) => HubError::RepoNotFound { repo },
        _ => HubError::Forbidden {
            repo,
            status,
            message: if message.is_empty() {
                quote(body, cut)
            } else {
                message
            },
        },
    }
}

/// The start of a body as text a message can carry: at most 300 characters, control
/// characters replaced, and a note when the registry sent more than was read.
pub(super) fn quote(body: &[u8], cut: bool) -> String {
    const CHARS: usize = 300;
    let text = String::from_utf8_lossy(body);
    let mut out: String = text
        .chars()
        .take(CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if cut || text.chars().nth(CHARS).is_some() {
        out.push_str(" [cut]");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_pascal_case_and_unique() {
        let d = Duration::from_secs(1);
        let s = String::new;
        let all = [
            HubError::RepoNotFound { repo: s() },
            HubError::RateLimited { retry_after: d },
            HubError::NoAnswer {
                endpoint: s(),
                what: s(),
                waited: d,
                attempts: 1,
            },
            HubError::MalformedJson {
                endpoint: s(),
                what: s(),
                expected: "",
                error: s(),
                begins: s(),
            },
            HubError::TooLarge {
                endpoint: s(),
                what: s(),
                cap: 1,
            },
            HubError::TooManyRedirects {
                endpoint: s(),
                what: s(),
                max: 1,
            },
            HubError::TooManyFiles { repo: s(), max: 1 },
            HubError::TooManyPages {
                repo: s(),
                max: 1,
                files: 1,
            },
            HubError::CaBundle {
                path: s(),
                why: s(),
            },
        ];
        let reasons: std::collections::BTreeSet<_> = all.iter().map(HubError::reason).collect();
        assert_eq!(reasons.len(), all.len());
        for r in reasons {
            assert!(
                r.starts_with(|c: char| c.is_ascii_uppercase())
                    && r.chars().all(|c| c.is_ascii_alphanumeric()),
                "{r}"
            );
        }
        let transient: Vec<_> = all
            .iter()
            .filter(|e| e.is_transient())
            .map(HubError::reason)
            .collect();
        assert_eq!(
            transient,
            [
                "RateLimited",
                "RegistryNotAnswering",
                "MalformedRegistryJson",
                "TooManyRedirects"
            ]
        );
        for r in transient {
            assert!(HubError::TRANSIENT_REASONS.contains(&r), "{r}");
        }
        for r in HubError::TRANSIENT_REASONS {
            assert!(
                <HubError as strum::VariantNames>::VARIANTS.contains(&r),
                "{r}"
            );
        }
        let unavailable = HubError::Unavailable {
            cause: String::new(),
            attempts: 1,
        };
        let malformed = HubError::Malformed {
            what: String::new(),
        };
        for e in [unavailable, malformed] {
            assert!(e.is_transient() && HubError::TRANSIENT_REASONS.contains(&e.reason()));
        }
    }

    #[test]
    fn quoted_bodies_are_cut_by_characters_not_bytes() {
        let body = "ошибка\n".repeat(100);
        let q = quote(body.as_bytes(), false);
        assert_eq!(q.chars().count(), 300 + " [cut]".len());
        assert!(!q.contains('\n'));
        assert_eq!(quote("é".as_bytes(), true), "é [cut]");
        // A body cut by the byte cap inside a character still quotes.
        assert_eq!(quote(&"é".as_bytes()[..1], true), "\u{fffd} [cut]");
    }
}
