//! A validated GGUF reader over a memory map, and a small writer (for tests and `mens synth`).
//!
//! Written by hand rather than using candle's `gguf_file` because that reader copies tensor data into
//! memory and trusts the header; mens keeps weights in the map and treats the file as untrusted input:
//! every count, length, shape and offset is checked against the file size and fixed maxima before use,
//! and no allocation larger than the file itself follows from a header value.

use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

pub const MAGIC: u32 = 0x4655_4747; // "GGUF" little-endian
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Fixed maxima on header values (in addition to "no larger than what is left of the file").
pub const MAX_TENSORS: u64 = 1 << 16;
pub const MAX_KV: u64 = 1 << 16;
pub const MAX_STRING: u64 = 1 << 24; // 16 MiB: chat templates are a few KiB, tokens a few bytes
pub const MAX_ARRAY: u64 = 1 << 24; // 16 M elements: vocabularies are ~150 k
pub const MAX_DIMS: u32 = 4;

/// The tensor element types mens knows, with their GGUF ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
}

impl TensorType {
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            10 => Self::Q2K,
            11 => Self::Q3K,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            30 => Self::BF16,
            _ => return None,
        })
    }
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q2K => 10,
            Self::Q3K => 11,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::BF16 => 30,
        }
    }
    /// Elements per block.
    pub fn block_size(self) -> u64 {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 => 32,
            _ => 256,
        }
    }
    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q2K => 84,
            Self::Q3K => 110,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
        }
    }
    /// Bytes for `elements` values, or None when the count is not whole blocks or overflows.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        if !elements.is_multiple_of(self.block_size()) {
            return None;
        }
        (elements / self.block_size()).checked_mul(self.block_bytes())
    }
}

/// A metadata value. Arrays are typed vectors (nested arrays are rejected: no model uses them).
#[derive(Debug, Clone, PartialEq)]
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
    Array(Array),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Bools(Vec<bool>),
    Strings(Vec<String>),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) if v >= 0 => Some(v as u64),
            Value::I16(v) if v >= 0 => Some(v as u64),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
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
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
    fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
            Value::Array(_) => "array",
        }
    }
}

#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: dims[0] is the row length (fastest varying).
    pub dims: Vec<u64>,
    pub ttype: TensorType,
    /// Absolute offset of the data in the file.
    pub offset: u64,
    pub bytes: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// The bytes behind a GGUF file: a read-only memory map, or owned bytes (tests, fuzzing).
pub enum Storage {
    Mmap(memmap2::Mmap),
    Bytes(Vec<u8>),
}

impl std::ops::Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Bytes(b) => b,
        }
    }
}

pub struct Gguf {
    pub storage: Arc<Storage>,
    pub version: u32,
    pub alignment: u64,
    pub metadata: BTreeMap<String, Value>,
    /// Absolute file offsets of each metadata value (for errors that point into the file).
    pub metadata_offsets: HashMap<String, u64>,
    pub tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }
    fn take(&mut self, n: u64, field: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(Error::gguf(
                self.pos as u64,
                field,
                format!(
                    "needs {n} bytes but only {} remain (truncated file?)",
                    self.remaining()
                ),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    fn u8(&mut self, f: &str) -> Result<u8> {
        Ok(self.take(1, f)?[0])
    }
    fn u16(&mut self, f: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2, f)?.try_into().unwrap()))
    }
    fn u32(&mut self, f: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, f)?.try_into().unwrap()))
    }
    fn u64(&mut self, f: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, f)?.try_into().unwrap()))
    }
    fn string(&mut self, f: &str) -> Result<String> {
        let at = self.pos as u64;
        let len = self.u64(f)?;
        if len > MAX_STRING {
            return Err(Error::gguf(
                at,
                f,
                format!("string length {len} exceeds the limit {MAX_STRING}"),
            ));
        }
        let bytes = self.take(len, f)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| Error::gguf(at, f, "string is not valid UTF-8"))
    }
    /// A count that must fit both a fixed maximum and what is left of the file (each item
    /// takes at least `min_item_bytes`), so that no allocation exceeds the file size.
    fn count(&mut self, f: &str, max: u64, min_item_bytes: u64) -> Result<u64> {
        let at = self.pos as u64;
        let n = self.u64(f)?;
        if n > max {
            return Err(Error::gguf(
                at,
                f,
                format!("count {n} exceeds the limit {max}"),
            ));
        }
        if n.saturating_mul(min_item_bytes) > self.remaining() {
            return Err(Error::gguf(
                at,
                f,
                format!(
                    "count {n} cannot fit in the {} bytes left in the file",
                    self.remaining()
                ),
            ));
        }
        Ok(n)
    }
}

