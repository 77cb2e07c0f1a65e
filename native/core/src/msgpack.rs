//! Minimal msgpack writer and zero-copy reader: exactly the subset the wire formats use.
//!
//! The writer always picks the shortest encoding (what every v0.7.1 producer emits). The reader
//! borrows from the input and never allocates for bin or str values, so a parser built on it can
//! hand out slices of the frame instead of copies.

use std::fmt;

/// A typed decode failure: where it happened and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub offset: usize,
    pub message: String,
}

impl DecodeError {
    pub fn new(offset: usize, message: impl Into<String>) -> Self {
        Self {
            offset,
            message: message.into(),
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at byte {})", self.message, self.offset)
    }
}

impl std::error::Error for DecodeError {}

pub type DecodeResult<T> = Result<T, DecodeError>;

/// Deepest nesting the reader follows; deeper input is rejected instead of recursing.
pub const MAX_DEPTH: usize = 128;

// ---------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------

/// Where encoded bytes go: a growable `Vec`, a preallocated slice (so output can be written
/// straight into a Python `bytes`), or a counter that only measures the exact length first.
pub trait Out {
    fn push(&mut self, byte: u8);
    fn extend_from_slice(&mut self, bytes: &[u8]);
}

impl Out for Vec<u8> {
    fn push(&mut self, byte: u8) {
        Vec::push(self, byte);
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        Vec::extend_from_slice(self, bytes);
    }
}

/// Counts bytes without storing them.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counter(pub usize);

impl Out for Counter {
    fn push(&mut self, _byte: u8) {
        self.0 += 1;
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

/// Writes into a slice sized by a [`Counter`] pass. Overflow is a logic error: it panics in
/// debug builds and truncates in release builds (the caller checks `written()`).
#[derive(Debug)]
pub struct SliceWriter<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> SliceWriter<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    pub fn written(&self) -> usize {
        self.pos
    }
    /// Hand out the next `n` bytes to be filled in place (for computed element data).
    pub fn reserve(&mut self, n: usize) -> &mut [u8] {
        let end = (self.pos + n).min(self.buf.len());
        debug_assert_eq!(end, self.pos + n, "SliceWriter overflow");
        let start = self.pos;
        self.pos = end;
        &mut self.buf[start..end]
    }
}

impl Out for SliceWriter<'_> {
    fn push(&mut self, byte: u8) {
        if let Some(slot) = self.reserve(1).first_mut() {
            *slot = byte;
        }
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        let dst = self.reserve(bytes.len());
        let n = dst.len();
        dst.copy_from_slice(&bytes[..n]);
    }
}

pub fn write_nil(out: &mut impl Out) {
    out.push(0xc0);
}

pub fn write_bool(out: &mut impl Out, value: bool) {
    out.push(if value { 0xc3 } else { 0xc2 });
}

