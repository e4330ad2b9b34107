//! Choosing the GGUF file set to serve from a repository listing: a pure function.
//!
//! A quant matches the quant label of a file name exactly, case-insensitively: the label is the
//! last run of quant-like tokens (`Q4_K_M`, `UD-Q4_K_XL`, `f16`, `Q3_K_L-Q8`), so Q2_K never picks
//! Q2_K_L or UD-Q2_K_XL. Split shards (`-00001-of-00003.gguf`) form one set; projectors, imatrix
//! files and other non-weights are skipped; a joined file wins over a split copy of itself.

use std::collections::BTreeMap;

use super::labels::{label, non_weights};
pub use super::shapes::safe_path;
use super::shapes::{Shape, shape};

/// Most names an error message lists; a registry may list hundreds of thousands.
const MAX_LISTED: usize = 40;

/// One file of a repository at a pinned commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoFile {
    pub path: String,
    pub size: u64,
    /// sha256 of the content as the registry published it (LFS files only).
    pub sha256: Option<String>,
}

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want<'a> {
    Quant(&'a str),
    File(&'a str),
}

/// How a set's files make up the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetKind {
    /// One GGUF file.
    Single,
    /// gguf-split shards, loaded by llama.cpp from the first one.
    Split { count: u32 },
    /// Raw `.partNofM` pieces that must be concatenated before llama.cpp can load them.
    Parts { count: u32 },
}

/// A loadable group of files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSet {
    /// The file path, or for shards and parts the path without the shard suffix.
    pub name: String,
    /// The quant label as written in the file name, if it has one.
    pub label: Option<String>,
    pub kind: SetKind,
    /// In load order (shard 1 first).
    pub files: Vec<RepoFile>,
}

impl FileSet {
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// Why no set could be chosen; each names the repository and what would be valid.
#[derive(
    Clone, Debug, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr, strum::VariantNames,
)]
pub enum SelectError {
    #[error(
        "{repo} has no GGUF file ({files} files in the repository); the nodes run llama.cpp, which loads only GGUF: choose a GGUF conversion of this model"
    )]
    #[strum(serialize = "NoGGUF")]
    NoGguf { repo: String, files: usize },
    #[error("{repo} has no file matching {quant}; it has: {}", list(available))]
    NoMatchingQuant {
        repo: String,
        quant: String,
        available: Vec<String>,
    },
    #[error(
        "{repo} has no file or shard set named {file}; it has: {}",
        list(available)
    )]
    NoSuchFile {
        repo: String,
        file: String,
        available: Vec<String>,
    },
    #[error("{repo} has {} sets matching {quant}: {}; name one with spec.file", candidates.len(), list(candidates))]
    #[strum(serialize = "AmbiguousQuant")]
    Ambiguous {
        repo: String,
        quant: String,
        candidates: Vec<String>,
    },
    #[error(
        "{repo}: shard set {set} has {count} shards but shard(s) {} are missing from the repository",
        numbers(missing)
    )]
    MissingShards {
        repo: String,
        set: String,
        count: u32,
        missing: Vec<u32>,
    },
    #[error(
        "{repo}: the shards of {set} disagree on their count ({}); the repository is inconsistent",
        numbers(counts)
    )]
    InconsistentShards {
        repo: String,
        set: String,
        counts: Vec<u32>,
    },
    #[error(
        "{repo}: {set} is published as {count} raw .partNofM pieces, which llama.cpp cannot load until they are concatenated; choose another quant, or a repository that publishes gguf-split shards"
    )]
    #[strum(serialize = "UnsupportedParts")]
    PartsOnly {
        repo: String,
        set: String,
        count: u32,
    },
    #[error("{repo}: {file} is {what}, not model weights; name a weights file")]
    NotWeights {
        repo: String,
        file: String,
        what: &'static str,
    },
    #[error("{repo}: {file} is not a GGUF file; the nodes run llama.cpp, which loads only GGUF")]
    #[strum(serialize = "NotGGUF")]
    NotGguf { repo: String, file: String },
    #[error(
        "{repo}: {file} is stored without LFS, so the registry publishes no sha256 for it and it cannot be verified"
    )]
    NoChecksum { repo: String, file: String },
}

impl SelectError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        self.into()
    }
}

fn list(items: &[String]) -> String {
    match items.len() {
        0 => "nothing usable".into(),
        n if n > MAX_LISTED => format!(
            "{} and {} more",
            items
                .iter()
                .take(MAX_LISTED)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            n - MAX_LISTED
        ),
        _ => items.join(", "),
    }
}

