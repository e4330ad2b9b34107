//! The model registry client, speaking the Hugging Face Hub HTTP API: model info at a revision,
//! the recursive tree at a commit, access checks and byte ranges. Errors are mapped from the
//! status and `X-Error-Code` to causes a person can act on; transient ones are retried with the
//! crate's one backoff, and every call is bounded in time and in the bytes it reads.
//!
//! - `client`: the [`Hub`] and its calls
//! - `request`: one call's attempts, deadline, backoff and answer mapping
//! - `transport`: shared HTTP clients, timeouts, size limits, pagination and rate-limit headers
//! - `error`: [`HubError`] and the mapping from an HTTP answer
//! - `validate`: checks on repository, revision, endpoint and paths before any URL
//! - `args`: [`RegistryArgs`], the registry flags every command shares
//! - [`select`] (with `shapes` and `labels`): choosing the file set from a listing

mod args;
mod client;
mod error;
mod labels;
mod request;
pub mod select;
mod shapes;
mod transport;
mod validate;

pub use args::RegistryArgs;
pub use client::{Hub, ModelInfo};
pub use error::HubError;
pub use transport::{Limits, MAX_REDIRECTS, Retry, rate_limit_reset};
pub use validate::{check_repo, check_revision};

/// Default registry endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
