//! The whole inspection of a model's header, synchronous and bounded: the checks of every count
//! against its bound, the first llama.cpp build that loads it, and a replica's memory. Its work
//! is at most linear in `MAX_TENSORS` tensors and `MAX_LAYERS` layers (milliseconds), so it may
//! run inline; the Check stage may still run it under `spawn_blocking`.

use super::bounds::BoundsError;
use super::header::{self, GgufError, Header};
use super::memory::{self, Estimate, Flags};
use super::support::{self, Unsupported};
use super::{ReadError, hparams, merge};

/// What the Check stage decides from a header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The first llama.cpp build that loads the model.
    pub first_build: u32,
    pub estimate: Estimate,
}

/// Why a model's header is refused.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Unsupported(#[from] Unsupported),
    #[error(transparent)]
    Bounds(#[from] BoundsError),
}

impl InspectError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            InspectError::Read(e) => e.reason(),
            InspectError::Unsupported(e) => e.reason(),
            InspectError::Bounds(e) => e.reason(),
        }
    }
}

/// Judges a parsed model (its shards merged): its counts first, then the build that loads it,
/// then its memory with `flags`.
pub fn judge(
    header: &Header,
    split: bool,
    build: u32,
    flags: &Flags,
) -> Result<Verdict, InspectError> {
    hparams::validate(header)?;
    let first_build = support::first_build(header, split, build)?;
    let estimate = memory::estimate_checked(header, flags)?;
    Ok(Verdict {
        first_build,
        estimate,
    })
}

/// Parses, merges and judges the shards of one model, first shard first, each given as its
/// file name and its bytes (the whole file, or a prefix that holds its whole header).
pub fn inspect(
    shards: &[(&str, &[u8])],
    build: u32,
    flags: &Flags,
) -> Result<(Header, Verdict), InspectError> {
    let mut model = None;
    for (file, bytes) in shards {
        let shard = header::parse(bytes, true).map_err(|source| ReadError::Invalid {
            file: (*file).into(),
            source,
        })?;
        merge(&mut model, shard, file)?;
    }
    let header = model.ok_or_else(|| ReadError::Invalid {
        file: "the model".into(),
        source: GgufError::Truncated { needed: 4, len: 0 },
    })?;
    let verdict = judge(&header, shards.len() > 1, build, flags)?;
    Ok((header, verdict))
}

#[cfg(test)]
mod tests;
