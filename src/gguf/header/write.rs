//! Writes GGUF headers (tests and fixtures): the inverse of `parse` for the values it keeps.

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

/// The parsed header of owned key/values and tensors (name, dims, type), for tests that build
/// them in loops.
#[cfg(test)]
pub fn parsed<K: AsRef<str>>(
    kv: &[(K, Value)],
    tensors: &[(String, Vec<u64>, u32)],
) -> super::Header {
    let kv: Vec<(&str, Value)> = kv.iter().map(|(k, v)| (k.as_ref(), v.clone())).collect();
    let tensors: Vec<(&str, &[u64], u32)> = tensors
        .iter()
        .map(|(n, d, t)| (n.as_str(), d.as_slice(), *t))
        .collect();
    super::parse(&header(&kv, &tensors), true).unwrap()
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
