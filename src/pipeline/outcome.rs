//! How a stage ends, and why. Every reason a condition carries comes from an enum: [`Progress`]
//! for a stage that is done or on its way, a stage's failure enum (each implements [`Failure`])
//! for one that is not. No reason is a string written at a call site.

use std::time::Duration;

/// How a failure gets better.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// Retried by the controller's one backoff (capped exponential with jitter), never sooner
    /// than `at_least` (a registry's advertised rate-limit reset).
    Transient { at_least: Duration },
    /// Cannot succeed until the spec changes; only a new generation runs the stage again.
    SpecChange,
    /// Something outside the spec can fix it without anyone editing the ModelServe (an access
    /// request approved, a node added, a Secret created): looked at again after this long.
    Heals(Duration),
}

impl Recovery {
    /// A transient failure with no floor on the wait.
    pub const TRANSIENT: Recovery = Recovery::Transient {
        at_least: Duration::ZERO,
    };
}

/// A stage's failure: a typed error whose variant decides the condition's reason.
pub trait Failure: std::error::Error {
    /// The condition reason, PascalCase.
    fn reason(&self) -> &'static str;
    /// How it gets better.
    fn recovery(&self) -> Recovery;
}

/// The reasons of a stage that is done or on its way, and of the stages after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantNames)]
pub enum Progress {
    /// Resolve is done: the set is chosen and the commit pinned.
    Resolved,
    /// Check is done: the build loads it and a node holds it.
    Checked,
    /// Mirror is done: every file is on the mirror, verified.
    Mirrored,
    /// Mirror is on its way.
    Mirroring,
    /// Catalog is done: the serving objects exist as the spec asks.
    Cataloged,
    /// Place is on its way.
    Placing,
    /// Place is done: a replica is ready.
    Placed,
    /// The smoke test waits for the replica to answer.
    Asking,
    /// The smoke test is done.
    Answered,
    /// The smoke test is switched off.
    Skipped,
    /// A stage waits for Resolve's result.
    WaitingForResolve,
    /// The smoke test waits for a placed replica.
    WaitingForPlace,
    /// An earlier stage is not done.
    WaitingForEarlierStage,
    /// replicas is 0: the stages after Catalog wait for a scale-up.
    OnDemand,
}

impl Progress {
    /// The condition reason.
    pub fn reason(self) -> &'static str {
        self.into()
    }
}

/// How one stage ended in this reconcile.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The stage holds; the pipeline moves on.
    Done { reason: Progress, message: String },
    /// On its way; look again after `after`.
    Waiting {
        reason: Progress,
        message: String,
        after: Duration,
    },
    /// Cannot go on now; `recovery` says what makes it go on. The reason comes from a
    /// [`Failure`] (or, for a failure that is settled, from the condition it wrote before).
    Failed {
        reason: String,
        message: String,
        recovery: Recovery,
    },
}

impl Outcome {
    pub fn done(reason: Progress, message: impl Into<String>) -> Outcome {
        Outcome::Done {
            reason,
            message: message.into(),
        }
    }

    pub fn waiting(reason: Progress, message: impl Into<String>, after: Duration) -> Outcome {
        Outcome::Waiting {
            reason,
            message: message.into(),
            after,
        }
    }

    /// The outcome of a failure: its reason, its message, its recovery.
    pub fn failed(f: &(impl Failure + ?Sized)) -> Outcome {
        Outcome::Failed {
            reason: f.reason().to_string(),
            message: f.to_string(),
            recovery: f.recovery(),
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self, Outcome::Done { .. })
    }

    /// The condition reason.
    pub fn reason(&self) -> &str {
        match self {
            Outcome::Done { reason, .. } | Outcome::Waiting { reason, .. } => reason.reason(),
            Outcome::Failed { reason, .. } => reason,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Outcome::Done { message, .. }
            | Outcome::Waiting { message, .. }
            | Outcome::Failed { message, .. } => message,
        }
    }
}

/// Failures any stage can have, because of how it runs rather than what it does.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
pub enum RunFailure {
    /// The stage's code panicked: a bug, contained to this object.
    #[error(
        "the {stage} stage failed inside modelserve: {message}; this is a bug in modelserve (please report it); only this ModelServe is affected, and the stage is retried with backoff"
    )]
    InternalError {
        stage: &'static str,
        message: String,
    },
    /// The stage ran longer than the operator allows one stage.
    #[error(
        "the {stage} stage ran longer than {limit}s and was stopped so other models are not held up; it is retried with backoff"
    )]
    StageTimeout { stage: &'static str, limit: u64 },
}

impl Failure for RunFailure {
    fn reason(&self) -> &'static str {
        self.into()
    }

    fn recovery(&self) -> Recovery {
        Recovery::TRANSIENT
    }
}

/// The text of a panic's payload, for the InternalError message.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_becomes_its_reason_message_and_recovery() {
        let f = RunFailure::InternalError {
            stage: "Resolve",
            message: "byte index 5 is not a char boundary".into(),
        };
        let o = Outcome::failed(&f);
        assert_eq!(o.reason(), "InternalError");
        assert!(o.message().contains("char boundary"), "{}", o.message());
        assert!(matches!(
            o,
            Outcome::Failed {
                recovery: Recovery::Transient { .. },
                ..
            }
        ));
    }

    #[test]
    fn progress_reasons_are_their_variant_names() {
        assert_eq!(
            Progress::WaitingForEarlierStage.reason(),
            "WaitingForEarlierStage"
        );
        assert!(<Progress as strum::VariantNames>::VARIANTS.contains(&"OnDemand"));
    }

    #[test]
    fn a_panic_payload_reads_as_text() {
        let p = std::panic::catch_unwind(|| panic!("boom {}", 7)).unwrap_err();
        assert_eq!(panic_message(p.as_ref()), "boom 7");
        let p = std::panic::catch_unwind(|| std::panic::panic_any(5u8)).unwrap_err();
        assert_eq!(panic_message(p.as_ref()), "a panic without a message");
    }
}
