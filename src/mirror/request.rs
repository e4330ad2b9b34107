//! What a client sends to `POST /v1/fetch` and gets back, and the checks every part of a
//! request passes before the mirror acts on it: a bounded body and number of files, and each
//! file named by a valid repository, pinned commit, safe path, sha256 and bounded size. An error
//! names the field (`files[2].commit`) and says what would be valid.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::store::FileRef;
use crate::hub::check_repo;
use crate::hub::select::safe_path;
use crate::secret::Secret;

/// Largest request body the mirror reads.
pub const MAX_BODY: usize = 1 << 20;
/// Most files one request may name.
pub const MAX_FILES: usize = 1000;
/// Largest file the mirror takes (64 TiB): far above any model file, and small enough that no
/// size arithmetic on it overflows.
pub const MAX_FILE_SIZE: u64 = 1 << 46;

const REPO_VALID: &str = "it must be owner/name: letters, digits, '-', '_' and '.', each part at most 96 characters that start and end with a letter or digit (for example bartowski/Qwen2.5-7B-Instruct-GGUF)";
const COMMIT_VALID: &str = "it must be the pinned commit, 40 lowercase hex digits";
const PATH_VALID: &str = "it must be a relative path inside the repository of at most 1024 bytes: no leading '/', no '\\', no empty, '.' or '..' segment, no control characters";
const SHA256_VALID: &str = "it must be the file's sha256, 64 lowercase hex digits";
const SIZE_VALID: &str =
    "it must be the file's size in bytes, a whole number from 0 to 70368744177664 (64 TiB)";

/// A fetch or status request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Request {
    pub files: Vec<FileRef>,
    /// Registry token for gated or private repositories; used for these files only, never
    /// printed (it serializes as the plain string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
}

/// The state of one file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileStatus {
    pub path: String,
    pub state: String,
    pub bytes_done: u64,
    pub size: u64,
    pub bytes_per_second: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The state of a whole request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub files: Vec<FileStatus>,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub bytes_per_second: u64,
}

/// A part of a request that is not valid: which field, what it held (shortened), and what
/// would be valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// Where in the request: `body`, `files`, `files[2].commit`, `token`, `Range`...
    pub field: String,
    /// What the field held, at most 120 characters; None when missing, or never shown (a token).
    pub value: Option<String>,
    pub why: String,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{} {v:?} is not valid: {}", self.field, self.why),
            None => write!(f, "{} is not valid: {}", self.field, self.why),
        }
    }
}

impl std::error::Error for Invalid {}

impl Invalid {
    pub fn new(field: impl Into<String>, value: Option<&str>, why: impl Into<String>) -> Invalid {
        Invalid {
            field: field.into(),
            value: value.map(shorten),
            why: why.into(),
        }
    }

    /// The same error for a field inside `outer` (`files[2]` + `commit`).
    pub fn within(mut self, outer: &str) -> Invalid {
        self.field = format!("{outer}.{}", self.field);
        self
    }

    /// The JSON body of the answer: `{"error": sentence, "field": ..., "valid": ...}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({ "error": self.to_string(), "field": self.field, "valid": self.why })
    }
}

/// At most 120 characters of `s` (cut at a character, never inside one).
fn shorten(s: &str) -> String {
    const MAX: usize = 120;
    match s.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}...", s.get(..at).unwrap_or_default()),
        None => s.to_string(),
    }
}

