//! The flags of `modelserve pull`, checked into a [`Plan`]: every flag that is wrong is named,
//! with its value and what would be valid, before anything is fetched.

use std::path::PathBuf;

use url::Url;

use super::PullError;
use crate::hub::check_repo;
use crate::hub::select::safe_path;
use crate::mirror::request::{MAX_FILE_SIZE, MAX_FILES};

/// Flags of `modelserve pull`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// The cluster's model mirror (`modelserve mirror`), for example http://modelserve-mirror:8090.
    #[arg(long)]
    pub mirror: String,
    /// Repository the files belong to, as owner/name.
    #[arg(long)]
    pub repo: String,
    /// The pinned commit (40 hex digits).
    #[arg(long)]
    pub commit: String,
    /// Directory the files go into (the pod's model volume).
    #[arg(long)]
    pub dest: PathBuf,
    /// A file to pull, as SHA256:SIZE:PATH (PATH relative, may contain '/'); repeat per file.
    #[arg(long = "file", required = true, value_name = "SHA256:SIZE:PATH")]
    pub files: Vec<String>,
    /// Seconds to wait for the mirror to accept a connection.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub connect_timeout: u64,
    /// Seconds without a byte from the mirror before a connection counts as stalled.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub stall_timeout: u64,
    /// Copies from scratch after a sha256 mismatch before giving up.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub attempts: u32,
    /// A file holding the token sent to the mirror as "Authorization: Bearer" (a projected ServiceAccount token for the mirror's audience), read again before each request so a rotated token is used.
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
}

/// One file to pull, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub sha256: String,
    pub size: u64,
    pub path: String,
}

/// The checked command line.
#[derive(Clone, Debug)]
pub struct Plan {
    pub mirror: Url,
    pub owner: String,
    pub name: String,
    pub commit: String,
    pub dest: PathBuf,
    pub files: Vec<Wanted>,
    pub token_file: Option<PathBuf>,
}

impl Plan {
    /// Checks every flag, naming the one that is wrong and what would be valid.
    pub fn new(args: &Args) -> Result<Plan, PullError> {
        let input = |flag, value: &str, why: &str| PullError::Input {
            flag,
            value: value.into(),
            why: why.into(),
        };
        let mirror = Url::parse(&args.mirror)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .filter(|u| u.query().is_none() && u.fragment().is_none())
            .ok_or_else(|| {
                input(
                    "--mirror",
                    &args.mirror,
                    "it must be an http(s) URL like http://modelserve-mirror:8090",
                )
            })?;
        let bad_repo = || {
            input(
                "--repo",
                &args.repo,
                "it must be owner/name, letters, digits, '-', '_' and '.' (for example bartowski/Qwen2.5-7B-Instruct-GGUF)",
            )
        };
        check_repo(&args.repo).map_err(|_| bad_repo())?;
        let (owner, name) = args.repo.split_once('/').ok_or_else(bad_repo)?;
        let commit = args.commit.to_ascii_lowercase();
        if !is_hex(&commit, 40) {
            return Err(input(
                "--commit",
                &args.commit,
                "it must be the pinned commit, 40 hex digits",
            ));
        }
        if args.dest.as_os_str().is_empty() {
            return Err(input("--dest", "", "it must name a directory"));
        }
        if args.attempts == 0 {
            return Err(input("--attempts", "0", "it must be at least 1"));
        }
        if args.files.len() > MAX_FILES {
            return Err(input(
                "--file",
                &format!("{} files", args.files.len()),
                &format!("at most {MAX_FILES} files per pull"),
            ));
        }
        let mut files: Vec<Wanted> = Vec::with_capacity(args.files.len());
        for spec in &args.files {
            let f = parse_file(spec)?;
            if files.iter().any(|g| g.path == f.path) {
                return Err(input("--file", spec, "this path is given more than once"));
            }
            files.push(f);
        }
        if files.is_empty() {
            return Err(input("--file", "", "give at least one SHA256:SIZE:PATH"));
        }
        Ok(Plan {
            mirror,
            owner: owner.into(),
            name: name.into(),
            commit,
            dest: args.dest.clone(),
            files,
            token_file: args.token_file.clone(),
        })
    }

    /// The mirror's URL of one file: `{mirror}/v1/files/{owner}/{name}/{commit}/{path}`, each
    /// segment percent-encoded (a path may hold any Unicode).
    pub fn url(&self, path: &str) -> Url {
        let mut u = self.mirror.clone();
        if let Ok(mut segs) = u.path_segments_mut() {
            segs.pop_if_empty()
                .extend(["v1", "files", &self.owner, &self.name, &self.commit])
                .extend(path.split('/'));
        }
        u
    }

    /// The mirror token, read now from `--token-file`; None without the flag.
    pub fn token(&self) -> Result<Option<String>, PullError> {
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        crate::mirror::auth::read_token_file(path)
            .map(Some)
            .map_err(|why| PullError::Token {
                path: path.display().to_string(),
                why,
            })
    }

    /// The first 12 digits of the commit, for messages.
    pub fn short_commit(&self) -> &str {
        self.commit.get(..12).unwrap_or(&self.commit)
    }

    /// Bytes of all files together.
    pub fn total_bytes(&self) -> u64 {
        self.files
            .iter()
            .fold(0u64, |a, f| a.saturating_add(f.size))
    }
}

fn is_hex(s: &str, n: usize) -> bool {
    s.len() == n && s.bytes().all(|c| c.is_ascii_hexdigit())
}

