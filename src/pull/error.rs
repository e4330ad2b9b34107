//! Why a pull failed; the Display is the one line the init container's log ends with.

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{flag} {value:?}: {why}")]
    Input {
        flag: &'static str,
        value: String,
        why: String,
    },
    #[error("{path} arrived with sha256 {got}, the mirror published {want} ({attempts} attempts)")]
    Mismatch {
        path: String,
        got: String,
        want: String,
        attempts: u32,
    },
    #[error(
        "{path}: the mirror has a file of {got} bytes where the registry published {want}; the mirror's copy is not the published file"
    )]
    WrongSize { path: String, got: u64, want: u64 },
    #[error("{path} needs {needed} more in {dest}, which has {free} free")]
    NoSpace {
        path: String,
        dest: String,
        needed: String,
        free: String,
    },
    #[error("the {count} files still to pull need {needed} in {dest}, which has {free} free")]
    NoSpaceForAll {
        count: usize,
        dest: String,
        needed: String,
        free: String,
    },
    #[error(
        "{dest} filled up while writing {path}: it needs {size}, {free} is free now (the partial copy of {written} was removed)"
    )]
    DiskFull {
        path: String,
        dest: String,
        written: String,
        size: String,
        free: String,
    },
    #[error(
        "{path} is not on the mirror ({url} answered 404); the Mirror stage puts it there first"
    )]
    NotOnMirror { path: String, url: String },
    #[error("{path}: {cause} (gave up after {tries} attempts without progress)")]
    Unreachable {
        path: String,
        cause: String,
        tries: u32,
    },
    #[error("{path}: the mirror refused the request: HTTP {status} {body}")]
    Refused {
        path: String,
        status: u16,
        body: String,
    },
    #[error("cannot read the mirror token in {path}: {why}")]
    Token { path: String, why: String },
    #[error("{path}: disk error in {dest}: {source}")]
    Disk {
        path: String,
        dest: String,
        #[source]
        source: std::io::Error,
    },
}