fn is_lower_hex(s: &str, n: usize) -> bool {
    s.len() == n && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// Checks where a file is: repository, commit and path (what a file URL names).
pub fn check_location(repo: &str, commit: &str, path: &str) -> Result<(), Invalid> {
    if check_repo(repo).is_err() {
        return Err(Invalid::new("repo", Some(repo), REPO_VALID));
    }
    if !is_lower_hex(commit, 40) {
        return Err(Invalid::new("commit", Some(commit), COMMIT_VALID));
    }
    if !safe_path(path) {
        return Err(Invalid::new("path", Some(path), PATH_VALID));
    }
    Ok(())
}

/// Checks one file of a request: anything that could escape the store, or that is not a
/// pinned, hashed file of a bounded size, is refused.
pub fn check_file(f: &FileRef) -> Result<(), Invalid> {
    check_location(&f.repo, &f.commit, &f.path)?;
    if !is_lower_hex(&f.sha256, 64) {
        return Err(Invalid::new("sha256", Some(&f.sha256), SHA256_VALID));
    }
    if f.size > MAX_FILE_SIZE {
        return Err(Invalid::new("size", Some(&f.size.to_string()), SIZE_VALID));
    }
    Ok(())
}

/// Checks a whole request: the number of files, then each file.
pub fn check(req: &Request) -> Result<(), Invalid> {
    if req.files.len() > MAX_FILES {
        return Err(too_many(req.files.len()));
    }
    for (i, f) in req.files.iter().enumerate() {
        check_file(f).map_err(|e| e.within(&format!("files[{i}]")))?;
    }
    Ok(())
}

fn too_many(n: usize) -> Invalid {
    Invalid::new(
        "files",
        Some(&format!("{n} files")),
        format!("a request names at most {MAX_FILES} files; ask for the rest in another request"),
    )
}

/// Reads a live set `{"sha256": ["<64 hex>", ...]}` of at most `most` digests, naming the first
/// one that is not valid.
pub fn parse_live(body: &[u8], most: usize) -> Result<std::collections::HashSet<String>, Invalid> {
    const SHAPE: &str =
        "it must be a JSON object {\"sha256\": [\"<64 lowercase hex digits>\", ...]}";
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Live {
        sha256: Vec<String>,
    }
    let live: Live = serde_json::from_slice(body)
        .map_err(|e| Invalid::new("body", Some(&e.to_string()), SHAPE))?;
    if live.sha256.len() > most {
        return Err(Invalid::new(
            "sha256",
            Some(&format!("{} digests", live.sha256.len())),
            format!("a live set names at most {most} digests"),
        ));
    }
    for (i, sha) in live.sha256.iter().enumerate() {
        if !is_lower_hex(sha, 64) {
            return Err(Invalid::new(
                format!("sha256[{i}]"),
                Some(sha),
                SHA256_VALID,
            ));
        }
    }
    Ok(live.sha256.into_iter().collect())
}

/// Reads a request body (already bounded by [`MAX_BODY`]), naming the first field that is
/// missing, of the wrong type or not valid.
pub fn parse(body: &[u8]) -> Result<Request, Invalid> {
    const SHAPE: &str = "it must be a JSON object {\"files\": [{\"repo\", \"commit\", \"path\", \"sha256\", \"size\"}, ...], \"token\": optional string}";
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| Invalid::new("body", Some(&e.to_string()), SHAPE))?;
    let Value::Object(top) = v else {
        return Err(Invalid::new("body", None, SHAPE));
    };
    let token = match top.get("token") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => Some(Secret::new(t.clone())),
        // Whatever it held is never echoed: it may be a credential.
        Some(_) => {
            return Err(Invalid::new(
                "token",
                None,
                "it must be a string (the registry token), or left out",
            ));
        }
    };
    let Some(Value::Array(items)) = top.get("files") else {
        return Err(Invalid::new(
            "files",
            None,
            "it must be a list of files, each {\"repo\", \"commit\", \"path\", \"sha256\", \"size\"}",
        ));
    };
    if items.len() > MAX_FILES {
        return Err(too_many(items.len()));
    }
    let files = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let at = format!("files[{i}]");
            let Value::Object(o) = item else {
                return Err(Invalid::new(
                    at,
                    None,
                    "it must be an object {\"repo\", \"commit\", \"path\", \"sha256\", \"size\"}",
                ));
            };
            let f = file(o).map_err(|e| e.within(&at))?;
            check_file(&f).map_err(|e| e.within(&at))?;
            Ok(f)
        })
        .collect::<Result<Vec<_>, Invalid>>()?;
    Ok(Request { files, token })
}

