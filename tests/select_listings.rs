//! File-set selection on real repository listings (tests/fixtures/hf-listings.json, copied from
//! the Hub at pinned commits).

use modelserve::hub::select::{RepoFile, SetKind, Want, available_quants, select};

fn listing(repo: &str) -> Vec<RepoFile> {
    let data: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/hf-listings.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let r = data["repos"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["repo"] == repo)
        .expect("listing in the fixture");
    r["files"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let size = f["size"].as_u64();
            RepoFile {
                path: f["path"].as_str().unwrap().into(),
                size: size.unwrap_or(100),
                // Files with a size are LFS objects on the Hub; the others are small git files.
                sha256: size.map(|_| format!("{i:064x}")),
            }
        })
        .collect()
}

fn chosen(repo: &str, quant: &str) -> Vec<String> {
    let set = select(repo, &listing(repo), Want::Quant(quant))
        .unwrap_or_else(|e| panic!("{repo} {quant}: {e}"));
    set.files.into_iter().map(|f| f.path).collect()
}

fn refused(repo: &str, quant: &str) -> String {
    select(repo, &listing(repo), Want::Quant(quant))
        .unwrap_err()
        .to_string()
}

#[test]
fn gemma_3_1b_single_files_and_lowercase_f16() {
    let r = "ggml-org/gemma-3-1b-it-GGUF";
    assert_eq!(chosen(r, "Q4_K_M"), ["gemma-3-1b-it-Q4_K_M.gguf"]);
    assert_eq!(chosen(r, "Q8_0"), ["gemma-3-1b-it-Q8_0.gguf"]);
    assert_eq!(chosen(r, "F16"), ["gemma-3-1b-it-f16.gguf"]);
    assert_eq!(
        refused(r, "Q2_K"),
        "ggml-org/gemma-3-1b-it-GGUF has no file matching Q2_K; it has: F16, Q4_K_M, Q8_0"
    );
}

#[test]
fn qwen25_7b_sharded_lowercase_sets() {
    let r = "Qwen/Qwen2.5-7B-Instruct-GGUF";
    assert_eq!(
        chosen(r, "Q4_K_M"),
        [
            "qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf",
            "qwen2.5-7b-instruct-q4_k_m-00002-of-00002.gguf"
        ]
    );
    assert_eq!(chosen(r, "q8_0").len(), 3);
    assert_eq!(chosen(r, "Q2_K"), ["qwen2.5-7b-instruct-q2_k.gguf"]);
    assert_eq!(chosen(r, "Q4_0").len(), 2);
    assert_eq!(chosen(r, "FP16").len(), 4);
    let set = select(r, &listing(r), Want::Quant("Q4_K_M")).unwrap();
    assert_eq!(set.kind, SetKind::Split { count: 2 });
    assert_eq!(set.total_bytes(), 3_993_201_344 + 689_872_288);
    assert_eq!(
        refused(r, "IQ4_XS"),
        "Qwen/Qwen2.5-7B-Instruct-GGUF has no file matching IQ4_XS; it has: FP16, Q2_K, Q3_K_M, Q4_0, Q4_K_M, Q5_0, Q5_K_M, Q6_K, Q8_0"
    );
}

#[test]
fn qwen3_32b_base_quants_are_not_confused_with_ud_or_l_variants() {
    let r = "unsloth/Qwen3-32B-GGUF";
    assert_eq!(chosen(r, "Q2_K"), ["Qwen3-32B-Q2_K.gguf"]);
    assert_eq!(chosen(r, "Q2_K_L"), ["Qwen3-32B-Q2_K_L.gguf"]);
    assert_eq!(chosen(r, "UD-Q2_K_XL"), ["Qwen3-32B-UD-Q2_K_XL.gguf"]);
    assert_eq!(chosen(r, "Q4_K_M"), ["Qwen3-32B-Q4_K_M.gguf"]);
    assert_eq!(chosen(r, "IQ4_XS"), ["Qwen3-32B-IQ4_XS.gguf"]);
    assert_eq!(chosen(r, "ud-iq1_m"), ["Qwen3-32B-UD-IQ1_M.gguf"]);
    assert_eq!(
        chosen(r, "BF16"),
        [
            "BF16/Qwen3-32B-BF16-00001-of-00002.gguf",
            "BF16/Qwen3-32B-BF16-00002-of-00002.gguf"
        ]
    );
    assert!(refused(r, "Q4_K_XL").contains("it has: BF16, IQ4_NL, IQ4_XS, Q2_K, Q2_K_L,"));
    assert!(refused(r, "Q4_K_XL").contains("UD-Q4_K_XL"));
}

