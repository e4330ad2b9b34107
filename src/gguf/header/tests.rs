//! The parser against good, cut, hostile and random headers.

use super::super::bounds::KEPT_VALUES;
use super::write::{header, strings, u32s};
use super::*;

fn sample() -> Vec<u8> {
    header(
        &[
            ("general.architecture", Value::String("llama".into())),
            ("general.alignment", Value::U32(64)),
            ("llama.block_count", Value::U32(2)),
            ("llama.attention.head_count_kv", u32s(&[8, 0])),
            ("tokenizer.ggml.tokens", strings(&["a", "b", "é"])),
            ("x.i8", Value::I8(-3)),
            ("x.f64", Value::F64(1.5)),
            ("x.bool", Value::Bool(true)),
            ("x.u64", Value::U64(1 << 40)),
        ],
        &[
            ("token_embd.weight", &[64, 3], 1),
            ("output.weight", &[64, 3], 0),
        ],
    )
}

#[test]
fn every_value_type_round_trips() {
    let h = parse(&sample(), true).unwrap();
    assert_eq!(h.version, 3);
    assert_eq!(h.architecture(), Some("llama"));
    assert_eq!(h.get("llama.block_count").and_then(Value::as_u64), Some(2));
    assert_eq!(
        h.get("llama.attention.head_count_kv")
            .and_then(Value::items)
            .map(|i| i.len()),
        Some(2)
    );
    assert_eq!(
        h.get("tokenizer.ggml.tokens").and_then(Value::array_len),
        Some(3)
    );
    assert_eq!(h.get("x.i8"), Some(&Value::I8(-3)));
    assert_eq!(h.get("x.f64").and_then(Value::as_f64), Some(1.5));
    assert_eq!(h.get("x.u64").and_then(Value::as_u64), Some(1 << 40));
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.tensors[0].dims, [64, 3]);
    assert_eq!(h.alignment, 64);
    assert_eq!(h.data_offset % 64, 0);
    assert!(h.data_offset >= sample().len() as u64);
}

#[test]
fn a_prefix_asks_for_more_and_the_whole_file_parses() {
    let bytes = sample();
    for cut in [0, 3, 10, 40, bytes.len() - 1] {
        let e = parse(&bytes[..cut], false).unwrap_err();
        assert!(
            e.needs_more().is_some_and(|n| n > cut as u64),
            "cut {cut}: {e}"
        );
    }
    let e = parse(&bytes[..bytes.len() - 1], true).unwrap_err();
    assert!(e.to_string().contains("ends at byte"), "{e}");
}

