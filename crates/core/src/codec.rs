//! The byte-level building blocks shared by every mado format: LEB128
//! varints, length-prefixed byte strings and fixed ids, written into a
//! `Vec<u8>` and read back by a bounds-checked [`Reader`] that returns an
//! error (never panics) on truncated or oversized input.

use crate::hash::Hash;

/// Why a byte string could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum DecodeError {
    #[error("bad magic: expected {expected:?}")]
    BadMagic { expected: &'static str },
    #[error("unsupported {format} version {version} (this build reads version {supported})")]
    Version { format: &'static str, version: u8, supported: u8 },
    #[error("truncated at byte {0}")]
    Truncated(usize),
    #[error("varint overflows 64 bits at byte {0}")]
    VarintOverflow(usize),
    #[error("{0} trailing bytes after the end")]
    Trailing(usize),
    #[error("{0}")]
    Invalid(String),
}

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

pub fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A cursor over untrusted bytes.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::Truncated(self.buf.len()));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub fn i64_le(&mut self) -> Result<i64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_le_bytes(a))
    }

    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        let start = self.pos;
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            let bits = (byte & 0x7f) as u64;
            if shift == 63 && bits > 1 {
                return Err(DecodeError::VarintOverflow(start));
            }
            v |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::VarintOverflow(start))
    }

    /// A varint that must fit the remaining input when used as a count of
    /// items at least `min_item` bytes long: stops hostile lengths from
    /// driving huge allocations.
    pub fn count(&mut self, min_item: usize) -> Result<usize, DecodeError> {
        let at = self.pos;
        let n = self.varint()?;
        let fits = (n as u128) * (min_item.max(1) as u128) <= self.remaining() as u128;
        if !fits {
            return Err(DecodeError::Truncated(at));
        }
        Ok(n as usize)
    }

    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.count(1)?;
        self.take(n)
    }

    pub fn hash(&mut self) -> Result<Hash, DecodeError> {
        let mut h = [0u8; 32];
        h.copy_from_slice(self.take(32)?);
        Ok(Hash(h))
    }

    pub fn magic(&mut self, magic: &'static [u8; 4]) -> Result<(), DecodeError> {
        let got =
            self.take(4).map_err(|_| DecodeError::BadMagic { expected: std::str::from_utf8(magic).unwrap_or("?") })?;
        if got != magic {
            return Err(DecodeError::BadMagic { expected: std::str::from_utf8(magic).unwrap_or("?") });
        }
        Ok(())
    }

    pub fn version(&mut self, format: &'static str, supported: u8) -> Result<(), DecodeError> {
        let version = self.u8()?;
        if version != supported {
            return Err(DecodeError::Version { format, version, supported });
        }
        Ok(())
    }

    pub fn finish(self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trip() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            let mut r = Reader::new(&out);
            assert_eq!(r.varint().unwrap(), v);
            r.finish().unwrap();
        }
    }

    #[test]
    fn varint_rejects_overflow_and_truncation() {
        let too_long = [0xffu8; 11];
        assert!(matches!(
            Reader::new(&too_long).varint(),
            Err(DecodeError::VarintOverflow(_)) | Err(DecodeError::Truncated(_))
        ));
        let mut tenth_byte_too_big = vec![0xffu8; 9];
        tenth_byte_too_big.push(0x02);
        assert_eq!(Reader::new(&tenth_byte_too_big).varint(), Err(DecodeError::VarintOverflow(0)));
        assert_eq!(Reader::new(&[0x80]).varint(), Err(DecodeError::Truncated(1)));
    }

    #[test]
    fn hostile_count_is_refused_before_allocating() {
        let mut out = Vec::new();
        put_varint(&mut out, u64::MAX / 2);
        assert!(Reader::new(&out).count(32).is_err());
        assert!(Reader::new(&out).bytes().is_err());
    }
}
