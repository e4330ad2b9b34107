//! The GGUF header: a bounded, panic-free parser over a byte prefix of the file.
//!
//! `parse` reads from the start of a buffer that may hold only part of the file. When it runs
//! out of bytes it says how many it needs, and the caller fetches more and parses again; so a
//! reader over HTTP grows its ranges without ever asking for the tensor data. Every count and
//! length is checked against what the header could possibly hold before anything is allocated.

use std::collections::BTreeMap;

/// No header this operator reads may be larger; real ones stay under 16 MiB.
pub const MAX_HEADER: u64 = 64 << 20;
const MAX_TENSORS: u64 = 1 << 20;
const MAX_KEYS: u64 = 1 << 20;
const MAX_DIMS: u32 = 4;
const MAX_NESTING: u32 = 3;
/// Arrays up to this many numbers are kept; longer ones keep only their length.
const KEPT_ARRAY: u64 = 1 << 16;

/// Why a header cannot be read; each names what was wrong and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GgufError {
    #[error("not a GGUF file: the server sent an HTML page instead of the file's bytes")]
    Html,
    #[error("not a GGUF file: it starts with {0:02x?} instead of the magic \"GGUF\"")]
    BadMagic([u8; 4]),
    #[error(
        "GGUF version 1 is not supported by any current llama.cpp build (it was dropped in b1472); convert the model again"
    )]
    Version1,
    #[error("GGUF version {0} is unknown (versions 2 and 3 exist)")]
    UnknownVersion(u32),
    #[error("the file is big-endian; llama.cpp on x86 and ARM loads only little-endian GGUF")]
    BigEndian,
    #[error("the file ends at byte {len}, inside its header (needs at least {needed} bytes)")]
    Truncated { needed: u64, len: u64 },
    #[error("the header is larger than {max} bytes; it is refused rather than read")]
    TooLarge { max: u64 },
    #[error("{what} is {value}, more than the header can hold")]
    Absurd { what: String, value: u64 },
    #[error("{what} is not valid UTF-8")]
    NotUtf8 { what: String },
    #[error("metadata key {key:?} has value type {value_type}, which GGUF does not define")]
    UnknownValueType { key: String, value_type: u32 },
    #[error("metadata key {key:?} holds a bool that is neither 0 nor 1 ({value})")]
    BadBool { key: String, value: u8 },
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    #[error("a metadata key is empty")]
    EmptyKey,
    #[error("general.alignment must be a power-of-two u32, not {0}")]
    BadAlignment(String),
    #[error("tensor {name:?} has {dims} dimensions; GGUF allows at most 4")]
    TooManyDims { name: String, dims: u32 },
    #[error("tensor {name:?} has a shape whose element count overflows")]
    ShapeOverflow { name: String },
    #[error("arrays nested deeper than {MAX_NESTING} levels in key {0:?}")]
    TooDeep(String),
}

impl GgufError {
    /// True when more bytes could make the parse succeed.
    pub fn needs_more(&self) -> Option<u64> {
        match self {
            GgufError::Truncated { needed, .. } => Some(*needed),
            _ => None,
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    U64(u64),
    I64(i64),
    F64(f64),
    /// `items` holds the elements of numeric and bool arrays up to 65,536 long; string arrays
    /// and longer arrays keep only their length.
    Array {
        value_type: u32,
        len: u64,
        items: Option<Vec<Value>>,
    },
}

impl Value {
    /// The value as an unsigned integer, whatever integer type the writer chose.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            Value::Bool(b) => Some(b.into()),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// Elements of a kept array.
    pub fn items(&self) -> Option<&[Value]> {
        match self {
            Value::Array {
                items: Some(items), ..
            } => Some(items),
            _ => None,
        }
    }

    /// Length of an array value.
    pub fn array_len(&self) -> Option<u64> {
        match self {
            Value::Array { len, .. } => Some(*len),
            _ => None,
        }
    }
}

/// One tensor's description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// Offset from the start of the tensor data.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed header.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Where the tensor data starts (the header's end, padded to the alignment).
    pub data_offset: u64,
}

impl Header {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// The buffer holds the whole file: running out is final.
    eof: bool,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64) -> Result<&'a [u8], GgufError> {
        let end = (self.pos as u64)
            .checked_add(n)
            .filter(|e| *e <= MAX_HEADER)
            .ok_or(GgufError::TooLarge { max: MAX_HEADER })?;
        if end > self.buf.len() as u64 {
            return Err(GgufError::Truncated {
                needed: end,
                len: if self.eof { self.buf.len() as u64 } else { 0 },
            });
        }
        let s = &self.buf[self.pos..end as usize];
        self.pos = end as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, GgufError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A length-prefixed string, checked for UTF-8.
    fn string(&mut self, what: impl FnOnce() -> String) -> Result<String, GgufError> {
        let len = self.u64()?;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::NotUtf8 { what: what() })
    }

    /// Skips a string, checking UTF-8 without keeping it.
    fn skip_string(&mut self, what: impl FnOnce() -> String) -> Result<(), GgufError> {
        let len = self.u64()?;
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes)
            .map(|_| ())
            .map_err(|_| GgufError::NotUtf8 { what: what() })
    }
}

