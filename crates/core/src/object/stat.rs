//! The stat object (`MADF`, docs/FORMAT.md): a snapshot's file times by
//! path, kept outside trees so that two workspaces with the same content
//! share every tree.

use crate::codec::{put_bytes, put_varint, DecodeError, Reader};

const STAT_MAGIC: &[u8; 4] = b"MADF";

/// Per-snapshot file times: (path, seconds, nanoseconds), sorted by path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatObject {
    pub entries: Vec<(Vec<u8>, i64, u32)>,
}

impl StatObject {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.entries.len() * 24);
        out.extend_from_slice(STAT_MAGIC);
        out.push(1);
        put_varint(&mut out, self.entries.len() as u64);
        for (p, s, n) in &self.entries {
            put_bytes(&mut out, p);
            out.extend_from_slice(&s.to_le_bytes());
            put_varint(&mut out, *n as u64);
        }
        out
    }

    pub fn decode(buf: &[u8]) -> Result<StatObject, DecodeError> {
        let mut r = Reader::new(buf);
        r.magic(STAT_MAGIC)?;
        r.version("stat object", 1)?;
        let n = r.count(10)?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let p = r.bytes()?.to_vec();
            if p.split(|c| *c == b'/').any(|seg| seg == b".." || seg == b".") || p.starts_with(b"/") || p.contains(&0) {
                return Err(DecodeError::Invalid(format!("bad path {:?}", String::from_utf8_lossy(&p))));
            }
            let s = r.i64_le()?;
            let nanos = r.varint()?;
            if nanos >= 1_000_000_000 {
                return Err(DecodeError::Invalid("nanoseconds out of range".into()));
            }
            entries.push((p, s, nanos as u32));
        }
        r.finish()?;
        Ok(StatObject { entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Lease;

    #[test]
    fn stat_object_golden_and_hostile() {
        let s = StatObject { entries: vec![(b"".to_vec(), 5, 0), (b"a/b".to_vec(), 1_700_000_000, 123)] };
        let enc = s.encode();
        let hex: String = enc.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "4d41444601020005000000000000000003612f6200f15365000000007b");
        assert_eq!(StatObject::decode(&enc).unwrap(), s);
        for bad in [&b"../x"[..], b"/etc", b"a/../b", b"a\0"] {
            let t = StatObject { entries: vec![(bad.to_vec(), 0, 0)] };
            assert!(StatObject::decode(&t.encode()).is_err(), "{bad:?}");
        }
        for cut in 0..enc.len() {
            assert!(StatObject::decode(&enc[..cut]).is_err());
        }
        let l = Lease { holder: "me".into(), expires: 9 };
        assert_eq!(Lease::decode(&l.encode()).unwrap(), l);
    }
}
