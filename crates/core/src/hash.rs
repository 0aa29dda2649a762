//! Content addresses. Every object in mado is named by the BLAKE3 hash of its
//! stored bytes; this module owns that 32-byte id and its hex spelling.

use std::fmt;
use std::str::FromStr;

/// A BLAKE3 content address (32 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hash(pub [u8; 32]);

impl Hash {
    pub const LEN: usize = 32;

    /// Hash of `bytes`: the key under which `bytes` is stored.
    pub fn of(bytes: &[u8]) -> Hash {
        Hash(*blake3::hash(bytes).as_bytes())
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(HEX[(b >> 4) as usize] as char);
            s.push(HEX[(b & 15) as usize] as char);
        }
        s
    }

    /// The first `n` hex digits, for display.
    pub fn short(&self) -> String {
        self.to_hex()[..12].to_string()
    }

    /// True when `bytes` hash to this id: the check made on every read.
    pub fn verifies(&self, bytes: &[u8]) -> bool {
        Hash::of(bytes) == *self
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({})", self.short())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not an object id (64 hex digits): {0:?}")]
pub struct ParseHashError(pub String);

/// Parses hex digits (either case) into bytes; `None` on odd length or a bad digit.
pub fn parse_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes().chunks(2).map(|p| Some(digit(p[0])? << 4 | digit(p[1])?)).collect()
}

impl FromStr for Hash {
    type Err = ParseHashError;
    fn from_str(s: &str) -> Result<Hash, ParseHashError> {
        let bytes = parse_hex(s).filter(|b| b.len() == 32);
        match bytes {
            Some(b) => {
                let mut h = [0u8; 32];
                h.copy_from_slice(&b);
                Ok(Hash(h))
            }
            None => Err(ParseHashError(s.to_string())),
        }
    }
}

/// The first 12 characters of an id written in hex, as ids are shown
/// (`Hash::short`); all of a shorter string.
pub fn short_hex(hex: &str) -> &str {
    hex.get(..12).unwrap_or(hex)
}

/// True when `s` is a non-empty string of lowercase or uppercase hex digits.
pub fn is_hex_prefix(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|c| c.is_ascii_hexdigit())
}

/// An id of one kind of object: the same 32 bytes as a [`Hash`], but a
/// distinct type, so that a snapshot id cannot be passed where a tree id
/// is expected (jj names its ids the same way). It derefs to the plain
/// address a store is asked for; `Kind::from_hash` says, where an id is
/// made, which kind of object the address names.
macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Hash);

        impl $name {
            pub const fn from_hash(h: Hash) -> $name {
                $name(h)
            }
            pub const fn hash(&self) -> Hash {
                self.0
            }
        }

        /// A typed id reads as the plain address wherever any address will
        /// do (a store's get, a cache lookup); the other way, a plain hash
        /// becomes a typed id only through `from_hash`.
        impl std::ops::Deref for $name {
            type Target = Hash;
            fn deref(&self) -> &Hash {
                &self.0
            }
        }

        impl From<$name> for Hash {
            fn from(id: $name) -> Hash {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0.short())
            }
        }

        impl FromStr for $name {
            type Err = ParseHashError;
            fn from_str(s: &str) -> Result<$name, ParseHashError> {
                s.parse::<Hash>().map($name)
            }
        }
    };
}

id_type!(
    /// The id of a snapshot object (`Snapshot`): what a ref names.
    ///
    /// A ref takes its snapshot and its root in that order:
    /// ```
    /// use mado_core::{object::RefValue, Hash, SnapshotId, TreeId};
    /// let (s, t) = (SnapshotId::from_hash(Hash::of(b"s")), TreeId::from_hash(Hash::of(b"t")));
    /// assert_eq!(RefValue::new(s, t).root, t);
    /// ```
    /// and the two swapped do not compile:
    /// ```compile_fail
    /// use mado_core::{object::RefValue, Hash, SnapshotId, TreeId};
    /// let (s, t) = (SnapshotId::from_hash(Hash::of(b"s")), TreeId::from_hash(Hash::of(b"t")));
    /// RefValue::new(t, s);
    /// ```
    SnapshotId
);
id_type!(
    /// The id of a tree object (a directory listing), e.g. a snapshot's root.
    TreeId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_known_vector() {
        // BLAKE3 of the empty input, from the BLAKE3 specification's test vectors.
        let h = Hash::of(b"");
        assert_eq!(h.to_hex(), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");
        assert_eq!(h.to_hex().parse::<Hash>().unwrap(), h);
        assert!(h.verifies(b""));
        assert!(!h.verifies(b"x"));
    }

    #[test]
    fn rejects_bad_hex() {
        assert!("zz".parse::<Hash>().is_err());
        assert!("abc".parse::<Hash>().is_err());
        assert!("".parse::<Hash>().is_err());
        assert!(!is_hex_prefix("xyz"));
        assert!(is_hex_prefix("aB09"));
    }
}