/// A vector for `n` items of `T` whose capacity never exceeds the bytes left in the file: a header
/// count can make the vector grow only as far as the file actually holds items.
fn bounded_vec<T>(n: usize, remaining: u64) -> Vec<T> {
    let most = (remaining as usize) / std::mem::size_of::<T>().max(1);
    Vec::with_capacity(n.min(most))
}

fn scalar_size(t: u32) -> Option<u64> {
    Some(match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => 8, // a string's length prefix, its minimum size
        _ => return None,
    })
}

fn read_scalar(c: &mut Cursor, t: u32, f: &str) -> Result<Value> {
    let at = c.pos as u64;
    Ok(match t {
        0 => Value::U8(c.u8(f)?),
        1 => Value::I8(c.u8(f)? as i8),
        2 => Value::U16(c.u16(f)?),
        3 => Value::I16(c.u16(f)? as i16),
        4 => Value::U32(c.u32(f)?),
        5 => Value::I32(c.u32(f)? as i32),
        6 => Value::F32(f32::from_bits(c.u32(f)?)),
        7 => match c.u8(f)? {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            b => {
                return Err(Error::gguf(
                    at,
                    f,
                    format!("bool value {b} is neither 0 nor 1"),
                ))
            }
        },
        8 => Value::String(c.string(f)?),
        10 => Value::U64(c.u64(f)?),
        11 => Value::I64(c.u64(f)? as i64),
        12 => Value::F64(f64::from_bits(c.u64(f)?)),
        _ => return Err(Error::gguf(at, f, format!("unknown value type {t}"))),
    })
}

fn read_value(c: &mut Cursor, f: &str) -> Result<Value> {
    let at = c.pos as u64;
    let t = c.u32(f)?;
    if t != 9 {
        return read_scalar(c, t, f);
    }
    let et = c.u32(f)?;
    if et == 9 {
        return Err(Error::gguf(at, f, "nested arrays are not supported"));
    }
    let min = scalar_size(et)
        .ok_or_else(|| Error::gguf(at + 4, f, format!("unknown array element type {et}")))?;
    let n = c.count(f, MAX_ARRAY, min)? as usize;
    let arr = match et {
        8 => {
            let mut v = bounded_vec(n, c.remaining());
            for _ in 0..n {
                v.push(c.string(f)?);
            }
            Array::Strings(v)
        }
        7 => {
            let mut v = bounded_vec(n, c.remaining());
            for _ in 0..n {
                v.push(read_scalar(c, et, f)?.as_bool().unwrap_or(false));
            }
            Array::Bools(v)
        }
        6 | 12 => {
            let mut v = bounded_vec(n, c.remaining());
            for _ in 0..n {
                v.push(read_scalar(c, et, f)?.as_f64().unwrap_or(0.0));
            }
            Array::Floats(v)
        }
        _ => {
            let mut v = bounded_vec(n, c.remaining());
            for _ in 0..n {
                v.push(match read_scalar(c, et, f)? {
                    Value::U8(x) => x as i64,
                    Value::I8(x) => x as i64,
                    Value::U16(x) => x as i64,
                    Value::I16(x) => x as i64,
                    Value::U32(x) => x as i64,
                    Value::I32(x) => x as i64,
                    Value::U64(x) => x as i64,
                    Value::I64(x) => x,
                    _ => 0,
                });
            }
            Array::Ints(v)
        }
    };
    Ok(Value::Array(arr))
}