/// `SHA256:SIZE:PATH`, the form the operator writes into the init container's args.
pub fn parse_file(spec: &str) -> Result<Wanted, PullError> {
    let input = |why: &str| PullError::Input {
        flag: "--file",
        value: spec.into(),
        why: why.into(),
    };
    let mut parts = spec.splitn(3, ':');
    let (Some(sha), Some(size), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(input("it must be SHA256:SIZE:PATH"));
    };
    let sha256 = sha.to_ascii_lowercase();
    if !is_hex(&sha256, 64) {
        return Err(input("the sha256 must be 64 hex digits"));
    }
    let size: u64 = size
        .parse()
        .ok()
        .filter(|s| *s <= MAX_FILE_SIZE && size.bytes().all(|c| c.is_ascii_digit()))
        .ok_or_else(|| {
            input("the size must be a whole number of bytes, at most 70368744177664 (64 TiB)")
        })?;
    if !safe_path(path) {
        return Err(input(
            "the path must be relative, inside the destination, without '..' (for example Q4_K_M/model-00001-of-00002.gguf)",
        ));
    }
    Ok(Wanted {
        sha256,
        size,
        path: path.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    fn args(files: &[&str]) -> Args {
        Args {
            mirror: "http://mirror:8090".into(),
            repo: "acme/M-GGUF".into(),
            commit: COMMIT.into(),
            dest: "/models".into(),
            files: files.iter().map(|s| s.to_string()).collect(),
            connect_timeout: 10,
            stall_timeout: 30,
            attempts: 3,
            token_file: None,
        }
    }

    fn message(a: &Args) -> String {
        Plan::new(a).unwrap_err().to_string()
    }

    #[test]
    fn a_file_spec_splits_at_the_first_two_colons() {
        let f = parse_file(&format!("{}:1234:Q4_K_M/m:v2.gguf", SHA.to_uppercase())).unwrap();
        assert_eq!(
            f,
            Wanted {
                sha256: SHA.into(),
                size: 1234,
                path: "Q4_K_M/m:v2.gguf".into()
            }
        );
    }

    #[test]
    fn bad_file_specs_name_the_flag_the_value_and_what_is_valid() {
        for (spec, why) in [
            ("abc:12:m.gguf", "the sha256 must be 64 hex digits"),
            (
                &format!("{SHA}:12MB:m.gguf"),
                "the size must be a whole number",
            ),
            (
                &format!("{SHA}:-1:m.gguf"),
                "the size must be a whole number",
            ),
            (
                &format!("{SHA}:+12:m.gguf"),
                "the size must be a whole number",
            ),
            (
                &format!("{SHA}:18446744073709551615:m.gguf"),
                "the size must be a whole number of bytes, at most",
            ),
            (&format!("{SHA}:12:../m.gguf"), "the path must be relative"),
            (
                &format!("{SHA}:12:/etc/passwd"),
                "the path must be relative",
            ),
            (&format!("{SHA}:12:a/./m.gguf"), "the path must be relative"),
            (&format!("{SHA}:12:"), "the path must be relative"),
            (&format!("{SHA}:12"), "it must be SHA256:SIZE:PATH"),
            ("ж:12:m.gguf", "the sha256 must be 64 hex digits"),
        ] {
            let m = message(&args(&[spec]));
            assert!(m.starts_with(&format!("--file {spec:?}: {why}")), "{m}");
        }
    }

    #[test]
    fn bad_repo_commit_and_mirror_name_their_flag() {
        let f = format!("{SHA}:12:m.gguf");
        let mut a = args(&[&f]);
        a.repo = "acme".into();
        assert!(message(&a).starts_with("--repo \"acme\": it must be owner/name"));
        let mut a = args(&[&f]);
        a.commit = "main".into();
        assert!(message(&a).starts_with("--commit \"main\": it must be the pinned commit"));
        let mut a = args(&[&f]);
        a.commit = "ж".repeat(20);
        assert!(message(&a).starts_with("--commit \"жжж"));
        let mut a = args(&[&f]);
        a.mirror = "mirror:8090".into();
        assert!(message(&a).starts_with("--mirror \"mirror:8090\": it must be an http(s) URL"));
    }

    #[test]
    fn a_path_given_twice_or_too_many_files_are_refused() {
        let f = format!("{SHA}:12:m.gguf");
        assert!(message(&args(&[&f, &f])).contains("given more than once"));
        let many: Vec<String> = (0..=MAX_FILES)
            .map(|i| format!("{SHA}:1:m{i}.gguf"))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(message(&args(&many)).contains("at most 1000 files per pull"));
    }

    #[test]
    fn file_urls_keep_folders_and_escape_each_segment() {
        let f = format!("{SHA}:12:Q4 K/m#1.gguf");
        let mut a = args(&[&f]);
        a.mirror = "http://mirror:8090/base/".into();
        let p = Plan::new(&a).unwrap();
        assert_eq!(
            p.url("Q4 K/m#1.gguf").as_str(),
            format!("http://mirror:8090/base/v1/files/acme/M-GGUF/{COMMIT}/Q4%20K/m%231.gguf")
        );
        assert_eq!(
            p.url("модель/ф.gguf").as_str(),
            format!(
                "http://mirror:8090/base/v1/files/acme/M-GGUF/{COMMIT}/%D0%BC%D0%BE%D0%B4%D0%B5%D0%BB%D1%8C/%D1%84.gguf"
            )
        );
        assert_eq!(p.short_commit(), "0123456789ab");
    }

    #[test]
    fn sizes_add_up_without_overflow() {
        let big = format!("{SHA}:{MAX_FILE_SIZE}:a.gguf");
        let big2 = format!("{SHA}:{MAX_FILE_SIZE}:b.gguf");
        let p = Plan::new(&args(&[&big, &big2])).unwrap();
        assert_eq!(p.total_bytes(), 2 * MAX_FILE_SIZE);
    }
}
