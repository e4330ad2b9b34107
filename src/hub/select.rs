//! Choosing the GGUF file set to serve from a repository listing: a pure function.
//!
//! A quant matches the quant label of a file name exactly, case-insensitively: the label is the
//! last run of quant-like tokens (`Q4_K_M`, `UD-Q4_K_XL`, `f16`, `Q3_K_L-Q8`), so Q2_K never picks
//! Q2_K_L or UD-Q2_K_XL. Split shards (`-00001-of-00003.gguf`) form one set; projectors, imatrix
//! files and other non-weights are skipped; a joined file wins over a split copy of itself.

use std::collections::BTreeMap;

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
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error(
        "{repo} has no GGUF file ({files} files in the repository); the nodes run llama.cpp, which loads only GGUF: choose a GGUF conversion of this model"
    )]
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
    #[error("{repo} has {} sets matching {quant}: {}; name one with spec.file", candidates.len(), candidates.join(", "))]
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
    NotGguf { repo: String, file: String },
    #[error(
        "{repo}: {file} is stored without LFS, so the registry publishes no sha256 for it and it cannot be verified"
    )]
    NoChecksum { repo: String, file: String },
}

impl SelectError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            SelectError::NoGguf { .. } => "NoGGUF",
            SelectError::NoMatchingQuant { .. } => "NoMatchingQuant",
            SelectError::NoSuchFile { .. } => "NoSuchFile",
            SelectError::Ambiguous { .. } => "AmbiguousQuant",
            SelectError::MissingShards { .. } => "MissingShards",
            SelectError::InconsistentShards { .. } => "InconsistentShards",
            SelectError::PartsOnly { .. } => "UnsupportedParts",
            SelectError::NotWeights { .. } => "NotWeights",
            SelectError::NotGguf { .. } => "NotGGUF",
            SelectError::NoChecksum { .. } => "NoChecksum",
        }
    }
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "nothing usable".into()
    } else {
        items.join(", ")
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
    if top.len() > 1 {
        return Err(SelectError::Ambiguous {
            repo: repo.into(),
            quant: quant.into(),
            candidates: top.iter().map(|g| g.set.name.clone()).collect(),
        });
    }
    Ok(clone(top[0]))
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
            let mut available: Vec<String> = sets
                .values()
                .filter(|g| g.skip.is_none())
                .map(|g| g.set.name.clone())
                .collect();
            available.truncate(40);
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

enum Shape {
    Single,
    Shard { set: String, index: u32, count: u32 },
    Part { set: String, index: u32, count: u32 },
}

/// How a path takes part in a GGUF set, or None when it is not GGUF at all.
fn shape(path: &str) -> Option<Shape> {
    let lower = path.to_ascii_lowercase();
    if let Some(stem_len) = lower.strip_suffix(".gguf").map(str::len) {
        let stem = &path[..stem_len];
        return Some(match shard_suffix(stem) {
            Some((index, count, cut)) if index >= 1 && index <= count => Shape::Shard {
                set: stem[..cut].to_string(),
                index,
                count,
            },
            _ => Shape::Single,
        });
    }
    // Model.Q8_0.gguf.part1of2
    let at = lower.rfind(".gguf.part")?;
    let tail = &lower[at + ".gguf.part".len()..];
    let (i, n) = tail.split_once("of")?;
    let (index, count) = (i.parse::<u32>().ok()?, n.parse::<u32>().ok()?);
    (index >= 1 && index <= count && count <= 1000).then(|| Shape::Part {
        set: path[..at + ".gguf".len()].to_string(),
        index,
        count,
    })
}

/// `name-00001-of-00003` -> (1, 3, position of the '-').
fn shard_suffix(stem: &str) -> Option<(u32, u32, usize)> {
    let b = stem.as_bytes();
    if b.len() < 16 {
        return None;
    }
    let cut = b.len() - 15;
    let tail = &stem[cut..];
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|c| c.is_ascii_digit());
    let rest = tail.strip_prefix('-')?;
    let (i, n) = (rest.get(..5)?, rest.get(5..)?);
    let n = n.strip_prefix("-of-").or_else(|| n.strip_prefix("-OF-"))?;
    if !digits(i) || !digits(n) {
        return None;
    }
    Some((i.parse().ok()?, n.parse().ok()?, cut))
}