impl Gguf {
    /// Memory-map and validate a GGUF file.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |error| Error::Io {
            path: path.to_path_buf(),
            error,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if meta.is_dir() {
            return Err(io(std::io::Error::other("is a directory")));
        }
        if meta.len() == 0 {
            return Err(Error::gguf(0, "file", "the file is empty"));
        }
        // SAFETY: the map is read-only; mens does not modify model files. A file truncated by another
        // process while mapped can fault, as with every mmap-based loader (llama.cpp included).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(Storage::Mmap(map))
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Storage::Bytes(bytes))
    }

    fn parse(storage: Storage) -> Result<Self> {
        let storage = Arc::new(storage);
        let buf: &[u8] = &storage;
        let file_len = buf.len() as u64;
        let mut c = Cursor { buf, pos: 0 };
        let magic = c.u32("magic")?;
        if magic != MAGIC {
            return Err(Error::gguf(
                0,
                "magic",
                format!(
                    "expected \"GGUF\", found {:02x?} (not a GGUF file)",
                    &buf[..4]
                ),
            ));
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(Error::gguf(
                4,
                "version",
                format!("version {version} is not supported (2 or 3)"),
            ));
        }
        // A tensor info takes at least 8 (name len) + 4 (n_dims) + 8 (one dim) + 4 + 8 bytes.
        let n_tensors = c.count("tensor_count", MAX_TENSORS, 32)?;
        // A key-value pair takes at least 8 (key len) + 4 (type) + 1 bytes.
        let n_kv = c.count("metadata_kv_count", MAX_KV, 13)?;

        let mut metadata = BTreeMap::new();
        let mut metadata_offsets = HashMap::new();
        for _ in 0..n_kv {
            let at = c.pos as u64;
            let key = c.string("metadata key")?;
            if key.is_empty() {
                return Err(Error::gguf(at, "metadata key", "empty key"));
            }
            let vat = c.pos as u64;
            let value = read_value(&mut c, &key)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(Error::gguf(at, key, "duplicate metadata key"));
            }
            metadata_offsets.insert(key, vat);
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => {
                let a = v.as_u64().unwrap_or(0);
                if a == 0 || !a.is_power_of_two() || a > 1 << 20 {
                    return Err(Error::gguf(
                        metadata_offsets["general.alignment"],
                        "general.alignment",
                        format!("alignment {v:?} is not a power of two up to 1 MiB"),
                    ));
                }
                a
            }
        };

        let mut tensors = bounded_vec(n_tensors as usize, c.remaining());
        let mut index =
            HashMap::with_capacity((n_tensors as usize).min(c.remaining() as usize / 64));
        let mut rel_offsets = bounded_vec(n_tensors as usize, c.remaining());
        for i in 0..n_tensors {
            let (at, info, oat) = read_tensor_info(&mut c, alignment)?;
            let field = |s: &str| format!("tensor {:?} {s}", info.name);
            if index.insert(info.name.clone(), i as usize).is_some() {
                return Err(Error::gguf(at, field("name"), "duplicate tensor name"));
            }
            rel_offsets.push((oat, info.offset));
            tensors.push(info);
        }

        place_tensors(&mut tensors, rel_offsets, c.pos as u64, alignment, file_len)?;
        Ok(Gguf {
            storage,
            version,
            alignment,
            metadata,
            metadata_offsets,
            tensors,
            index,
        })
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    pub fn bytes(&self, t: &TensorInfo) -> &[u8] {
        &self.storage[t.offset as usize..(t.offset + t.bytes) as usize]
    }

    pub fn file_len(&self) -> u64 {
        self.storage.len() as u64
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    fn offset_of(&self, key: &str) -> u64 {
        self.metadata_offsets.get(key).copied().unwrap_or(0)
    }

    fn type_error(&self, key: &str, want: &str) -> Error {
        let v = &self.metadata[key];
        Error::gguf(
            self.offset_of(key),
            key,
            format!("expected {want}, found {}", v.type_name()),
        )
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.type_error(key, "a string")),
        }
    }

    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.type_error(key, "a non-negative integer")),
        }
    }

    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.type_error(key, "a number")),
        }
    }

    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.get_u64(key)?
            .ok_or_else(|| Error::Model(format!("metadata key {key} is missing")))
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&Array>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(_) => Err(self.type_error(key, "an array")),
        }
    }
}

