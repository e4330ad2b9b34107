//! The quant label of a set name (`Q4_K_M`, `UD-Q4_K_XL`, `f16`, `Q3_K_L-Q8`) and the names
//! that are GGUF but not model weights (projectors, importance matrices, draft heads).
//!
//! Tokens are cut at ASCII separators only and compared ASCII-case-insensitively, so names in
//! any script are safe here; a token with a non-ASCII letter is simply not a quant.

use super::shapes::strip_suffix_ignore_case;

/// Float types written as a whole token.
const FLOATS: [&str; 6] = ["bf16", "f16", "f32", "f64", "fp16", "fp32"];
/// Prefixes of integer and micro-float quant names, followed by the bit count.
const PREFIXES: [&str; 5] = ["iq", "tq", "q", "mxfp", "nvfp"];

/// The quant label of a set name: its last run of quant-like tokens.
pub(super) fn label(name: &str) -> Option<String> {
    let base = name.rsplit('/').next().unwrap_or(name);
    let base = strip_suffix_ignore_case(base, ".gguf").unwrap_or(base);
    let tokens: Vec<&str> = base.split(['-', '.']).collect();
    let end = tokens.iter().rposition(|t| quant_like(t).is_some())?;
    let before = |i: usize| i.checked_sub(1).and_then(|p| tokens.get(p)).copied();
    let mut start = end;
    // Whole quant tokens extend the run backwards (Q3_K_L-Q8); an underscore-joined one stands alone.
    if tokens.get(end).is_some_and(|t| is_quant(t)) {
        while let Some(prev) = before(start)
            && is_quant(prev)
        {
            start -= 1;
        }
    }
    let (first, rest) = tokens.get(start..=end)?.split_first()?;
    let mut parts = vec![quant_like(first)?];
    parts.extend_from_slice(rest);
    if is_quant(first)
        && let Some(prev) = before(start)
        && prev.eq_ignore_ascii_case("ud")
    {
        parts.insert(0, prev);
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
        .filter_map(|(i, _)| token.get(i.checked_add(1)?..))
        .find(|s| is_quant(s))
}

/// A whole quant name: a float type, or a prefix, digits, and `_`-joined ASCII words.
fn is_quant(t: &str) -> bool {
    let l = t.to_ascii_lowercase();
    if FLOATS.contains(&l.as_str()) {
        return true;
    }
    let Some(rest) = PREFIXES.iter().find_map(|p| l.strip_prefix(p)) else {
        return false;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let Some(tail) = rest.get(digits..).filter(|_| digits > 0) else {
        return false;
    };
    tail.is_empty()
        || tail.strip_prefix('_').is_some_and(|words| {
            words
                .split('_')
                .all(|w| !w.is_empty() && w.bytes().all(|c| c.is_ascii_alphanumeric()))
        })
}

/// Why a GGUF set is not model weights, if it is not.
pub(super) fn non_weights(name: &str) -> Option<&'static str> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(label("UD-Q2_K_XL").as_deref(), Some("UD-Q2_K_XL"));
        assert_eq!(label("model"), None);
        assert_eq!(label("QwQ-32B"), None);
    }

    #[test]
    fn quant_tokens_next_to_other_scripts() {
        assert_eq!(label("Модель-Q4_K_M").as_deref(), Some("Q4_K_M"));
        assert_eq!(label("модель_Q8_0.gguf").as_deref(), Some("Q8_0"));
        assert_eq!(label("模型-UD-IQ2_XXS").as_deref(), Some("UD-IQ2_XXS"));
        assert_eq!(label("🦙.Q5_K_M.GGUF").as_deref(), Some("Q5_K_M"));
        assert_eq!(label("папка/x-f16").as_deref(), Some("f16"));
        // A letter of another script glued to the token makes it not a quant.
        assert_eq!(label("m-Q4_K_Mé"), None);
        assert_eq!(label("m-éQ4_K_M"), None);
        assert_eq!(label("m-Q4_K_M\u{301}"), None, "a combining mark");
        assert_eq!(label("m-Ｑ4_K_M"), None, "a fullwidth Q");
        assert_eq!(label("m-Q４_K"), None, "a fullwidth digit");
        assert_eq!(label("m-q4_é"), None);
        assert_eq!(label("é_"), None);
        assert_eq!(label("_"), None);
        assert_eq!(label(""), None);
    }

    #[test]
    fn non_weights_by_base_name() {
        assert!(non_weights("Модель/mmproj-F16").is_some());
        assert!(non_weights("MTP-модель").is_some());
        assert!(non_weights("ggml-vocab-模型").is_some());
        assert_eq!(
            non_weights("mmproj/Модель-F16"),
            None,
            "a folder name is not the file"
        );
    }
}