/// Why a GGUF set is not model weights, if it is not.
fn non_weights(name: &str) -> Option<&'static str> {
    let base = name.rsplit('/').next().unwrap_or(name).to_ascii_lowercase();
    if base.contains("mmproj") {
        Some("a vision projector (mmproj)")
    } else if base.contains("imatrix") {
        Some("an importance matrix (imatrix)")
    } else if ["mtp-", "eagle3-", "dflash-", "dspark-"]
        .iter()
        .any(|p| base.starts_with(p))
    {
        Some("a draft or speculative-decoding head")
    } else if base.starts_with("ggml-vocab-") {
        Some("a vocabulary-only file")
    } else {
        None
    }
}

/// The quant label of a set name: its last run of quant-like tokens.
fn label(name: &str) -> Option<String> {
    let base = name.rsplit('/').next().unwrap_or(name);
    let base = base
        .strip_suffix(".gguf")
        .or_else(|| base.strip_suffix(".GGUF"))
        .unwrap_or(base);
    let tokens: Vec<&str> = base.split(['-', '.']).collect();
    let end = tokens.iter().rposition(|t| quant_like(t).is_some())?;
    let mut start = end;
    // Whole quant tokens extend the run backwards (Q3_K_L-Q8); an underscore-joined one stands alone.
    if is_quant(tokens[end]) {
        while start > 0 && is_quant(tokens[start - 1]) {
            start -= 1;
        }
    }
    let mut parts: Vec<&str> = tokens[start..=end].to_vec();
    parts[0] = quant_like(parts[0])?;
    if is_quant(tokens[start]) && start > 0 && tokens[start - 1].eq_ignore_ascii_case("ud") {
        parts.insert(0, tokens[start - 1]);
    }
    Some(parts.join("-"))
}

/// The quant-like part of a token: the token itself, or the suffix after an underscore
/// (`70B_Q4_K_M` -> `Q4_K_M`).
fn quant_like(token: &str) -> Option<&str> {
    if is_quant(token) {
        return Some(token);
    }
    token
        .match_indices('_')
        .map(|(i, _)| &token[i + 1..])
        .find(|s| is_quant(s))
}

fn is_quant(t: &str) -> bool {
    let l = t.to_ascii_lowercase();
    if ["bf16", "f16", "f32", "f64", "fp16", "fp32"].contains(&l.as_str()) {
        return true;
    }
    let rest = ["iq", "tq", "q", "mxfp", "nvfp"]
        .iter()
        .find_map(|p| l.strip_prefix(p));
    let Some(rest) = rest else { return false };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return false;
    }
    let tail = &rest[digits..];
    tail.is_empty()
        || (tail.starts_with('_')
            && tail[1..]
                .split('_')
                .all(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_alphanumeric())))
}

