//! The GGUF header: a bounded, panic-free parser over a byte prefix of the file.
//!
//! `parse` reads from the start of a buffer that may hold only part of the file. When it runs
//! out of bytes it says how many it needs, and the caller fetches more and parses again; so a
//! reader over HTTP grows its ranges without ever asking for the tensor data. Every count and
//! length is checked against its bound (`bounds`) before anything is allocated or walked.

mod reader;
#[cfg(test)]
mod tests;
pub mod write;

use std::collections::BTreeMap;

pub use super::bounds::MAX_HEADER;
use super::bounds::{self, BoundsError, MAX_DIMS, MAX_KEYS, MAX_NAME, MAX_NESTING, MAX_TENSORS};
use reader::Cursor;

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
    #[error("arrays nested deeper than {MAX_NESTING} levels in key {0:?}")]
    TooDeep(String),
    /// A count or size beyond its bound.
    #[error(transparent)]
    Bounds(#[from] BoundsError),
    /// The parser's task did not finish (the runtime is shutting down, or a bug).
    #[error("the header parser stopped before it finished: {0}")]
    ParserFailed(String),
}

impl GgufError {
    /// True when more bytes could make the parse succeed.
    pub fn needs_more(&self) -> Option<u64> {
        match self {
            GgufError::Truncated { needed, .. } => Some(*needed),
            _ => None,
        }
    }

    /// The condition reason: `InvalidHeader` for a value beyond its bound, `InvalidGGUF` for
    /// bytes that are not a GGUF header.
    pub fn reason(&self) -> &'static str {
        match self {
            GgufError::Bounds(e) => e.reason(),
            GgufError::TooLarge { .. } => "InvalidHeader",
            _ => "InvalidGGUF",
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
    /// `items` holds the elements of numeric, bool and nested arrays up to `KEPT_ARRAY` long,
    /// while the header's `KEPT_VALUES` last; string arrays and other arrays keep their length.
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
    /// Number of elements, saturating (a parsed tensor has at most `MAX_TENSOR_ELEMENTS`).
    pub fn elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |n, d| n.saturating_mul(*d))
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

/// Parses the header at the start of `buf`. `eof` says whether `buf` is the whole file.
/// When more bytes are needed the error is `Truncated` with how many (see `needs_more`).
pub fn parse(buf: &[u8], eof: bool) -> Result<Header, GgufError> {
    let mut c = Cursor::new(buf, eof);
    let magic: [u8; 4] = c.array()?;
    if &magic != b"GGUF" {
        let head: Vec<u8> = buf.iter().take(64).copied().collect();
        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
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
    let n_tensors = bounds::at_most(c.u64()?, MAX_TENSORS, "tensors", || {
        "the tensor count".into()
    })?;
    let n_kv = bounds::at_most(c.u64()?, MAX_KEYS, "keys", || {
        "the metadata key count".into()
    })?;
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(MAX_NAME, &|| format!("metadata key #{i}"))?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey);
        }
        let value_type = c.u32()?;
        let value = c.value(value_type, &key, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(GgufError::DuplicateKey(key));
        }
    }
    let mut tensors = Vec::with_capacity(n_tensors.min(4096) as usize);
    for i in 0..n_tensors {
        let name = c.string(MAX_NAME, &|| format!("the name of tensor #{i}"))?;
        let n_dims = bounds::at_most(c.u32()?.into(), MAX_DIMS, "dimensions", || {
            format!("the dimension count of tensor {name:?}")
        })?;
        let mut dims = Vec::with_capacity(MAX_DIMS as usize);
        for _ in 0..n_dims {
            dims.push(c.u64()?);
        }
        bounds::tensor_elements(&name, &dims)?;
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
    // The end is within MAX_HEADER and the alignment below 2^32: no overflow.
    let end = c.position();
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
