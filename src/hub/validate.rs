//! Checks on what goes into a registry URL (repository, revision, endpoint, file path), done
//! before any request, and the per-segment encoding of paths.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use url::Url;

use super::HubError;
use super::shapes::safe_path;

/// Characters kept as they are when a revision or a path segment goes into a URL.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');

/// Checks an `owner/name` repository id before it goes into a URL.
pub fn check_repo(repo: &str) -> Result<(), HubError> {
    let part_ok = |p: &str| {
        let b = p.as_bytes();
        !p.is_empty()
            && p.len() <= 96
            && p.bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && b.first().is_some_and(u8::is_ascii_alphanumeric)
            && b.last().is_some_and(u8::is_ascii_alphanumeric)
    };
    match repo.split_once('/') {
        Some((o, n)) if part_ok(o) && part_ok(n) && !n.contains("..") => Ok(()),
        _ => Err(HubError::InvalidInput {
            what: "repository",
            value: repo.into(),
            why: "it must be owner/name, letters, digits, '-', '_' and '.' (for example bartowski/Qwen2.5-7B-Instruct-GGUF)",
        }),
    }
}

/// Checks a revision (branch, tag or commit) before it goes into a URL.
pub fn check_revision(rev: &str) -> Result<(), HubError> {
    let ok = !rev.is_empty()
        && rev.len() <= 255
        && !rev.contains("..")
        && rev
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'/'));
    if ok {
        Ok(())
    } else {
        Err(HubError::InvalidInput {
            what: "revision",
            value: rev.into(),
            why: "it must be a branch, tag or commit: letters, digits, '-', '_', '.', '/', no '..'",
        })
    }
}

/// Checks a file path of a repository and encodes it for a URL, segment by segment (so `/`
/// stays a separator and every other byte of a non-ASCII name is percent-encoded).
pub(super) fn encode_path(path: &str) -> Result<String, HubError> {
    if !safe_path(path) {
        return Err(HubError::InvalidInput {
            what: "file path",
            value: path.into(),
            why: "it must be a relative path without '..'",
        });
    }
    let encoded: Vec<String> = path
        .split('/')
        .map(|s| utf8_percent_encode(s, SEGMENT).to_string())
        .collect();
    Ok(encoded.join("/"))
}

/// A revision as one URL path segment.
pub(super) fn encode_revision(rev: &str) -> String {
    utf8_percent_encode(rev, SEGMENT).to_string()
}

/// The registry endpoint as a base URL ending in `/`.
pub(super) fn parse_endpoint(endpoint: &str) -> Result<Url, HubError> {
    let invalid = || HubError::InvalidInput {
        what: "registry endpoint",
        value: endpoint.into(),
        why: "it must be an http(s) URL such as https://huggingface.co",
    };
    let trimmed = endpoint.trim().trim_end_matches('/');
    let url = Url::parse(&format!("{trimmed}/")).map_err(|_| invalid())?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() || url.query().is_some() {
        return Err(invalid());
    }
    Ok(url)
}

pub(super) fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|c| c.is_ascii_hexdigit())
}

pub(super) fn url_problem(e: url::ParseError) -> &'static str {
    match e {
        url::ParseError::EmptyHost => "empty host",
        url::ParseError::InvalidPort => "invalid port",
        _ => "not a valid URL",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_and_revision_are_validated_before_any_url() {
        assert!(check_repo("bartowski/Qwen2.5-7B-Instruct-GGUF").is_ok());
        for bad in [
            "noslash",
            "a/b/c",
            "../x",
            "a/..",
            "a/b?x=1",
            "a/b#f",
            "a /b",
            "/b",
            "a/",
            "-a/b",
            "é/b",
            "a/模型",
            "a/b\u{301}",
            "",
        ] {
            let e = check_repo(bad).unwrap_err();
            assert!(e.to_string().contains("must be owner/name"), "{bad}: {e}");
        }
        assert!(check_revision("main").is_ok());
        assert!(check_revision("refs/pr/1").is_ok());
        for bad in ["", "a..b", "x?y", "x y", "a%2F", "ветка"] {
            assert_eq!(
                check_revision(bad).unwrap_err().reason(),
                "InvalidSpec",
                "{bad}"
            );
        }
    }

    #[test]
    fn endpoint_must_be_an_http_url() {
        assert_eq!(
            parse_endpoint("https://huggingface.co/").unwrap().as_str(),
            "https://huggingface.co/"
        );
        assert_eq!(
            parse_endpoint("http://hub.internal:8080/mirror")
                .unwrap()
                .as_str(),
            "http://hub.internal:8080/mirror/"
        );
        for bad in [
            "huggingface.co",
            "ftp://x",
            "http://",
            "https://x/?a=b",
            "é",
        ] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn non_ascii_paths_are_encoded_per_segment() {
        assert_eq!(
            encode_path("Модели/м v#1.gguf").unwrap(),
            "%D0%9C%D0%BE%D0%B4%D0%B5%D0%BB%D0%B8/%D0%BC%20v%231.gguf"
        );
        assert_eq!(
            encode_path("🦙/e\u{301}.gguf").unwrap(),
            "%F0%9F%A6%99/e%CC%81.gguf"
        );
        for bad in ["../x", "a//b", "/a", "a\\b"] {
            assert_eq!(
                encode_path(bad).unwrap_err().reason(),
                "InvalidSpec",
                "{bad}"
            );
        }
    }
}
