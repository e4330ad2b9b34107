//! The catalog name rule, shared by every place that names a model.

/// Suggests the served name of a repository: the name part, without a GGUF suffix, lowercased,
/// restricted to `[a-z0-9._-]`, at most 63 characters.
/// `bartowski/Qwen2.5-7B-Instruct-GGUF` becomes `qwen2.5-7b-instruct`.
pub fn served_name(repo: &str) -> String {
    let name = repo.rsplit('/').next().unwrap_or(repo);
    let lower = name.to_ascii_lowercase();
    let base = ["-gguf", "_gguf", ".gguf"]
        .iter()
        .find_map(|s| lower.strip_suffix(s))
        .unwrap_or(&lower);
    let mut out = String::with_capacity(base.len());
    for c in base.chars() {
        let c = if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            c
        } else {
            '-'
        };
        if c == '-' && out.ends_with('-') {
            continue;
        }
        out.push(c);
    }
    out.truncate(63);
    let trimmed = out.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed.is_empty() {
        "model".to_string()
    } else {
        trimmed.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::served_name;

    #[test]
    fn strips_the_owner_and_the_gguf_suffix_and_lowercases() {
        assert_eq!(
            served_name("bartowski/Qwen2.5-7B-Instruct-GGUF"),
            "qwen2.5-7b-instruct"
        );
        assert_eq!(served_name("unsloth/Qwen3-0.6B-GGUF"), "qwen3-0.6b");
        assert_eq!(served_name("ggml-org/gemma-3-1b-it-GGUF"), "gemma-3-1b-it");
        assert_eq!(
            served_name("second-state/All-MiniLM-L6-v2-Embedding-GGUF"),
            "all-minilm-l6-v2-embedding"
        );
    }

    #[test]
    fn a_name_without_suffix_is_kept() {
        assert_eq!(served_name("ggml-org/models"), "models");
    }

    #[test]
    fn odd_characters_and_lengths_still_give_a_valid_name() {
        assert_eq!(served_name("a/__GGUF"), "model");
        let long = format!("a/{}", "x".repeat(200));
        assert_eq!(served_name(&long).len(), 63);
        assert_eq!(served_name("a/Foo+Bar  Baz-GGUF"), "foo-bar-baz");
    }
}