/// Writes GGUF v3 files. Used by the tests (tiny random models, malformed-file corpus) and `mens synth`.
#[derive(Default)]
pub struct Writer {
    kv: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, TensorType, Vec<u8>)>,
}

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn kv(&mut self, key: &str, v: Value) -> &mut Self {
        self.kv.push((key.to_string(), v));
        self
    }
    pub fn tensor(&mut self, name: &str, dims: &[u64], t: TensorType, data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), t, data));
        self
    }

    /// (name, dims, type, data bytes) of each tensor added so far.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &[u64], TensorType, usize)> {
        self.tensors
            .iter()
            .map(|(n, d, t, data)| (n.as_str(), d.as_slice(), *t, data.len()))
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    fn put_value(out: &mut Vec<u8>, v: &Value) {
        let (t, body): (u32, Vec<u8>) = match v {
            Value::U8(x) => (0, vec![*x]),
            Value::I8(x) => (1, vec![*x as u8]),
            Value::U16(x) => (2, x.to_le_bytes().to_vec()),
            Value::I16(x) => (3, x.to_le_bytes().to_vec()),
            Value::U32(x) => (4, x.to_le_bytes().to_vec()),
            Value::I32(x) => (5, x.to_le_bytes().to_vec()),
            Value::F32(x) => (6, x.to_le_bytes().to_vec()),
            Value::Bool(x) => (7, vec![*x as u8]),
            Value::String(s) => {
                let mut b = Vec::new();
                Self::put_str(&mut b, s);
                (8, b)
            }
            Value::U64(x) => (10, x.to_le_bytes().to_vec()),
            Value::I64(x) => (11, x.to_le_bytes().to_vec()),
            Value::F64(x) => (12, x.to_le_bytes().to_vec()),
            Value::Array(a) => {
                let mut b = Vec::new();
                match a {
                    Array::Ints(v) => {
                        b.extend(5u32.to_le_bytes());
                        b.extend((v.len() as u64).to_le_bytes());
                        v.iter().for_each(|x| b.extend((*x as i32).to_le_bytes()));
                    }
                    Array::Floats(v) => {
                        b.extend(6u32.to_le_bytes());
                        b.extend((v.len() as u64).to_le_bytes());
                        v.iter().for_each(|x| b.extend((*x as f32).to_le_bytes()));
                    }
                    Array::Bools(v) => {
                        b.extend(7u32.to_le_bytes());
                        b.extend((v.len() as u64).to_le_bytes());
                        v.iter().for_each(|x| b.push(*x as u8));
                    }
                    Array::Strings(v) => {
                        b.extend(8u32.to_le_bytes());
                        b.extend((v.len() as u64).to_le_bytes());
                        v.iter().for_each(|s| Self::put_str(&mut b, s));
                    }
                }
                (9, b)
            }
        };
        out.extend(t.to_le_bytes());
        out.extend(body);
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out)
            .expect("writing to a Vec cannot fail");
        out
    }

    /// Stream the file (header, then each tensor's data, aligned) into `w`.
    pub fn write_to(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        let mut out = Vec::new();
        out.extend(MAGIC.to_le_bytes());
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            Self::put_str(&mut out, k);
            Self::put_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, dims, t, data) in &self.tensors {
            Self::put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(t.id().to_le_bytes());
            out.extend(offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
        }
        let start = (out.len() as u64).div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
        out.resize(start as usize, 0);
        w.write_all(&out)?;
        let mut at = 0u64;
        let zeros = [0u8; DEFAULT_ALIGNMENT as usize];
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            w.write_all(&zeros[..(off - at) as usize])?;
            w.write_all(data)?;
            at = off + data.len() as u64;
        }
        Ok(())
    }
}

