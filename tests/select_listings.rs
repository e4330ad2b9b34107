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

/// The synthetic non-ASCII listing the fake Hub serves (tests/fixtures/synthetic-listings.json).
fn unicode_listing() -> Vec<RepoFile> {
    let data: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/synthetic-listings.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let r = data["repos"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["repo"] == "modelserve-test/unicode-names-GGUF")
        .unwrap();
    r["files"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, f)| RepoFile {
            path: f["path"].as_str().unwrap().into(),
            size: f["size"].as_u64().unwrap_or(100),
            sha256: f["size"].as_u64().map(|_| format!("{i:064x}")),
        })
        .collect()
}

#[test]
fn a_listing_in_many_scripts_offers_and_selects_every_quant() {
    let files = unicode_listing();
    let quants = available_quants(&files);
    assert_eq!(
        quants,
        ["F16", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "xéééééééé.gguf"]
    );
    let set = select("u/r", &files, Want::Quant("Q4_K_M")).unwrap();
    assert_eq!(set.kind, SetKind::Split { count: 3 });
    assert_eq!(set.name, "Модели/Модель-Q4_K_M");
    assert_eq!(
        select("u/r", &files, Want::Quant("F16")).unwrap().files[0].path,
        "模型-F16.gguf",
        "the projector's f16 is not weights"
    );
    assert_eq!(
        select("u/r", &files, Want::File("xéééééééé.gguf"))
            .unwrap()
            .files[0]
            .path,
        "xéééééééé.gguf"
    );
}

/// A small deterministic generator (xorshift64*), so a failure names the seed that found it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }
}

/// A name built from the pieces the selection cuts at, glued to characters of many widths.
fn random_name(rng: &mut Rng) -> String {
    const PIECES: [&str; 34] = [
        "é",
        "ё",
        "Модель",
        "模型",
        "🦙",
        "e\u{301}",
        "\u{200d}",
        "Ω",
        "ß",
        "İ",
        "ﬁ",
        "Ｑ4",
        "a",
        "Q4_K_M",
        "q8_0",
        "UD-",
        "IQ2_XXS",
        "f16",
        "BF16",
        "_",
        "-",
        ".",
        "/",
        "..",
        "-00001-of-00003",
        "-00003-of-00003",
        "-0000é-of-00003",
        ".gguf",
        ".GGUF",
        ".gguf.part1of2",
        "mmproj-",
        "imatrix",
        " ",
        "of",
    ];
    let len = 1 + rng.next() % 8;
    let mut name = String::new();
    for _ in 0..len {
        name.push_str(rng.pick(&PIECES));
        // Now and then a random character from anywhere in Unicode.
        if rng.next().is_multiple_of(5)
            && let Some(c) = char::from_u32((rng.next() % 0x2_0000) as u32)
        {
            name.push(c);
        }
    }
    if !rng.next().is_multiple_of(3) {
        name.push_str(rng.pick(&[".gguf", "-00001-of-00002.gguf", "-00002-of-00002.gguf"]));
    }
    name
}

#[test]
fn thousands_of_random_unicode_names_never_panic_and_choose_only_listed_files() {
    let quants = ["Q4_K_M", "q8_0", "F16", "UD-IQ2_XXS", "BF16", "é", "Модель"];
    let mut chosen = 0;
    for seed in 1..=300u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let files: Vec<RepoFile> = (0..20 + rng.next() % 30)
            .map(|i| RepoFile {
                path: random_name(&mut rng),
                size: rng.next() % 1000,
                sha256: (i % 7 != 0).then(|| "a".repeat(64)),
            })
            .collect();
        let offered = available_quants(&files);
        let mut wants: Vec<Want> = quants.iter().map(|q| Want::Quant(q)).collect();
        wants.extend(offered.iter().map(|q| Want::Quant(q)));
        wants.extend(files.iter().take(5).map(|f| Want::File(&f.path)));
        for want in wants {
            let Ok(set) = select("r/p", &files, want) else {
                continue;
            };
            chosen += 1;
            assert!(!set.files.is_empty(), "seed {seed}: {want:?} chose nothing");
            for f in &set.files {
                assert!(
                    files.contains(f),
                    "seed {seed}: {want:?} chose {f:?}, which is not in the listing"
                );
            }
        }
    }
    assert!(
        chosen > 300,
        "the generator must produce selectable sets: {chosen}"
    );
}
