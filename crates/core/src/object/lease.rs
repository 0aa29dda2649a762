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
    pub fn encode(&self) -> Vec<u8> {
        let mut out = LEASE_MAGIC.to_vec();
        out.push(1);
        put_bytes(&mut out, self.holder.as_bytes());
        out.extend_from_slice(&self.expires.to_le_bytes());
        out
    }
    pub fn decode(buf: &[u8]) -> Result<Lease, DecodeError> {
        let mut r = Reader::new(buf);
        r.magic(LEASE_MAGIC)?;
        r.version("lease", 1)?;
        let holder = String::from_utf8(r.bytes()?.to_vec()).map_err(|_| DecodeError::Invalid("holder".into()))?;
        let expires = r.i64_le()?;
        r.finish()?;
        Ok(Lease { holder, expires })
    }
}