/// One entry of the tensor table: where it starts, its info (offset relative to the data section)
/// and where its offset field is, all checked against the format and `alignment`.
fn read_tensor_info(c: &mut Cursor, alignment: u64) -> Result<(u64, TensorInfo, u64)> {
    let at = c.pos as u64;
    let name = c.string("tensor name")?;
    let field = |s: &str| format!("tensor {name:?} {s}");
    let n_dims = c.u32(&field("n_dims"))?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(Error::gguf(
            at,
            field("n_dims"),
            format!("{n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
        ));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    let mut elements: u64 = 1;
    for _ in 0..n_dims {
        let dat = c.pos as u64;
        let d = c.u64(&field("dimension"))?;
        if d == 0 {
            return Err(Error::gguf(dat, field("dimension"), "dimension is 0"));
        }
        elements = elements.checked_mul(d).ok_or_else(|| {
            Error::gguf(dat, field("dimension"), "element count overflows 64 bits")
        })?;
        dims.push(d);
    }
    let tat = c.pos as u64;
    let type_id = c.u32(&field("type"))?;
    let ttype = TensorType::from_id(type_id).ok_or_else(|| {
        Error::gguf(
            tat,
            field("type"),
            format!("unknown or unsupported tensor type id {type_id}"),
        )
    })?;
    if dims[0] % ttype.block_size() != 0 {
        return Err(Error::gguf(
            at,
            field("shape"),
            format!(
                "row length {} is not a multiple of the {} block size {}",
                dims[0],
                ttype.name(),
                ttype.block_size()
            ),
        ));
    }
    let bytes = ttype
        .bytes_for(elements)
        .ok_or_else(|| Error::gguf(at, field("shape"), "byte size overflows 64 bits"))?;
    let oat = c.pos as u64;
    let offset = c.u64(&field("offset"))?;
    if offset % alignment != 0 {
        return Err(Error::gguf(
            oat,
            field("offset"),
            format!("offset {offset} is not a multiple of the alignment {alignment}"),
        ));
    }
    Ok((
        at,
        TensorInfo {
            name,
            dims,
            ttype,
            offset,
            bytes,
        },
        oat,
    ))
}

/// Turn the tensors' offsets (relative to the data section, which starts at the first aligned byte
/// after `table_end`) into file offsets, checking that each lies inside the file and none overlap.
fn place_tensors(
    tensors: &mut [TensorInfo],
    rel_offsets: Vec<(u64, u64)>,
    table_end: u64,
    alignment: u64,
    file_len: u64,
) -> Result<()> {
    let data_start = table_end.div_ceil(alignment) * alignment;
    if data_start > file_len && !tensors.is_empty() {
        return Err(Error::gguf(
            table_end,
            "tensor data",
            "the file ends before its data section",
        ));
    }
    let data_len = file_len.saturating_sub(data_start);
    for (t, (oat, rel)) in tensors.iter_mut().zip(rel_offsets) {
        let end = rel.checked_add(t.bytes);
        if end.is_none_or(|e| e > data_len) {
            return Err(Error::gguf(
                oat,
                format!("tensor {:?} offset", t.name),
                format!(
                    "data [{rel}, {rel}+{}) lies outside the {data_len}-byte data section (truncated file?)",
                    t.bytes
                ),
            ));
        }
        t.offset = data_start + rel;
    }
    // No two tensors may overlap.
    let mut spans: Vec<(u64, u64, usize)> = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.offset, t.offset + t.bytes, i))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            let (a, b) = (&tensors[w[0].2], &tensors[w[1].2]);
            return Err(Error::gguf(
                b.offset,
                format!("tensor {:?}", b.name),
                format!("data overlaps tensor {:?}", a.name),
            ));
        }
    }
    Ok(())
}