pub fn write_uint(out: &mut impl Out, value: u64) {
    if value < 0x80 {
        out.push(value as u8);
    } else if value <= 0xff {
        out.extend_from_slice(&[0xcc, value as u8]);
    } else if value <= 0xffff {
        out.push(0xcd);
        out.extend_from_slice(&(value as u16).to_be_bytes());
    } else if value <= 0xffff_ffff {
        out.push(0xce);
        out.extend_from_slice(&(value as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

pub fn write_int(out: &mut impl Out, value: i64) {
    if value >= 0 {
        write_uint(out, value as u64);
    } else if value >= -32 {
        out.push(value as i8 as u8);
    } else if value >= i64::from(i8::MIN) {
        out.extend_from_slice(&[0xd0, value as i8 as u8]);
    } else if value >= i64::from(i16::MIN) {
        out.push(0xd1);
        out.extend_from_slice(&(value as i16).to_be_bytes());
    } else if value >= i64::from(i32::MIN) {
        out.push(0xd2);
        out.extend_from_slice(&(value as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

pub fn write_f64(out: &mut impl Out, value: f64) {
    out.push(0xcb);
    out.extend_from_slice(&value.to_be_bytes());
}

/// Length of a str header for `len` bytes.
pub const fn str_header_len(len: usize) -> usize {
    if len < 32 {
        1
    } else if len <= 0xff {
        2
    } else if len <= 0xffff {
        3
    } else {
        5
    }
}

/// Length of a bin header for `len` bytes.
pub const fn bin_header_len(len: usize) -> usize {
    if len <= 0xff {
        2
    } else if len <= 0xffff {
        3
    } else {
        5
    }
}

/// Encoded length of an unsigned integer.
pub const fn uint_len(value: u64) -> usize {
    if value < 0x80 {
        1
    } else if value <= 0xff {
        2
    } else if value <= 0xffff {
        3
    } else if value <= 0xffff_ffff {
        5
    } else {
        9
    }
}

pub fn write_str_header(out: &mut impl Out, len: usize) {
    if len < 32 {
        out.push(0xa0 | len as u8);
    } else if len <= 0xff {
        out.extend_from_slice(&[0xd9, len as u8]);
    } else if len <= 0xffff {
        out.push(0xda);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

pub fn write_str(out: &mut impl Out, value: &str) {
    write_str_header(out, value.len());
    out.extend_from_slice(value.as_bytes());
}

pub fn write_bin_header(out: &mut impl Out, len: usize) {
    if len <= 0xff {
        out.extend_from_slice(&[0xc4, len as u8]);
    } else if len <= 0xffff {
        out.push(0xc5);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xc6);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

pub fn write_bin(out: &mut impl Out, value: &[u8]) {
    write_bin_header(out, value.len());
    out.extend_from_slice(value);
}

pub fn write_array_header(out: &mut impl Out, len: usize) {
    if len < 16 {
        out.push(0x90 | len as u8);
    } else if len <= 0xffff {
        out.push(0xdc);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

pub fn write_map_header(out: &mut impl Out, len: usize) {
    if len < 16 {
        out.push(0x80 | len as u8);
    } else if len <= 0xffff {
        out.push(0xde);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdf);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

pub fn write_opt_str(out: &mut impl Out, value: Option<&str>) {
    match value {
        Some(s) => write_str(out, s),
        None => write_nil(out),
    }
}

pub fn write_opt_f64(out: &mut impl Out, value: Option<f64>) {
    match value {
        Some(v) => write_f64(out, v),
        None => write_nil(out),
    }
}

pub fn write_opt_uint(out: &mut impl Out, value: Option<u64>) {
    match value {
        Some(v) => write_uint(out, v),
        None => write_nil(out),
    }
}

// ---------------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------------

/// One decoded scalar or container header. Strings and binaries borrow from the input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Token<'a> {
    Nil,
    Bool(bool),
    UInt(u64),
    Int(i64),
    F32(f32),
    F64(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(usize),
    Map(usize),
    Ext(i8, &'a [u8]),
}

impl Token<'_> {
    /// Short type name for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Token::Nil => "nil",
            Token::Bool(_) => "bool",
            Token::UInt(_) | Token::Int(_) => "int",
            Token::F32(_) | Token::F64(_) => "float",
            Token::Str(_) => "str",
            Token::Bin(_) => "bin",
            Token::Array(_) => "array",
            Token::Map(_) => "map",
            Token::Ext(..) => "ext",
        }
    }
}

/// A cursor over msgpack bytes.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub fn input(&self) -> &'a [u8] {
        self.buf
    }

    /// Move to an absolute position (clamped to the input).
    pub fn skip_to(&mut self, pos: usize) {
        self.pos = pos.min(self.buf.len());
    }

    fn error(&self, message: impl Into<String>) -> DecodeError {
        DecodeError::new(self.pos, message)
    }

    fn take(&mut self, n: usize) -> DecodeResult<&'a [u8]> {
        if self.remaining() < n {
            return Err(self.error("truncated msgpack value"));
        }
        let slice = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(slice)
    }

    fn byte(&mut self) -> DecodeResult<u8> {
        Ok(self.take(1)?[0])
    }

    fn be_u16(&mut self) -> DecodeResult<u16> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn be_u32(&mut self) -> DecodeResult<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn be_u64(&mut self) -> DecodeResult<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// Declared element counts can not exceed the bytes left (each element takes ≥ 1 byte), which
    /// keeps a hostile header from making a caller preallocate gigabytes.
    fn count(&mut self, n: usize, per_element: usize) -> DecodeResult<usize> {
        if n.saturating_mul(per_element) > self.remaining() {
            return Err(self.error("container length exceeds the input"));
        }
        Ok(n)
    }

    /// Read the next token (a scalar, or the header of a container).
    pub fn next_token(&mut self) -> DecodeResult<Token<'a>> {
        let start = self.pos;
        let marker = self.byte()?;
        let token = match marker {
            0x00..=0x7f => Token::UInt(u64::from(marker)),
            0x80..=0x8f => Token::Map(self.count(usize::from(marker & 0x0f), 2)?),
            0x90..=0x9f => Token::Array(self.count(usize::from(marker & 0x0f), 1)?),
            0xa0..=0xbf => Token::Str(self.take(usize::from(marker & 0x1f))?),
            0xc0 => Token::Nil,
            0xc1 => return Err(DecodeError::new(start, "invalid msgpack byte 0xc1")),
            0xc2 => Token::Bool(false),
            0xc3 => Token::Bool(true),
            0xc4 => {
                let n = usize::from(self.byte()?);
                Token::Bin(self.take(n)?)
            }
            0xc5 => {
                let n = usize::from(self.be_u16()?);
                Token::Bin(self.take(n)?)
            }
            0xc6 => {
                let n = self.be_u32()? as usize;
                Token::Bin(self.take(n)?)
            }
            0xc7 => {
                let n = usize::from(self.byte()?);
                let t = self.byte()? as i8;
                Token::Ext(t, self.take(n)?)
            }
            0xc8 => {
                let n = usize::from(self.be_u16()?);
                let t = self.byte()? as i8;
                Token::Ext(t, self.take(n)?)
            }
            0xc9 => {
                let n = self.be_u32()? as usize;
                let t = self.byte()? as i8;
                Token::Ext(t, self.take(n)?)
            }
            0xca => Token::F32(f32::from_bits(self.be_u32()?)),
            0xcb => Token::F64(f64::from_bits(self.be_u64()?)),
            0xcc => Token::UInt(u64::from(self.byte()?)),
            0xcd => Token::UInt(u64::from(self.be_u16()?)),
            0xce => Token::UInt(u64::from(self.be_u32()?)),
            0xcf => Token::UInt(self.be_u64()?),
            0xd0 => Token::Int(i64::from(self.byte()? as i8)),
            0xd1 => Token::Int(i64::from(self.be_u16()? as i16)),
            0xd2 => Token::Int(i64::from(self.be_u32()? as i32)),
            0xd3 => Token::Int(self.be_u64()? as i64),
            0xd4..=0xd8 => {
                let n = 1usize << (marker - 0xd4);
                let t = self.byte()? as i8;
                Token::Ext(t, self.take(n)?)
            }
            0xd9 => {
                let n = usize::from(self.byte()?);
                Token::Str(self.take(n)?)
            }
            0xda => {
                let n = usize::from(self.be_u16()?);
                Token::Str(self.take(n)?)
            }
            0xdb => {
                let n = self.be_u32()? as usize;
                Token::Str(self.take(n)?)
            }
            0xdc => {
                let n = usize::from(self.be_u16()?);
                Token::Array(self.count(n, 1)?)
            }
            0xdd => {
                let n = self.be_u32()? as usize;
                Token::Array(self.count(n, 1)?)
            }
            0xde => {
                let n = usize::from(self.be_u16()?);
                Token::Map(self.count(n, 2)?)
            }
            0xdf => {
                let n = self.be_u32()? as usize;
                Token::Map(self.count(n, 2)?)
            }
            0xe0..=0xff => Token::Int(i64::from(marker as i8)),
        };
        Ok(token)
    }

    /// Skip one whole value (containers included) and return the bytes it spanned.
    pub fn skip_value(&mut self) -> DecodeResult<&'a [u8]> {
        let start = self.pos;
        // Iterative, so hostile nesting can not overflow the stack.
        let mut pending: usize = 1;
        let mut depth_stack: Vec<usize> = Vec::new();
        while pending > 0 {
            pending -= 1;
            match self.next_token()? {
                Token::Array(n) => {
                    depth_stack.push(pending);
                    pending = n;
                }
                Token::Map(n) => {
                    depth_stack.push(pending);
                    pending = n * 2;
                }
                _ => {}
            }
            if depth_stack.len() > MAX_DEPTH {
                return Err(self.error("msgpack nesting too deep"));
            }
            while pending == 0 {
                match depth_stack.pop() {
                    Some(p) => pending = p,
                    None => break,
                }
            }
        }
        Ok(&self.buf[start..self.pos])
    }

    pub fn read_map_len(&mut self, what: &str) -> DecodeResult<usize> {
        let at = self.pos;
        match self.next_token()? {
            Token::Map(n) => Ok(n),
            other => Err(DecodeError::new(
                at,
                format!("{what} must be a map, got {}", other.type_name()),
            )),
        }
    }

    /// A map key: a str (the only key type of the named encoding).
    pub fn read_key(&mut self) -> DecodeResult<&'a [u8]> {
        let at = self.pos;
        match self.next_token()? {
            Token::Str(s) => Ok(s),
            other => Err(DecodeError::new(
                at,
                format!("map key must be a str, got {}", other.type_name()),
            )),
        }
    }

    pub fn read_uint(&mut self, field: &str) -> DecodeResult<u64> {
        let at = self.pos;
        match self.next_token()? {
            Token::UInt(v) => Ok(v),
            Token::Int(v) if v >= 0 => Ok(v as u64),
            Token::Int(_) => Err(DecodeError::new(
                at,
                format!("{field} must not be negative"),
            )),
            other => Err(DecodeError::new(
                at,
                format!("{field} must be an unsigned int, got {}", other.type_name()),
            )),
        }
    }

    pub fn read_opt_uint(&mut self, field: &str) -> DecodeResult<Option<u64>> {
        if self.peek_nil() {
            self.pos += 1;
            return Ok(None);
        }
        self.read_uint(field).map(Some)
    }

    pub fn read_bool(&mut self, field: &str) -> DecodeResult<bool> {
        let at = self.pos;
        match self.next_token()? {
            Token::Bool(v) => Ok(v),
            other => Err(DecodeError::new(
                at,
                format!("{field} must be a bool, got {}", other.type_name()),
            )),
        }
    }

    pub fn read_str(&mut self, field: &str) -> DecodeResult<&'a str> {
        let at = self.pos;
        match self.next_token()? {
            Token::Str(s) => std::str::from_utf8(s)
                .map_err(|_| DecodeError::new(at, format!("{field} is not valid UTF-8"))),
            other => Err(DecodeError::new(
                at,
                format!("{field} must be a str, got {}", other.type_name()),
            )),
        }
    }

    pub fn read_opt_str(&mut self, field: &str) -> DecodeResult<Option<&'a str>> {
        if self.peek_nil() {
            self.pos += 1;
            return Ok(None);
        }
        self.read_str(field).map(Some)
    }

    pub fn read_bin(&mut self, field: &str) -> DecodeResult<&'a [u8]> {
        let at = self.pos;
        match self.next_token()? {
            Token::Bin(b) => Ok(b),
            other => Err(DecodeError::new(
                at,
                format!("{field} must be bin, got {}", other.type_name()),
            )),
        }
    }

    /// A float field: either width, or an integer (Python writes 0 for 0.0 sometimes).
    pub fn read_opt_float(&mut self, field: &str) -> DecodeResult<Option<f64>> {
        let at = self.pos;
        match self.next_token()? {
            Token::Nil => Ok(None),
            Token::F64(v) => Ok(Some(v)),
            Token::F32(v) => Ok(Some(f64::from(v))),
            Token::UInt(v) => Ok(Some(v as f64)),
            Token::Int(v) => Ok(Some(v as f64)),
            other => Err(DecodeError::new(
                at,
                format!("{field} must be a float, got {}", other.type_name()),
            )),
        }
    }

    pub fn peek_nil(&self) -> bool {
        self.buf.get(self.pos) == Some(&0xc0)
    }

    /// Fail unless every input byte was consumed.
    pub fn finish(&self) -> DecodeResult<()> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(self.error("trailing bytes after the msgpack value"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uint_widths_are_shortest() {
        for (value, expected) in [
            (0u64, vec![0x00]),
            (127, vec![0x7f]),
            (128, vec![0xcc, 0x80]),
            (255, vec![0xcc, 0xff]),
            (256, vec![0xcd, 0x01, 0x00]),
            (65_535, vec![0xcd, 0xff, 0xff]),
            (65_536, vec![0xce, 0x00, 0x01, 0x00, 0x00]),
            (1 << 32, vec![0xcf, 0, 0, 0, 1, 0, 0, 0, 0]),
        ] {
            let mut out = Vec::new();
            write_uint(&mut out, value);
            assert_eq!(out, expected, "{value}");
            assert_eq!(uint_len(value), expected.len());
            assert_eq!(Reader::new(&out).read_uint("v").unwrap(), value);
        }
    }

    #[test]
    fn negative_ints_round_trip() {
        for value in [
            -1i64,
            -32,
            -33,
            -128,
            -129,
            -32_768,
            -32_769,
            i64::from(i32::MIN) - 1,
        ] {
            let mut out = Vec::new();
            write_int(&mut out, value);
            match Reader::new(&out).next_token().unwrap() {
                Token::Int(v) => assert_eq!(v, value),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn str_and_bin_headers_match_their_lengths() {
        for len in [0usize, 31, 32, 255, 256, 65_535, 65_536] {
            let mut out = Vec::new();
            write_str_header(&mut out, len);
            assert_eq!(out.len(), str_header_len(len));
            let mut out = Vec::new();
            write_bin_header(&mut out, len);
            assert_eq!(out.len(), bin_header_len(len));
        }
    }

    #[test]
    fn skip_value_spans_nested_containers() {
        // {"a": [1, {"b": nil}], "c": b"xy"}
        let bytes = [
            0x82, 0xa1, b'a', 0x92, 0x01, 0x81, 0xa1, b'b', 0xc0, 0xa1, b'c', 0xc4, 0x02, b'x',
            b'y',
        ];
        let mut r = Reader::new(&bytes);
        assert_eq!(r.skip_value().unwrap(), &bytes[..]);
        assert!(r.is_empty());
    }

    #[test]
    fn hostile_lengths_are_rejected_without_allocation() {
        let bytes = [0xdd, 0xff, 0xff, 0xff, 0xff];
        assert!(Reader::new(&bytes).next_token().is_err());
        let bytes = [0xc6, 0xff, 0xff, 0xff, 0xff, 0x00];
        assert!(Reader::new(&bytes).next_token().is_err());
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let bytes = vec![0x91u8; 10_000];
        assert!(Reader::new(&bytes).skip_value().is_err());
    }

    #[test]
    fn reserved_byte_is_an_error() {
        assert!(Reader::new(&[0xc1]).next_token().is_err());
    }
}
