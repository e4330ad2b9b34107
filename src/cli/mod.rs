//! The command-line side: commands people run against a registry or a cluster.

pub mod plan;

/// How a command prints its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}
pub mod estimate;