#[test]
fn wrong_magic_html_and_versions_are_named() {
    assert_eq!(
        parse(b"<!DOCTYPE html><html>", true).unwrap_err(),
        GgufError::Html
    );
    assert!(matches!(
        parse(b"PK\x03\x04xxxxxxxx", true).unwrap_err(),
        GgufError::BadMagic(_)
    ));
    let mut v1 = sample();
    v1[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(parse(&v1, true).unwrap_err(), GgufError::Version1);
    let mut v9 = sample();
    v9[4..8].copy_from_slice(&9u32.to_le_bytes());
    assert_eq!(parse(&v9, true).unwrap_err(), GgufError::UnknownVersion(9));
    let mut be = sample();
    be[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert_eq!(parse(&be, true).unwrap_err(), GgufError::BigEndian);
}

/// A header with no keys and no tensors, its key count set to one, and `rest` after it.
fn one_key(rest: &[u8]) -> Vec<u8> {
    let mut b = header(&[], &[]);
    b[16..24].copy_from_slice(&1u64.to_le_bytes());
    b.extend(rest);
    b
}

/// The bounds error `bytes` fail with, checking that the refusal took well under a second.
fn refused(bytes: &[u8]) -> BoundsError {
    let start = std::time::Instant::now();
    let e = parse(bytes, false).unwrap_err();
    assert!(
        start.elapsed().as_secs_f64() < 1.0,
        "{e} took {:?}",
        start.elapsed()
    );
    assert_eq!(e.reason(), "InvalidHeader", "{e}");
    match e {
        GgufError::Bounds(b) => b,
        other => panic!("not a bounds error: {other:?}"),
    }
}

fn above(field: &str, value: u128, limit: u64, unit: &'static str) -> BoundsError {
    BoundsError::AboveLimit {
        field: field.into(),
        value,
        limit,
        unit,
    }
}

#[test]
fn two_pow_40_tensors_announced_are_refused_before_any_is_read() {
    let mut b = header(&[], &[]);
    b[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = refused(&b);
    assert_eq!(e, above("the tensor count", 1 << 40, 1 << 18, "tensors"));
    assert_eq!(
        e.to_string(),
        "the tensor count is 1099511627776, above the limit of 262144 tensors"
    );
}

#[test]
fn two_pow_40_metadata_keys_announced_are_refused() {
    let mut b = header(&[], &[]);
    b[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert_eq!(
        refused(&b),
        above("the metadata key count", 1 << 40, 1 << 16, "keys")
    );
}

#[test]
fn a_string_of_2_pow_63_bytes_is_refused_naming_its_key() {
    let mut rest = vec![];
    write::string(&mut rest, "general.name");
    rest.extend(8u32.to_le_bytes());
    rest.extend((1u64 << 63).to_le_bytes());
    let e = refused(&one_key(&rest));
    assert_eq!(
        e,
        above(
            "the length of the value of \"general.name\"",
            1 << 63,
            MAX_HEADER,
            "bytes"
        )
    );
    // A key's own length.
    let e = refused(&one_key(&(1u64 << 63).to_le_bytes()));
    assert_eq!(
        e,
        above("the length of metadata key #0", 1 << 63, 65_535, "bytes")
    );
}

#[test]
fn an_array_of_2_pow_62_elements_is_refused_naming_its_key() {
    let mut rest = vec![];
    write::string(&mut rest, "tokenizer.ggml.scores");
    rest.extend(9u32.to_le_bytes());
    rest.extend(6u32.to_le_bytes());
    rest.extend((1u64 << 62).to_le_bytes());
    let e = refused(&one_key(&rest));
    assert_eq!(
        e,
        above(
            "the length of array \"tokenizer.ggml.scores\"",
            1 << 62,
            1 << 24,
            "elements"
        )
    );
    assert!(e.to_string().contains("4611686018427387904"), "{e}");
}

#[test]
fn a_vocabulary_of_2_pow_40_tokens_announced_is_refused() {
    let tokens = Value::Array {
        value_type: 8,
        len: 1 << 40,
        items: None,
    };
    let b = header(&[("tokenizer.ggml.tokens", tokens)], &[]);
    assert_eq!(
        refused(&b),
        above(
            "the length of array \"tokenizer.ggml.tokens\"",
            1 << 40,
            1 << 24,
            "elements"
        )
    );
}

#[test]
fn an_array_longer_than_a_header_can_hold_is_refused_before_it_is_walked() {
    // 2^24 strings take at least 128 MiB: more than a header may be.
    let tokens = Value::Array {
        value_type: 8,
        len: 1 << 24,
        items: None,
    };
    let e = refused(&header(&[("tokenizer.ggml.tokens", tokens)], &[]));
    let BoundsError::AboveLimit { value, limit, .. } = e else {
        panic!("{e:?}");
    };
    assert_eq!((value, limit), (1 << 24, MAX_HEADER / 8));
}

#[test]
fn tensor_dims_whose_product_overflows_u64_are_refused_naming_the_tensor() {
    let max = u64::from(u32::MAX);
    let e = refused(&header(&[], &[("blk.0.ffn_up.weight", &[max, max, 2], 0)]));
    assert_eq!(
        e,
        above(
            "the element count of tensor \"blk.0.ffn_up.weight\"",
            u128::from(max) * u128::from(max) * 2,
            1 << 40,
            "elements"
        )
    );
    let e = refused(&header(&[], &[("t", &[3, u64::MAX], 0)]));
    assert_eq!(
        e,
        above(
            "dimension 1 of tensor \"t\"",
            u64::MAX.into(),
            u32::MAX.into(),
            "elements"
        )
    );
}

#[test]
fn a_tensor_of_2_pow_32_minus_1_dimensions_is_refused() {
    let mut b = header(&[], &[("t", &[1], 0)]);
    // The dimension count follows the name ("t": 8-byte length, 1 byte).
    b[33..37].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        refused(&b),
        above(
            "the dimension count of tensor \"t\"",
            u32::MAX.into(),
            4,
            "dimensions"
        )
    );
}

#[test]
fn only_the_first_kept_values_are_kept_and_the_rest_keep_their_length() {
    let long: Vec<u32> = (0..5000).collect();
    let short: Vec<u32> = (0..4000).collect();
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let mut kv: Vec<(&str, Value)> = vec![("long", u32s(&long))];
    kv.extend(keys.iter().map(|k| (k.as_str(), u32s(&short))));
    let h = parse(&header(&kv, &[]), true).unwrap();
    assert_eq!(
        h.get("long").and_then(Value::items),
        None,
        "longer than KEPT_ARRAY"
    );
    assert_eq!(h.get("long").and_then(Value::array_len), Some(5000));
    let kept = keys
        .iter()
        .filter(|k| h.get(k).and_then(Value::items).is_some())
        .count() as u64;
    assert_eq!(
        kept,
        KEPT_VALUES / 4000,
        "the header's budget of kept values"
    );
    assert!(
        keys.iter()
            .all(|k| h.get(k).and_then(Value::array_len) == Some(4000))
    );
}

#[test]
fn unknown_types_bad_bools_and_non_utf8_are_named() {
    let mut b = header(&[], &[]);
    b[16..24].copy_from_slice(&1u64.to_le_bytes());
    write::string(&mut b, "k");
    b.extend(77u32.to_le_bytes());
    assert_eq!(
        parse(&b, true).unwrap_err(),
        GgufError::UnknownValueType {
            key: "k".into(),
            value_type: 77
        }
    );

    let mut b = header(&[], &[]);
    b[16..24].copy_from_slice(&1u64.to_le_bytes());
    write::string(&mut b, "flag");
    b.extend(7u32.to_le_bytes());
    b.push(2);
    assert_eq!(
        parse(&b, true).unwrap_err(),
        GgufError::BadBool {
            key: "flag".into(),
            value: 2
        }
    );

    let mut b = header(&[], &[]);
    b[16..24].copy_from_slice(&1u64.to_le_bytes());
    b.extend(2u64.to_le_bytes());
    b.extend([0xff, 0xfe]);
    assert!(matches!(
        parse(&b, true).unwrap_err(),
        GgufError::NotUtf8 { .. }
    ));
}

#[test]
fn duplicate_keys_too_many_dims_and_bad_alignment_are_refused() {
    let dup = header(&[("a", Value::U8(1)), ("a", Value::U8(2))], &[]);
    assert_eq!(
        parse(&dup, true).unwrap_err(),
        GgufError::DuplicateKey("a".into())
    );
    let dims = header(&[], &[("t", &[1, 1, 1, 1, 1], 0)]);
    assert!(matches!(
        parse(&dims, true).unwrap_err(),
        GgufError::Bounds(BoundsError::AboveLimit {
            value: 5,
            limit: 4,
            ..
        })
    ));
    let align = header(&[("general.alignment", Value::U32(48))], &[]);
    let e = parse(&align, true).unwrap_err();
    assert!(matches!(e, GgufError::BadAlignment(_)));
    assert_eq!(e.reason(), "InvalidGGUF");
}

#[test]
fn random_bytes_never_panic() {
    let base = sample();
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for i in 0..20_000 {
        let mut b = base.clone();
        for _ in 0..(1 + i % 8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let at = (state % b.len() as u64) as usize;
            b[at] = (state >> 32) as u8;
        }
        let cut = (state >> 40) as usize % (b.len() + 1);
        let _ = parse(&b[..cut], i % 2 == 0);
    }
}