/// A path from the registry that is safe to use in a URL and below a directory.
pub fn safe_path(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 1024
        && !path.starts_with('/')
        && !path.contains('\\')
        && !path.chars().any(char::is_control)
        && path
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(path: &str) -> RepoFile {
        RepoFile {
            path: path.into(),
            size: 1000,
            sha256: Some("a".repeat(64)),
        }
    }

    fn files(paths: &[&str]) -> Vec<RepoFile> {
        paths.iter().map(|p| f(p)).collect()
    }

    fn pick(paths: &[&str], quant: &str) -> Result<FileSet, SelectError> {
        select("o/r", &files(paths), Want::Quant(quant))
    }

    fn names(set: &FileSet) -> Vec<&str> {
        set.files.iter().map(|f| f.path.as_str()).collect()
    }

    #[test]
    fn labels_are_the_last_run_of_quant_tokens() {
        assert_eq!(label("Qwen3-32B-UD-Q4_K_XL").as_deref(), Some("UD-Q4_K_XL"));
        assert_eq!(
            label("qwen2.5-7b-instruct-q4_k_m").as_deref(),
            Some("q4_k_m")
        );
        assert_eq!(label("gemma-3-1b-it-f16.gguf").as_deref(), Some("f16"));
        assert_eq!(label("Model-Q4_K_M-fp16").as_deref(), Some("Q4_K_M-fp16"));
        assert_eq!(label("Model-Q3_K_L-Q8").as_deref(), Some("Q3_K_L-Q8"));
        assert_eq!(label("Llama3-Med42-70B_Q4_K_M").as_deref(), Some("Q4_K_M"));
        assert_eq!(label("grok-1-IQ3_XS-split").as_deref(), Some("IQ3_XS"));
        assert_eq!(label("Model.i1-IQ4_XS").as_deref(), Some("IQ4_XS"));
        assert_eq!(
            label("Llama-3.2-1B-Instruct-Q4_0_4_4").as_deref(),
            Some("Q4_0_4_4")
        );
        assert_eq!(label("BF16/Qwen3-32B-BF16").as_deref(), Some("BF16"));
        assert_eq!(label("model"), None);
        assert_eq!(label("QwQ-32B"), None);
    }

    #[test]
    fn q2_k_does_not_pick_q2_k_l_or_ud_q2_k_xl() {
        let repo = ["M-Q2_K_L.gguf", "M-UD-Q2_K_XL.gguf", "M-Q2_K.gguf"];
        assert_eq!(names(&pick(&repo, "Q2_K").unwrap()), ["M-Q2_K.gguf"]);
        assert_eq!(names(&pick(&repo, "q2_k_l").unwrap()), ["M-Q2_K_L.gguf"]);
        assert_eq!(
            names(&pick(&repo, "UD-Q2_K_XL").unwrap()),
            ["M-UD-Q2_K_XL.gguf"]
        );
        let err = pick(&["M-Q2_K_L.gguf", "M-UD-Q2_K_XL.gguf"], "Q2_K").unwrap_err();
        assert_eq!(err.reason(), "NoMatchingQuant");
    }

    #[test]
    fn ud_variant_is_distinct_from_the_base_quant() {
        let err = pick(&["M-UD-Q4_K_XL.gguf"], "Q4_K_XL").unwrap_err();
        assert_eq!(
            err.to_string(),
            "o/r has no file matching Q4_K_XL; it has: UD-Q4_K_XL"
        );
    }

    #[test]
    fn lowercase_split_shards_are_grouped_in_order() {
        let repo = [
            "m-q4_k_m-00002-of-00002.gguf",
            "m-q4_k_m-00001-of-00002.gguf",
            "m-q8_0.gguf",
        ];
        let set = pick(&repo, "Q4_K_M").unwrap();
        assert_eq!(set.kind, SetKind::Split { count: 2 });
        assert_eq!(set.name, "m-q4_k_m");
        assert_eq!(
            names(&set),
            [
                "m-q4_k_m-00001-of-00002.gguf",
                "m-q4_k_m-00002-of-00002.gguf"
            ]
        );
    }

    #[test]
    fn per_quant_folders_are_grouped() {
        let repo = [
            "BF16/M-BF16-00001-of-00002.gguf",
            "BF16/M-BF16-00002-of-00002.gguf",
            "M-Q8_0.gguf",
        ];
        let set = pick(&repo, "bf16").unwrap();
        assert_eq!(set.name, "BF16/M-BF16");
        assert_eq!(set.files.len(), 2);
        assert_eq!(set.total_bytes(), 2000);
    }

    #[test]
    fn a_missing_shard_is_named() {
        let err = pick(
            &["M-Q8_0-00001-of-00003.gguf", "M-Q8_0-00003-of-00003.gguf"],
            "Q8_0",
        )
        .unwrap_err();
        assert_eq!(err.reason(), "MissingShards");
        assert!(err.to_string().contains("shard(s) 2 are missing"), "{err}");
    }

    #[test]
    fn a_joined_file_is_preferred_over_a_split_copy() {
        let repo = [
            "M-Q8_0.gguf",
            "Q8_0/M-Q8_0-00001-of-00002.gguf",
            "Q8_0/M-Q8_0-00002-of-00002.gguf",
        ];
        let set = pick(&repo, "Q8_0").unwrap();
        assert_eq!(
            (set.kind, names(&set)),
            (SetKind::Single, vec!["M-Q8_0.gguf"])
        );
    }

    #[test]
    fn mmproj_and_imatrix_are_skipped() {
        let repo = [
            "mmproj-F16.gguf",
            "M-imatrix.gguf",
            "imatrix_unsloth.gguf",
            "M-F16.gguf",
            "mmproj-model-f16.gguf",
        ];
        assert_eq!(names(&pick(&repo, "F16").unwrap()), ["M-F16.gguf"]);
        assert_eq!(available_quants(&files(&repo)), ["F16"]);
        let err = select("o/r", &files(&repo), Want::File("mmproj-F16.gguf")).unwrap_err();
        assert_eq!(err.reason(), "NotWeights");
    }

    #[test]
    fn part_pieces_are_refused_with_the_reason() {
        let err = pick(&["M.Q8_0.gguf.part1of2", "M.Q8_0.gguf.part2of2"], "Q8_0").unwrap_err();
        assert_eq!(err.reason(), "UnsupportedParts");
        assert!(
            err.to_string()
                .contains("cannot load until they are concatenated"),
            "{err}"
        );
        // A proper file of the same quant is preferred over the pieces.
        let set = pick(
            &[
                "M.Q8_0.gguf.part1of2",
                "M.Q8_0.gguf.part2of2",
                "Q8_0/M-Q8_0-00001-of-00001.gguf",
            ],
            "Q8_0",
        )
        .unwrap();
        assert_eq!(set.kind, SetKind::Split { count: 1 });
    }

    #[test]
    fn no_gguf_says_llama_cpp_needs_gguf() {
        let err = pick(&["model.safetensors", "config.json", "README.md"], "Q4_K_M").unwrap_err();
        assert_eq!(err.reason(), "NoGGUF");
        assert!(err.to_string().contains("loads only GGUF"), "{err}");
    }

    #[test]
    fn file_by_exact_path_by_shard_or_by_set_name() {
        let repo = [
            "BF16/M-BF16-00001-of-00002.gguf",
            "BF16/M-BF16-00002-of-00002.gguf",
            "M-Q8_0.gguf",
            "README.md",
        ];
        let by = |f: &str| select("o/r", &files(&repo), Want::File(f));
        assert_eq!(names(&by("M-Q8_0.gguf").unwrap()), ["M-Q8_0.gguf"]);
        assert_eq!(by("BF16/M-BF16").unwrap().files.len(), 2);
        assert_eq!(
            by("BF16/M-BF16-00002-of-00002.gguf").unwrap().files.len(),
            2,
            "a shard names its whole set"
        );
        assert_eq!(by("README.md").unwrap_err().reason(), "NotGGUF");
        let err = by("M-Q4_K_M.gguf").unwrap_err();
        assert_eq!(
            err.to_string(),
            "o/r has no file or shard set named M-Q4_K_M.gguf; it has: BF16/M-BF16, M-Q8_0.gguf"
        );
    }

    #[test]
    fn two_files_with_one_label_are_ambiguous() {
        let err = pick(&["a/M-Q8_0.gguf", "b/M-Q8_0.gguf"], "Q8_0").unwrap_err();
        assert_eq!(err.reason(), "AmbiguousQuant");
    }

    #[test]
    fn a_file_without_sha256_is_refused() {
        let mut fs = files(&["M-Q8_0.gguf"]);
        fs[0].sha256 = None;
        assert_eq!(
            select("o/r", &fs, Want::Quant("Q8_0"))
                .unwrap_err()
                .reason(),
            "NoChecksum"
        );
    }

    #[test]
    fn unsafe_registry_paths_are_ignored() {
        let set = pick(
            &[
                "../evil-Q8_0.gguf",
                "/abs-Q8_0.gguf",
                "a//b-Q8_0.gguf",
                "ok-Q8_0.gguf",
            ],
            "Q8_0",
        )
        .unwrap();
        assert_eq!(names(&set), ["ok-Q8_0.gguf"]);
    }

    #[test]
    fn a_listing_of_thousands_of_odd_names_gives_an_answer() {
        let mut many: Vec<RepoFile> = (0..20_000)
            .map(|i| {
                f(&format!(
                    "d{}/M-Q{}_K-{:05}-of-20000.gguf",
                    i % 7,
                    i % 9,
                    i + 1
                ))
            })
            .collect();
        many.extend(
            [
                "x\u{0}-Q8_0.gguf",
                "é-Q8_0.GGUF",
                "-00001-of-00001.gguf",
                ".gguf",
                "sp ace-Q5_0.gguf",
            ]
            .map(f),
        );
        assert_eq!(pick_from(&many, "Q8_0").unwrap().name, "é-Q8_0.GGUF");
        let err = pick_from(&many, "Q4_K_M").unwrap_err();
        assert_eq!(err.reason(), "NoMatchingQuant");
    }

    fn pick_from(fs: &[RepoFile], quant: &str) -> Result<FileSet, SelectError> {
        select("o/r", fs, Want::Quant(quant))
    }
}