/// One file of a request, each field present and of its type.
fn file(o: &serde_json::Map<String, Value>) -> Result<FileRef, Invalid> {
    let text = |name: &str, valid: &str| match o.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(Invalid::new(name, None, format!("not a string; {valid}"))),
        None => Err(Invalid::new(name, None, format!("missing; {valid}"))),
    };
    let (repo, commit) = (text("repo", REPO_VALID)?, text("commit", COMMIT_VALID)?);
    let (path, sha256) = (text("path", PATH_VALID)?, text("sha256", SHA256_VALID)?);
    let size = match o.get("size") {
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| Invalid::new("size", Some(&n.to_string()), SIZE_VALID))?,
        Some(_) => {
            return Err(Invalid::new(
                "size",
                None,
                format!("not a number; {SIZE_VALID}"),
            ));
        }
        None => return Err(Invalid::new("size", None, format!("missing; {SIZE_VALID}"))),
    };
    Ok(FileRef {
        repo,
        commit,
        path,
        sha256,
        size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_set_is_digests_only_and_bounded() {
        let ok = format!("{{\"sha256\": [\"{}\"]}}", "a".repeat(64));
        assert_eq!(parse_live(ok.as_bytes(), 10).unwrap().len(), 1);
        let bad = parse_live(br#"{"sha256": ["../etc"]}"#, 10).unwrap_err();
        assert_eq!(bad.to_json()["field"], "sha256[0]");
        let many = format!("{{\"sha256\": [\"{0}\", \"{0}\"]}}", "b".repeat(64));
        assert!(parse_live(many.as_bytes(), 1).is_err());
        assert!(parse_live(br#"{"sha": []}"#, 10).is_err());
    }

    fn body(files: Value) -> Vec<u8> {
        serde_json::json!({ "files": files })
            .to_string()
            .into_bytes()
    }

    fn good() -> Value {
        serde_json::json!({
            "repo": "o/r", "commit": "a".repeat(40), "path": "Q4/m.gguf",
            "sha256": "b".repeat(64), "size": 3
        })
    }

    fn with(field: &str, value: Value) -> Value {
        let mut f = good();
        f[field] = value;
        f
    }

    fn refused(body: &[u8]) -> Invalid {
        parse(body).unwrap_err()
    }

    #[test]
    fn a_valid_request_parses_and_its_token_never_prints() {
        let mut b = serde_json::json!({ "files": [good()], "token": "hf_secret" });
        let r = parse(b.to_string().as_bytes()).unwrap();
        assert_eq!(r.files.len(), 1);
        assert_eq!(r.token.as_ref().map(Secret::expose), Some("hf_secret"));
        assert!(!format!("{r:?}").contains("hf_secret"));
        b["token"] = Value::Null;
        assert!(parse(b.to_string().as_bytes()).unwrap().token.is_none());
    }

    #[test]
    fn each_bad_field_is_named_with_what_would_be_valid() {
        for (file, field, valid) in [
            (
                with("commit", "main".into()),
                "files[0].commit",
                "40 lowercase hex",
            ),
            (
                with("commit", "A".repeat(40).into()),
                "files[0].commit",
                "40 lowercase hex",
            ),
            (with("repo", "a/..".into()), "files[0].repo", "owner/name"),
            (
                with("path", "../../etc/passwd".into()),
                "files[0].path",
                "relative path",
            ),
            (
                with("path", "a//b".into()),
                "files[0].path",
                "relative path",
            ),
            (
                with("path", "x\u{0}y".into()),
                "files[0].path",
                "control characters",
            ),
            (
                with("sha256", "B".repeat(64).into()),
                "files[0].sha256",
                "64 lowercase hex",
            ),
            (
                with("size", (MAX_FILE_SIZE + 1).into()),
                "files[0].size",
                "64 TiB",
            ),
            (with("size", (-1).into()), "files[0].size", "whole number"),
            (with("size", 1.5.into()), "files[0].size", "whole number"),
            (with("size", "12".into()), "files[0].size", "not a number"),
            (with("repo", 7.into()), "files[0].repo", "not a string"),
            (
                serde_json::json!({"repo": "o/r"}),
                "files[0].commit",
                "missing",
            ),
            (serde_json::json!("o/r"), "files[0]", "must be an object"),
        ] {
            let e = refused(&body(serde_json::json!([file, good()])));
            assert_eq!(e.field, field, "{e}");
            assert!(e.why.contains(valid), "{field}: {e}");
            assert!(e.to_string().contains("is not valid"), "{e}");
        }
    }

    #[test]
    fn a_body_that_is_not_a_request_is_refused_as_the_body() {
        for b in [&b"not json"[..], b"[]", b"{\"files\": 3}", b"\xff\xfe", b""] {
            let e = refused(b);
            assert!(e.field == "body" || e.field == "files", "{e}");
        }
        let e = refused(
            serde_json::json!({"files": [], "token": {"t": "hf_x"}})
                .to_string()
                .as_bytes(),
        );
        assert_eq!(e.field, "token");
        assert!(
            !e.to_string().contains("hf_x"),
            "a token is never echoed: {e}"
        );
    }

    #[test]
    fn more_files_than_a_request_may_name_are_refused_before_any_is_read() {
        let many = Value::Array(vec![good(); MAX_FILES + 1]);
        let e = refused(&body(many));
        assert_eq!(e.field, "files");
        assert!(e.why.contains("at most 1000 files"), "{e}");
        let r = Request {
            files: vec![],
            token: None,
        };
        assert!(check(&r).is_ok());
    }

    #[test]
    fn a_long_value_is_shortened_at_a_character_boundary() {
        let path = "ж".repeat(600);
        let e = refused(&body(serde_json::json!([with("path", path.into())])));
        let shown = e.value.unwrap();
        assert!(
            shown.ends_with("...") && shown.chars().count() == 123,
            "{shown}"
        );
    }
}
