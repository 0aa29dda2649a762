//! The workspace lease (`MADL`, docs/FORMAT.md): who may checkpoint a
//! workspace, and until when.

use crate::codec::{put_bytes, DecodeError, Reader};

const LEASE_MAGIC: &[u8; 4] = b"MADL";

/// A workspace lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub holder: String,
    /// Seconds since the epoch.
    pub expires: i64,
}

impl Lease {
    /// Version 2: version 1's fields, then a BLAKE3 checksum of every byte
    /// before it (a flipped bit in a version 1 lease named another holder,
    /// and locked the real one out).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = LEASE_MAGIC.to_vec();
        out.push(2);
        put_bytes(&mut out, self.holder.as_bytes());
        out.extend_from_slice(&self.expires.to_le_bytes());
        let sum = crate::hash::Hash::of(&out);
        out.extend_from_slice(sum.as_bytes());
        out
    }
    /// Reads version 2 (checksum verified) and version 1 (none to verify).
    pub fn decode(buf: &[u8]) -> Result<Lease, DecodeError> {
        let version = match buf.get(..5) {
            Some([m @ .., v]) if m == LEASE_MAGIC => *v,
            _ => 0,
        };
        let body = match version {
            2 => {
                if buf.len() < 5 + 32 {
                    return Err(DecodeError::Invalid("a lease too short for its checksum".into()));
                }
                let (body, sum) = buf.split_at(buf.len() - 32);
                if crate::hash::Hash::of(body).as_bytes() != sum {
                    return Err(DecodeError::Invalid("checksum mismatch: the lease is damaged".into()));
                }
                body
            }
            _ => buf,
        };
        let mut r = Reader::new(body);
        r.magic(LEASE_MAGIC)?;
        if version != 2 {
            r.version("lease", 1)?;
        } else {
            r.u8()?;
        }
        let holder = String::from_utf8(r.bytes()?.to_vec()).map_err(|_| DecodeError::Invalid("holder".into()))?;
        let expires = r.i64_le()?;
        r.finish()?;
        Ok(Lease { holder, expires })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every single flipped bit of a lease is caught; version 1 still reads.
    #[test]
    fn a_damaged_lease_never_decodes_as_another_holder() {
        let l = Lease { holder: "me@host:/w:0a1b2c3d".into(), expires: 1_800_000_000 };
        let b = l.encode();
        assert_eq!(Lease::decode(&b).unwrap(), l);
        for i in 0..b.len() * 8 {
            let mut x = b.clone();
            x[i / 8] ^= 1 << (i % 8);
            assert!(Lease::decode(&x).is_err(), "bit {i} flipped still decodes");
        }
        let mut v1 = LEASE_MAGIC.to_vec();
        v1.push(1);
        put_bytes(&mut v1, l.holder.as_bytes());
        v1.extend_from_slice(&l.expires.to_le_bytes());
        assert_eq!(Lease::decode(&v1).unwrap(), l);
        assert!(Lease::decode(&b[..b.len() - 1]).is_err());
    }
}
