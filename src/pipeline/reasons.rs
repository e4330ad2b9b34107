//! Every condition reason the operator can write, gathered from the enums that define them, so
//! the README's table of reasons is checked against the code and not against a copy of it.

use std::time::Duration;

use strum::VariantNames;

use super::catalog::CatalogFailure;
use super::check::CheckFailure;
use super::mirror::MirrorFailure;
use super::outcome::{Failure, Progress, RunFailure};
use super::place::PlaceFailure;
use super::smoke::SmokeFailure;
use super::token::TokenFailure;
use crate::gguf::support::Unsupported;
use crate::hub::HubError;
use crate::hub::select::SelectError;

/// Every reason, sorted, without repeats.
pub fn all() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    out.extend(Progress::VARIANTS);
    out.extend(RunFailure::VARIANTS);
    out.extend(TokenFailure::VARIANTS);
    out.extend(MirrorFailure::VARIANTS.iter().filter(|v| **v != "Token"));
    out.extend(CatalogFailure::VARIANTS);
    out.extend(PlaceFailure::VARIANTS);
    out.extend(SmokeFailure::VARIANTS);
    out.extend(crate::conditions::READY_REASONS);
    out.extend(registry());
    out.extend(selection());
    out.extend(check());
    out.sort_unstable();
    out.dedup();
    out
}

fn registry() -> Vec<&'static str> {
    let s = String::new;
    [
        HubError::RepoNotFound { repo: s() },
        HubError::RevisionNotFound {
            repo: s(),
            revision: s(),
        },
        HubError::GatedNoToken {
            repo: s(),
            url: s(),
        },
        HubError::GatedNotApproved {
            repo: s(),
            url: s(),
        },
        HubError::FileNotFound {
            repo: s(),
            revision: s(),
            path: s(),
        },
        HubError::Disabled { repo: s() },
        HubError::BadToken { repo: s() },
        HubError::Forbidden {
            repo: s(),
            status: 0,
            message: s(),
        },
        HubError::RateLimited {
            retry_after: Duration::ZERO,
        },
        HubError::Unavailable {
            cause: s(),
            attempts: 0,
        },
        HubError::Malformed { what: s() },
        HubError::TooManyFiles { repo: s(), max: 0 },
        HubError::InvalidInput {
            what: "",
            value: s(),
            why: "",
        },
    ]
    .iter()
    .map(HubError::reason)
    .collect()
}

fn selection() -> Vec<&'static str> {
    let s = String::new;
    [
        SelectError::NoGguf {
            repo: s(),
            files: 0,
        },
        SelectError::NoMatchingQuant {
            repo: s(),
            quant: s(),
            available: vec![],
        },
        SelectError::NoSuchFile {
            repo: s(),
            file: s(),
            available: vec![],
        },
        SelectError::Ambiguous {
            repo: s(),
            quant: s(),
            candidates: vec![],
        },
        SelectError::MissingShards {
            repo: s(),
            set: s(),
            missing: vec![],
            count: 0,
        },
        SelectError::InconsistentShards {
            repo: s(),
            set: s(),
            counts: vec![],
        },
        SelectError::PartsOnly {
            repo: s(),
            set: s(),
            count: 0,
        },
        SelectError::NotWeights {
            repo: s(),
            file: s(),
            what: "",
        },
        SelectError::NotGguf {
            repo: s(),
            file: s(),
        },
        SelectError::NoChecksum {
            repo: s(),
            file: s(),
        },
    ]
    .iter()
    .map(SelectError::reason)
    .collect()
}

fn check() -> Vec<&'static str> {
    let s = String::new;
    let unsupported = [
        Unsupported::NoArchitecture,
        Unsupported::TypeUnknown { tensor: s(), id: 0 },
    ];
    let mut out: Vec<&'static str> = unsupported.iter().map(Unsupported::reason).collect();
    let failures = [
        CheckFailure::InvalidResources(s()),
        CheckFailure::NoNodeFits {
            why: s(),
            summary: s(),
        },
        CheckFailure::Header(crate::gguf::ReadError::Source(
            crate::gguf::SourceError::Io {
                path: s(),
                source: std::io::Error::other(""),
            },
        )),
    ];
    out.extend(failures.iter().map(|f| f.reason()));
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_reason_is_one_pascal_case_word() {
        let all = super::all();
        assert!(all.len() > 40, "{all:?}");
        for r in all {
            assert!(
                r.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                    && r.chars().all(|c| c.is_ascii_alphanumeric()),
                "{r}"
            );
        }
    }
}
