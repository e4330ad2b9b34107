//! Reading values from a byte prefix: every read is bounds-checked against the buffer and
//! `MAX_HEADER`, every length against its bound before it sizes a loop or an allocation.

use super::super::bounds::{
    KEPT_ARRAY, KEPT_VALUES, MAX_ARRAY, MAX_HEADER, MAX_NESTING, MAX_STRING, at_most,
};
use super::{GgufError, Value};

pub(super) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// The buffer holds the whole file: running out is final.
    eof: bool,
    /// Array elements that may still be kept as values.
    kept: u64,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(buf: &'a [u8], eof: bool) -> Self {
        Cursor {
            buf,
            pos: 0,
            eof,
            kept: KEPT_VALUES,
        }
    }

    /// Bytes read so far.
    pub(super) fn position(&self) -> u64 {
        self.pos as u64
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], GgufError> {
        let end = (self.pos as u64)
            .checked_add(n)
            .filter(|e| *e <= MAX_HEADER)
            .ok_or(GgufError::TooLarge { max: MAX_HEADER })?;
        let truncated = GgufError::Truncated {
            needed: end,
            len: if self.eof { self.buf.len() as u64 } else { 0 },
        };
        // `end` is at most MAX_HEADER, so it fits a usize.
        let end = usize::try_from(end).map_err(|_| GgufError::TooLarge { max: MAX_HEADER })?;
        let s = self.buf.get(self.pos..end).ok_or(truncated)?;
        self.pos = end;
        Ok(s)
    }

    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64)?;
        let mut a = [0u8; N];
        for (d, b) in a.iter_mut().zip(s) {
            *d = *b;
        }
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, GgufError> {
        Ok(u8::from_le_bytes(self.array()?))
    }
    fn u16(&mut self) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(super) fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(super) fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// The bytes of a length-prefixed string of at most `limit` bytes, checked for UTF-8.
    fn str(&mut self, limit: u64, what: &dyn Fn() -> String) -> Result<&'a str, GgufError> {
        let len = at_most(self.u64()?, limit, "bytes", || {
            format!("the length of {}", what())
        })?;
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::NotUtf8 { what: what() })
    }

    /// A length-prefixed string of at most `limit` bytes.
    pub(super) fn string(
        &mut self,
        limit: u64,
        what: &dyn Fn() -> String,
    ) -> Result<String, GgufError> {
        self.str(limit, what).map(str::to_owned)
    }

    /// Whether an array of `len` elements is kept, taking them from the header's budget.
    fn keep(&mut self, len: u64) -> bool {
        if len > KEPT_ARRAY || len > self.kept {
            return false;
        }
        self.kept -= len;
        true
    }

    /// A value of type `t` of metadata key `key`, inside `depth` arrays.
    pub(super) fn value(&mut self, t: u32, key: &str, depth: u32) -> Result<Value, GgufError> {
        Ok(match t {
            0 => Value::U8(self.u8()?),
            1 => Value::I8(i8::from_le_bytes(self.array()?)),
            2 => Value::U16(self.u16()?),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_bits(self.u32()?)),
            7 => match self.u8()? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                v => {
                    return Err(GgufError::BadBool {
                        key: key.into(),
                        value: v,
                    });
                }
            },
            8 => Value::String(self.string(MAX_STRING, &|| format!("the value of {key:?}"))?),
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_bits(self.u64()?)),
            9 => self.array_value(key, depth)?,
            other => {
                return Err(GgufError::UnknownValueType {
                    key: key.into(),
                    value_type: other,
                });
            }
        })
    }

    fn array_value(&mut self, key: &str, depth: u32) -> Result<Value, GgufError> {
        if depth >= MAX_NESTING {
            return Err(GgufError::TooDeep(key.into()));
        }
        let elem = self.u32()?;
        let field = || format!("the length of array {key:?}");
        let len = at_most(self.u64()?, MAX_ARRAY, "elements", field)?;
        // Every element takes at least one byte (eight for a string's length, twelve for an
        // array's type and length): an array the header cannot hold is refused before it is
        // walked.
        let min = scalar_size(elem).unwrap_or(if elem == 8 { 8 } else { 12 });
        at_most(len, MAX_HEADER / min, "elements", || {
            format!(
                "{} (of {min}-byte elements in a header of at most {MAX_HEADER} bytes)",
                field()
            )
        })?;
        let items = match (elem, scalar_size(elem)) {
            (8, _) => {
                for i in 0..len {
                    self.str(MAX_STRING, &|| format!("element {i} of {key:?}"))?;
                }
                None
            }
            (_, Some(size)) => {
                if self.keep(len) {
                    let mut items = Vec::with_capacity(len as usize);
                    for _ in 0..len {
                        items.push(self.value(elem, key, depth + 1)?);
                    }
                    Some(items)
                } else {
                    // len is at most MAX_HEADER / size here.
                    self.take(len * size)?;
                    None
                }
            }
            (9, None) => {
                let keep = self.keep(len);
                let mut items = Vec::with_capacity(if keep { len as usize } else { 0 });
                for _ in 0..len {
                    let v = self.array_value(key, depth + 1)?;
                    if keep {
                        items.push(v);
                    }
                }
                keep.then_some(items)
            }
            _ => {
                return Err(GgufError::UnknownValueType {
                    key: key.into(),
                    value_type: elem,
                });
            }
        };
        Ok(Value::Array {
            value_type: elem,
            len,
            items,
        })
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