#[test]
fn llama_32_1b_arm_variants_are_distinct_from_q4_0() {
    let r = "bartowski/Llama-3.2-1B-Instruct-GGUF";
    assert_eq!(chosen(r, "Q4_0"), ["Llama-3.2-1B-Instruct-Q4_0.gguf"]);
    assert_eq!(
        chosen(r, "Q4_0_4_4"),
        ["Llama-3.2-1B-Instruct-Q4_0_4_4.gguf"]
    );
    assert_eq!(chosen(r, "Q4_K_M"), ["Llama-3.2-1B-Instruct-Q4_K_M.gguf"]);
    assert_eq!(chosen(r, "Q4_K_L"), ["Llama-3.2-1B-Instruct-Q4_K_L.gguf"]);
    assert_eq!(chosen(r, "IQ3_M"), ["Llama-3.2-1B-Instruct-IQ3_M.gguf"]);
    assert_eq!(chosen(r, "f16"), ["Llama-3.2-1B-Instruct-f16.gguf"]);
    assert!(refused(r, "Q2_K").starts_with("bartowski/Llama-3.2-1B-Instruct-GGUF has no file matching Q2_K; it has: F16, IQ3_M, IQ4_XS, Q3_K_L, Q3_K_XL, Q4_0, Q4_0_4_4,"));
}

#[test]
fn qwen3_06b_q2_k_and_q2_k_l_are_two_files() {
    let r = "unsloth/Qwen3-0.6B-GGUF";
    assert_eq!(chosen(r, "Q2_K"), ["Qwen3-0.6B-Q2_K.gguf"]);
    assert_eq!(chosen(r, "Q2_K_L"), ["Qwen3-0.6B-Q2_K_L.gguf"]);
    assert_eq!(chosen(r, "BF16"), ["Qwen3-0.6B-BF16.gguf"]);
    assert_eq!(chosen(r, "UD-Q8_K_XL"), ["Qwen3-0.6B-UD-Q8_K_XL.gguf"]);
    assert_eq!(chosen(r, "IQ4_NL"), ["Qwen3-0.6B-IQ4_NL.gguf"]);
    assert!(refused(r, "Q8_K_XL").contains("UD-Q8_K_XL"));
}

#[test]
fn minilm_names_its_f16_after_ggml_model() {
    let r = "second-state/All-MiniLM-L6-v2-Embedding-GGUF";
    assert_eq!(chosen(r, "F16"), ["all-MiniLM-L6-v2-ggml-model-f16.gguf"]);
    assert_eq!(chosen(r, "Q4_K_M"), ["all-MiniLM-L6-v2-Q4_K_M.gguf"]);
    assert_eq!(chosen(r, "Q3_K_L"), ["all-MiniLM-L6-v2-Q3_K_L.gguf"]);
    assert!(refused(r, "BF16").contains("it has: F16, Q2_K, Q3_K_L"));
}

#[test]
fn every_listing_offers_its_quants_in_a_stable_order() {
    for repo in [
        "ggml-org/gemma-3-1b-it-GGUF",
        "unsloth/Qwen3-32B-GGUF",
        "unsloth/Qwen3-0.6B-GGUF",
    ] {
        let mut files = listing(repo);
        let a = available_quants(&files);
        files.reverse();
        assert_eq!(
            a,
            available_quants(&files),
            "{repo}: the order must not depend on the listing's order"
        );
        for q in &a {
            select(repo, &listing(repo), Want::Quant(q))
                .unwrap_or_else(|e| panic!("{repo} offers {q} but cannot select it: {e}"));
        }
    }
}