/// Fixed size of a scalar value type, None for strings, arrays and unknown types.
fn scalar_size(t: u32) -> Option<u64> {
    match t {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// Parses the header at the start of `buf`. `eof` says whether `buf` is the whole file.
/// When more bytes are needed the error is `Truncated` with how many (see `needs_more`).
pub fn parse(buf: &[u8], eof: bool) -> Result<Header, GgufError> {
    let mut c = Cursor { buf, pos: 0, eof };
    let magic: [u8; 4] = c.array()?;
    if &magic != b"GGUF" {
        let head = &buf[..buf.len().min(64)];
        let text = String::from_utf8_lossy(head).to_ascii_lowercase();
        if text.trim_start().starts_with("<!doctype") || text.trim_start().starts_with("<html") {
            return Err(GgufError::Html);
        }
        return Err(GgufError::BadMagic(magic));
    }
    let version = c.u32()?;
    match version {
        2 | 3 => {}
        1 => return Err(GgufError::Version1),
        v if v & 0xFFFF == 0 => return Err(GgufError::BigEndian),
        v => return Err(GgufError::UnknownVersion(v)),
    }
    let n_tensors = c.u64()?;
    let n_kv = c.u64()?;
    if n_tensors > MAX_TENSORS {
        return Err(GgufError::Absurd {
            what: "the tensor count".into(),
            value: n_tensors,
        });
    }
    if n_kv > MAX_KEYS {
        return Err(GgufError::Absurd {
            what: "the metadata key count".into(),
            value: n_kv,
        });
    }
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(|| format!("metadata key #{i}"))?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey);
        }
        let value_type = c.u32()?;
        let value = read_value(&mut c, value_type, &key, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(GgufError::DuplicateKey(key));
        }
    }
    let mut tensors = Vec::with_capacity(n_tensors.min(4096) as usize);
    for i in 0..n_tensors {
        let name = c.string(|| format!("the name of tensor #{i}"))?;
        let n_dims = c.u32()?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooManyDims { name, dims: n_dims });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64()?);
        }
        if dims
            .iter()
            .try_fold(1u64, |acc, d| acc.checked_mul(*d))
            .is_none()
        {
            return Err(GgufError::ShapeOverflow { name });
        }
        let ggml_type = c.u32()?;
        let offset = c.u64()?;
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
        });
    }
    let alignment = match metadata.get("general.alignment") {
        None => 32,
        Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(other) => return Err(GgufError::BadAlignment(format!("{other:?}"))),
    };
    let end = c.pos as u64;
    let data_offset = if n_tensors == 0 {
        end
    } else {
        end.div_ceil(alignment) * alignment
    };
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

fn read_value(c: &mut Cursor<'_>, t: u32, key: &str, depth: u32) -> Result<Value, GgufError> {
    Ok(match t {
        0 => Value::U8(c.u8()?),
        1 => Value::I8(c.u8()? as i8),
        2 => Value::U16(c.u16()?),
        3 => Value::I16(c.u16()? as i16),
        4 => Value::U32(c.u32()?),
        5 => Value::I32(c.u32()? as i32),
        6 => Value::F32(f32::from_bits(c.u32()?)),
        7 => match c.u8()? {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            v => {
                return Err(GgufError::BadBool {
                    key: key.into(),
                    value: v,
                });
            }
        },
        8 => Value::String(c.string(|| format!("the value of {key:?}"))?),
        10 => Value::U64(c.u64()?),
        11 => Value::I64(c.u64()? as i64),
        12 => Value::F64(f64::from_bits(c.u64()?)),
        9 => {
            if depth >= MAX_NESTING {
                return Err(GgufError::TooDeep(key.into()));
            }
            let elem = c.u32()?;
            let len = c.u64()?;
            // Every element takes at least one byte (eight for a string's length).
            let min = scalar_size(elem).unwrap_or(if elem == 8 { 8 } else { 12 });
            if len.checked_mul(min).is_none_or(|b| b > MAX_HEADER) {
                return Err(GgufError::Absurd {
                    what: format!("the length of array {key:?}"),
                    value: len,
                });
            }
            match (elem, scalar_size(elem)) {
                (8, _) => {
                    for i in 0..len {
                        c.skip_string(|| format!("element {i} of {key:?}"))?;
                    }
                    Value::Array {
                        value_type: elem,
                        len,
                        items: None,
                    }
                }
                (_, Some(size)) if len > KEPT_ARRAY => {
                    c.take(len * size)?;
                    Value::Array {
                        value_type: elem,
                        len,
                        items: None,
                    }
                }
                (_, Some(_)) | (9, None) => {
                    let mut items = Vec::with_capacity(len.min(KEPT_ARRAY) as usize);
                    for _ in 0..len {
                        items.push(read_value(c, elem, key, depth + 1)?);
                    }
                    Value::Array {
                        value_type: elem,
                        len,
                        items: Some(items),
                    }
                }
                _ => {
                    return Err(GgufError::UnknownValueType {
                        key: key.into(),
                        value_type: elem,
                    });
                }
            }
        }
        other => {
            return Err(GgufError::UnknownValueType {
                key: key.into(),
                value_type: other,
            });
        }
    })
}

