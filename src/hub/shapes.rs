//! How one registry path takes part in a GGUF set: a single file, a gguf-split shard
//! (`-00001-of-00003.gguf`), a raw `.partNofM` piece, or nothing.
//!
//! Registry names are hostile and often not ASCII (Cyrillic, CJK, accents, emoji): every cut
//! here goes through `str::get` or `strip_*`, so a byte offset inside a character gives "no
//! match", never a panic.

/// The shard suffix without `.gguf`: `-00001-of-00003`.
const SHARD_SUFFIX_LEN: usize = 15;
/// Most raw pieces a `.partNofM` set may claim.
const MAX_PARTS: u32 = 1000;

/// The role of a path in a GGUF set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    Single,
    Shard { set: String, index: u32, count: u32 },
    Part { set: String, index: u32, count: u32 },
}

/// How a path takes part in a GGUF set, or None when it is not GGUF at all.
pub(super) fn shape(path: &str) -> Option<Shape> {
    if let Some(stem) = strip_suffix_ignore_case(path, ".gguf") {
        return Some(match shard_suffix(stem) {
            Some((set, index, count)) if (1..=count).contains(&index) => Shape::Shard {
                set: set.to_string(),
                index,
                count,
            },
            _ => Shape::Single,
        });
    }
    // Model.Q8_0.gguf.part1of2. ASCII lowercasing keeps every byte offset, so an offset found
    // in `lower` is one in `path` (and `get` refuses it if it were not).
    let lower = path.to_ascii_lowercase();
    let at = lower.rfind(".gguf.part")?;
    let set = path.get(..at.checked_add(".gguf".len())?)?;
    let tail = lower.get(at.checked_add(".gguf.part".len())?..)?;
    let (i, n) = tail.split_once("of")?;
    let (index, count) = (number(i)?, number(n)?);
    ((1..=count).contains(&index) && count <= MAX_PARTS).then(|| Shape::Part {
        set: set.to_string(),
        index,
        count,
    })
}

/// `name-00001-of-00003` -> (`name`, 1, 3); None for anything else, however it is encoded.
pub(super) fn shard_suffix(stem: &str) -> Option<(&str, u32, u32)> {
    let cut = stem.len().checked_sub(SHARD_SUFFIX_LEN)?;
    if cut == 0 {
        return None;
    }
    let (set, tail) = (stem.get(..cut)?, stem.get(cut..)?);
    let rest = tail.strip_prefix('-')?;
    let (index, of_count) = (rest.get(..5)?, rest.get(5..)?);
    let count = of_count.get(4..)?;
    if !of_count.get(..4)?.eq_ignore_ascii_case("-of-") || index.len() != 5 || count.len() != 5 {
        return None;
    }
    Some((set, number(index)?, number(count)?))
}

/// A decimal number written with ASCII digits only (`parse` alone would take `+1`).
fn number(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 9 || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `s` without `suffix`, compared ignoring ASCII case; None when `s` does not end with it.
pub(super) fn strip_suffix_ignore_case<'a>(s: &'a str, suffix: &str) -> Option<&'a str> {
    let at = s.len().checked_sub(suffix.len())?;
    s.get(at..)?
        .eq_ignore_ascii_case(suffix)
        .then(|| s.get(..at))
        .flatten()
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

    fn shard(set: &str, index: u32, count: u32) -> Option<Shape> {
        Some(Shape::Shard {
            set: set.into(),
            index,
            count,
        })
    }

    #[test]
    fn the_issue_12_name_is_a_single_file_not_a_panic() {
        // 16 bytes of stem: the 15-byte cut lands inside the second 'é'.
        assert_eq!(shape("xéééééééé.gguf"), Some(Shape::Single));
        assert_eq!(shard_suffix("xéééééééé"), None);
    }

    #[test]
    fn every_cut_through_a_multibyte_character_is_no_match() {
        // Stems of 15, 16 and 17 bytes whose shard-suffix window starts inside, on and after a
        // multibyte character: 2-byte é, 3-byte 模, 4-byte 🦙, and a combining mark (2 bytes).
        for stem in [
            "ééééééééééééééé", // 30 bytes, every odd cut inside a char
            "éééééééé",        // 16 bytes
            "xééééééé",        // 15 bytes: cut would be 0
            "模型模型模",      // 15 bytes
            "a模型模型模",     // 16 bytes, cut at 1 is a boundary but no suffix
            "🦙🦙🦙🦙",        // 16 bytes, cut at 1 is inside the llama
            "e\u{301}e\u{301}e\u{301}e\u{301}e\u{301}ab", // 17 bytes, cut inside a mark
            "é-00001-of-0000é",
            "x-0000é-of-00003",
            "x-00001-oé-00003",
        ] {
            assert_eq!(shard_suffix(stem), None, "{stem:?}");
            assert_eq!(
                shape(&format!("{stem}.gguf")),
                Some(Shape::Single),
                "{stem:?}"
            );
        }
    }

    #[test]
    fn non_ascii_set_names_keep_their_shard_suffix() {
        assert_eq!(
            shape("Модель-Q4_K_M-00002-of-00003.gguf"),
            shard("Модель-Q4_K_M", 2, 3)
        );
        assert_eq!(shape("é-00001-of-00003.gguf"), shard("é", 1, 3));
        assert_eq!(shape("🦙-00003-OF-00003.GGUF"), shard("🦙", 3, 3));
        assert_eq!(
            shape("模型/模型-F16-00001-of-00002.gguf"),
            shard("模型/模型-F16", 1, 2)
        );
        assert_eq!(
            shape("-00001-of-00003.gguf"),
            Some(Shape::Single),
            "no set name"
        );
        assert_eq!(
            shape("m-00004-of-00003.gguf"),
            Some(Shape::Single),
            "past the count"
        );
        assert_eq!(shape("m-00000-of-00003.gguf"), Some(Shape::Single));
        assert_eq!(shape("m-+0001-of-00003.gguf"), Some(Shape::Single));
    }

    #[test]
    fn parts_and_suffixes_are_char_safe() {
        assert_eq!(
            shape("Модель.Q8_0.gguf.part1of2"),
            Some(Shape::Part {
                set: "Модель.Q8_0.gguf".into(),
                index: 1,
                count: 2
            })
        );
        assert_eq!(shape("é.GGUF.PART2OF2").map(|_| ()), Some(()));
        for odd in [
            "é.gguf.partéofé",
            "é.gguf.part1of",
            "é.gguf.part+1of2",
            "é.gguf.part0of2",
            "x.gguf.part1of1001",
            "模.ggu",
            "é",
            "",
            ".gguf",
        ] {
            assert!(
                !matches!(shape(odd), Some(Shape::Part { .. })),
                "{odd:?}: {:?}",
                shape(odd)
            );
        }
        assert_eq!(strip_suffix_ignore_case("é.GgUf", ".gguf"), Some("é"));
        assert_eq!(strip_suffix_ignore_case("éé", ".gguf"), None);
        assert_eq!(
            strip_suffix_ignore_case("模型", "ab"),
            None,
            "cut inside 型"
        );
    }

    #[test]
    fn unsafe_paths_are_refused() {
        for bad in ["", "/a", "a//b", "a/../b", "./a", "a\\b", "a\u{0}b", "a\nb"] {
            assert!(!safe_path(bad), "{bad:?}");
        }
        assert!(!safe_path(&"é".repeat(513)), "over 1024 bytes");
        for good in ["a", "папка/модель.gguf", "模型/🦙 x.gguf", "e\u{301}.gguf"] {
            assert!(safe_path(good), "{good:?}");
        }
    }
}
