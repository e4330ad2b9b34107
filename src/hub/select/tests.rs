//! Selection on small hand-written listings: quant matching, shards, refusals, and names in
//! every script.

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

#[test]
fn cyrillic_shards_are_grouped_in_order_and_chosen() {
    let repo = [
        "Модели/Модель-Q4_K_M-00003-of-00003.gguf",
        "Модели/Модель-Q4_K_M-00001-of-00003.gguf",
        "Модели/Модель-Q4_K_M-00002-of-00003.gguf",
        "Модели/Модель-Q8_0.gguf",
        "xéééééééé.gguf",
        "README.md",
    ];
    let set = pick(&repo, "q4_k_m").unwrap();
    assert_eq!(set.name, "Модели/Модель-Q4_K_M");
    assert_eq!(set.label.as_deref(), Some("Q4_K_M"));
    assert_eq!(set.kind, SetKind::Split { count: 3 });
    assert_eq!(
        names(&set),
        [
            "Модели/Модель-Q4_K_M-00001-of-00003.gguf",
            "Модели/Модель-Q4_K_M-00002-of-00003.gguf",
            "Модели/Модель-Q4_K_M-00003-of-00003.gguf",
        ]
    );
    let by = |f: &str| select("o/r", &files(&repo), Want::File(f));
    assert_eq!(by("Модели/Модель-Q4_K_M").unwrap().files.len(), 3);
    assert_eq!(by("Модели/Модель-Q4_K_M.gguf").unwrap().files.len(), 3);
    assert_eq!(
        names(&by("xéééééééé.gguf").unwrap()),
        ["xéééééééé.gguf"],
        "the issue 12 name is a single file"
    );
    assert_eq!(
        available_quants(&files(&repo)),
        ["Q4_K_M", "Q8_0", "xéééééééé.gguf"]
    );
}

#[test]
fn names_in_every_script_select_and_report_without_panicking() {
    let repo = [
        "模型/模型-F16-00001-of-00002.gguf",
        "模型/模型-F16-00002-of-00002.gguf",
        "🦙-Q5_K_M.gguf",
        "e\u{301}e\u{301}-Q6_K.gguf",
        "Ελληνικά-00001-of-00002.gguf",
        "mmproj-модель-f16.gguf",
        "é.gguf.part1of2",
        "é.gguf.part2of2",
    ];
    assert_eq!(pick(&repo, "F16").unwrap().files.len(), 2);
    assert_eq!(names(&pick(&repo, "q5_k_m").unwrap()), ["🦙-Q5_K_M.gguf"]);
    assert_eq!(
        names(&pick(&repo, "Q6_K").unwrap()),
        ["e\u{301}e\u{301}-Q6_K.gguf"]
    );
    let missing = select("o/r", &files(&repo), Want::File("Ελληνικά")).unwrap_err();
    assert_eq!(missing.reason(), "MissingShards");
    assert!(
        missing.to_string().contains("Ελληνικά has 2 shards"),
        "{missing}"
    );
    let parts = select("o/r", &files(&repo), Want::File("é.gguf")).unwrap_err();
    assert_eq!(parts.reason(), "UnsupportedParts");
    let none = pick(&repo, "Q4_K_M").unwrap_err();
    assert_eq!(
        none.to_string(),
        "o/r has no file matching Q4_K_M; it has: F16, Q5_K_M, Q6_K, é.gguf, Ελληνικά"
    );
}

#[test]
fn a_refusal_lists_at_most_forty_names() {
    let many: Vec<String> = (0..100)
        .map(|i| format!("м{i}-Q{}_K.gguf", i + 2))
        .collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    let err = pick(&refs, "Q1_K").unwrap_err().to_string();
    assert!(err.ends_with("and 60 more"), "{err}");
}

fn pick_from(fs: &[RepoFile], quant: &str) -> Result<FileSet, SelectError> {
    select("o/r", fs, Want::Quant(quant))
}
