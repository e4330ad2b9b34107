//! Every condition reason the operator can write, gathered from the enums that define them, so
//! the README's table of reasons is checked against the code and not against a copy of it.

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
    out.extend(HubError::VARIANTS);
    out.extend(SelectError::VARIANTS);
    out.extend(check());
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether a False condition with `reason` is one the operator retries with its backoff by
/// itself (a registry or mirror outage, a failed write, a panic or an overlong stage): a
/// follower such as `modelserve serve` keeps following instead of giving up.
pub fn retried(reason: &str) -> bool {
    HubError::TRANSIENT_REASONS.contains(&reason)
        || RunFailure::VARIANTS.contains(&reason)
        || [
            "KubernetesApiError",
            "MirrorUnavailable",
            "MirrorRefused",
            "ApiError",
            "EngineKeyFailed",
            "EngineKeyMissing",
        ]
        .contains(&reason)
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
        CheckFailure::Bounds(crate::gguf::bounds::BoundsError::AboveLimit {
            field: s(),
            value: 0,
            limit: 0,
            unit: "",
        }),
    ];
    out.extend(failures.iter().map(|f| f.reason()));
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_retried_reason_is_a_reason() {
        let all = super::all();
        for r in [
            "KubernetesApiError",
            "MirrorUnavailable",
            "MirrorRefused",
            "ApiError",
            "EngineKeyFailed",
            "EngineKeyMissing",
            "RateLimited",
            "InternalError",
        ] {
            assert!(super::retried(r) && all.contains(&r), "{r}");
        }
        assert!(!super::retried("NoMatchingQuant"));
    }

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