/// Writes GGUF headers (tests and fixtures): the inverse of `parse` for the values it keeps.
pub mod write {
    use super::Value;

    /// A header with these key/values and tensors (name, dims, type), version 3.
    pub fn header(kv: &[(&str, Value)], tensors: &[(&str, &[u64], u32)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend((kv.len() as u64).to_le_bytes());
        for (k, v) in kv {
            string(&mut b, k);
            value(&mut b, v, true);
        }
        let mut offset = 0u64;
        for (name, dims, t) in tensors {
            string(&mut b, name);
            b.extend((dims.len() as u32).to_le_bytes());
            for d in *dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(t.to_le_bytes());
            b.extend(offset.to_le_bytes());
            offset += 32;
        }
        b
    }

    pub fn string(b: &mut Vec<u8>, s: &str) {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    }

    fn type_of(v: &Value) -> u32 {
        match v {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array { .. } => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    pub fn value(b: &mut Vec<u8>, v: &Value, with_type: bool) {
        if with_type {
            b.extend(type_of(v).to_le_bytes());
        }
        match v {
            Value::U8(x) => b.push(*x),
            Value::I8(x) => b.push(*x as u8),
            Value::U16(x) => b.extend(x.to_le_bytes()),
            Value::I16(x) => b.extend(x.to_le_bytes()),
            Value::U32(x) => b.extend(x.to_le_bytes()),
            Value::I32(x) => b.extend(x.to_le_bytes()),
            Value::F32(x) => b.extend(x.to_le_bytes()),
            Value::Bool(x) => b.push(u8::from(*x)),
            Value::String(s) => string(b, s),
            Value::U64(x) => b.extend(x.to_le_bytes()),
            Value::I64(x) => b.extend(x.to_le_bytes()),
            Value::F64(x) => b.extend(x.to_le_bytes()),
            Value::Array {
                value_type,
                len,
                items,
            } => {
                b.extend(value_type.to_le_bytes());
                b.extend(len.to_le_bytes());
                for item in items.iter().flatten() {
                    value(b, item, false);
                }
            }
        }
    }

    /// An array value of u32s.
    pub fn u32s(v: &[u32]) -> Value {
        Value::Array {
            value_type: 4,
            len: v.len() as u64,
            items: Some(v.iter().map(|x| Value::U32(*x)).collect()),
        }
    }

    /// An array value of strings (kept as written; the parser keeps only the length).
    pub fn strings(b: &[&str]) -> Value {
        Value::Array {
            value_type: 8,
            len: b.len() as u64,
            items: Some(b.iter().map(|s| Value::String(s.to_string())).collect()),
        }
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn absurd_counts_are_refused_before_allocating() {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(u64::MAX.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        assert!(matches!(
            parse(&b, false).unwrap_err(),
            GgufError::Absurd { .. }
        ));

        // A string claiming to be 2^60 bytes long.
        let mut b = header(&[], &[]);
        b[16..24].copy_from_slice(&1u64.to_le_bytes());
        b.extend((1u64 << 60).to_le_bytes());
        assert_eq!(
            parse(&b, false).unwrap_err(),
            GgufError::TooLarge { max: MAX_HEADER }
        );

        // An array claiming 2^40 u32 elements.
        let mut b = header(&[], &[]);
        b[16..24].copy_from_slice(&1u64.to_le_bytes());
        write::string(&mut b, "k");
        b.extend(9u32.to_le_bytes());
        b.extend(4u32.to_le_bytes());
        b.extend((1u64 << 40).to_le_bytes());
        assert!(matches!(
            parse(&b, false).unwrap_err(),
            GgufError::Absurd { .. }
        ));
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
            GgufError::TooManyDims { .. }
        ));
        let overflow = header(&[], &[("t", &[u64::MAX, 2], 0)]);
        assert!(matches!(
            parse(&overflow, true).unwrap_err(),
            GgufError::ShapeOverflow { .. }
        ));
        let align = header(&[("general.alignment", Value::U32(48))], &[]);
        assert!(matches!(
            parse(&align, true).unwrap_err(),
            GgufError::BadAlignment(_)
        ));
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
}