fn numbers(n: &[u32]) -> String {
    n.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

/// Chooses the set to serve.
pub fn select(repo: &str, files: &[RepoFile], want: Want<'_>) -> Result<FileSet, SelectError> {
    let sets = group(files);
    let weights: Vec<&Grouped> = sets.values().filter(|g| g.skip.is_none()).collect();
    let set = match want {
        Want::File(file) => by_file(repo, files, &sets, file)?,
        Want::Quant(quant) => {
            if weights.is_empty() {
                return Err(SelectError::NoGguf {
                    repo: repo.into(),
                    files: files.len(),
                });
            }
            by_quant(repo, &weights, quant)?
        }
    };
    finish(repo, set)
}

/// The quant labels a repository offers, deduplicated case-insensitively, sorted.
pub fn available_quants(files: &[RepoFile]) -> Vec<String> {
    let sets = group(files);
    let weights: Vec<&Grouped> = sets.values().filter(|g| g.skip.is_none()).collect();
    quants_of(&weights)
}

fn quants_of(weights: &[&Grouped]) -> Vec<String> {
    let mut labels: Vec<String> = weights
        .iter()
        .map(|g| {
            g.set
                .label
                .as_deref()
                .map_or_else(|| g.set.name.clone(), str::to_ascii_uppercase)
        })
        .collect();
    labels.sort();
    labels.dedup();
    labels
}

struct Grouped {
    set: FileSet,
    /// Why this set is not weights (mmproj, imatrix ...), if it is not.
    skip: Option<&'static str>,
    /// Shard/part number -> file, and the counts the names claim.
    pieces: BTreeMap<u32, RepoFile>,
    counts: Vec<u32>,
}

fn group(files: &[RepoFile]) -> BTreeMap<String, Grouped> {
    let mut sets: BTreeMap<String, Grouped> = BTreeMap::new();
    for f in files {
        if !safe_path(&f.path) {
            continue;
        }
        let Some(shape) = shape(&f.path) else {
            continue;
        };
        let (name, kind, piece) = match shape {
            Shape::Single => (f.path.clone(), SetKind::Single, None),
            Shape::Shard { set, index, count } => {
                (set, SetKind::Split { count }, Some((index, count)))
            }
            Shape::Part { set, index, count } => {
                (set, SetKind::Parts { count }, Some((index, count)))
            }
        };
        let key = format!("{}\u{0}{}", name, matches!(kind, SetKind::Parts { .. }));
        let g = sets.entry(key).or_insert_with(|| Grouped {
            set: FileSet {
                label: label(&name),
                name: name.clone(),
                kind,
                files: vec![],
            },
            skip: non_weights(&name),
            pieces: BTreeMap::new(),
            counts: vec![],
        });
        match piece {
            None => g.set.files.push(f.clone()),
            Some((index, count)) => {
                if !g.counts.contains(&count) {
                    g.counts.push(count);
                }
                g.pieces.insert(index, f.clone());
            }
        }
    }
    sets
}

fn by_quant(repo: &str, weights: &[&Grouped], quant: &str) -> Result<Grouped, SelectError> {
    let matching: Vec<&&Grouped> = weights
        .iter()
        .filter(|g| {
            g.set
                .label
                .as_deref()
                .is_some_and(|l| l.eq_ignore_ascii_case(quant))
        })
        .collect();
    let rank = |g: &Grouped| match g.set.kind {
        SetKind::Single => 0,
        SetKind::Split { .. } => 1,
        SetKind::Parts { .. } => 2,
    };
    let Some(best) = matching.iter().map(|g| rank(g)).min() else {
        return Err(SelectError::NoMatchingQuant {
            repo: repo.into(),
            quant: quant.into(),
            available: quants_of(weights),
        });
    };
    let top: Vec<&&Grouped> = matching.into_iter().filter(|g| rank(g) == best).collect();
    match top.as_slice() {
        [one] => Ok(clone(one)),
        _ => Err(SelectError::Ambiguous {
            repo: repo.into(),
            quant: quant.into(),
            candidates: top.iter().map(|g| g.set.name.clone()).collect(),
        }),
    }
}

fn by_file(
    repo: &str,
    files: &[RepoFile],
    sets: &BTreeMap<String, Grouped>,
    file: &str,
) -> Result<Grouped, SelectError> {
    let trimmed = file.strip_suffix(".gguf").unwrap_or(file);
    let found = sets.values().find(|g| {
        g.set.name == file
            || (g.set.kind != SetKind::Single
                && (g.set.name == trimmed || g.set.name.strip_suffix(".gguf") == Some(trimmed)))
            || g.set
                .files
                .iter()
                .chain(g.pieces.values())
                .any(|f| f.path == file)
    });
    match found {
        Some(g) => match g.skip {
            Some(what) => Err(SelectError::NotWeights {
                repo: repo.into(),
                file: file.into(),
                what,
            }),
            None => Ok(clone(g)),
        },
        None if files.iter().any(|f| f.path == file) => Err(SelectError::NotGguf {
            repo: repo.into(),
            file: file.into(),
        }),
        None => {
            let available: Vec<String> = sets
                .values()
                .filter(|g| g.skip.is_none())
                .map(|g| g.set.name.clone())
                .collect();
            Err(SelectError::NoSuchFile {
                repo: repo.into(),
                file: file.into(),
                available,
            })
        }
    }
}

fn clone(g: &Grouped) -> Grouped {
    Grouped {
        set: g.set.clone(),
        skip: g.skip,
        pieces: g.pieces.clone(),
        counts: g.counts.clone(),
    }
}

fn finish(repo: &str, mut g: Grouped) -> Result<FileSet, SelectError> {
    if let SetKind::Parts { count } = g.set.kind {
        return Err(SelectError::PartsOnly {
            repo: repo.into(),
            set: g.set.name,
            count,
        });
    }
    if let SetKind::Split { count } = g.set.kind {
        if g.counts.len() > 1 {
            g.counts.sort_unstable();
            return Err(SelectError::InconsistentShards {
                repo: repo.into(),
                set: g.set.name,
                counts: g.counts,
            });
        }
        let missing: Vec<u32> = (1..=count).filter(|i| !g.pieces.contains_key(i)).collect();
        if !missing.is_empty() {
            return Err(SelectError::MissingShards {
                repo: repo.into(),
                set: g.set.name,
                count,
                missing,
            });
        }
        g.set.files = g.pieces.into_values().collect();
    }
    if let Some(f) = g.set.files.iter().find(|f| f.sha256.is_none()) {
        return Err(SelectError::NoChecksum {
            repo: repo.into(),
            file: f.path.clone(),
        });
    }
    Ok(g.set)
}

#[cfg(test)]
mod tests;
