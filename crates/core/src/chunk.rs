//! Splitting large files into content-defined chunks (FastCDC, the 2020
//! variant) so an edit in the middle of a big file re-uploads only the
//! chunks around it.
//!
//! Files of at most [`CHUNK_THRESHOLD`] bytes are stored whole: one object,
//! one GET. Above it, a file becomes chunks of 256 KiB..4 MiB (1 MiB on
//! average) plus a [`ChunkManifest`]. The threshold equals the largest
//! chunk, so a chunked file always has at least two chunks' worth of data.
//! These parameters are part of the format: changing them changes the ids
//! of every chunked file imported afterwards (old ids stay readable).

use crate::hash::Hash;
use crate::object::ChunkManifest;

pub const CHUNK_THRESHOLD: u64 = 4 << 20;
pub const CHUNK_MIN: u32 = 256 << 10;
pub const CHUNK_AVG: u32 = 1 << 20;
pub const CHUNK_MAX: u32 = 4 << 20;

/// A file as stored: either one blob, or chunks plus a manifest.
pub enum Split<'a> {
    Whole { id: Hash },
    Chunked { manifest: ChunkManifest, encoded: Vec<u8>, id: Hash, chunks: Vec<(Hash, &'a [u8])> },
}

pub fn needs_chunking(len: u64) -> bool {
    len > CHUNK_THRESHOLD
}

/// Splits `data` as mado stores it.
pub fn split(data: &[u8]) -> Split<'_> {
    if !needs_chunking(data.len() as u64) {
        return Split::Whole { id: Hash::of(data) };
    }
    let chunks: Vec<(Hash, &[u8])> = fastcdc::v2020::FastCDC::new(data, CHUNK_MIN, CHUNK_AVG, CHUNK_MAX)
        .map(|c| {
            let piece = &data[c.offset..c.offset + c.length];
            (Hash::of(piece), piece)
        })
        .collect();
    let manifest = ChunkManifest {
        size: data.len() as u64,
        content: Hash::of(data),
        chunks: chunks.iter().map(|(h, p)| (p.len() as u64, *h)).collect(),
    };
    let encoded = manifest.encode();
    let id = Hash::of(&encoded);
    Split::Chunked { manifest, encoded, id, chunks }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn small_files_are_whole() {
        assert!(matches!(split(b"hello"), Split::Whole { .. }));
        assert!(matches!(split(&vec![0u8; CHUNK_THRESHOLD as usize]), Split::Whole { .. }));
    }

    #[test]
    fn large_files_chunk_and_reassemble() {
        let data = pseudo_random(10 << 20, 1);
        let Split::Chunked { manifest, chunks, .. } = split(&data) else { panic!("not chunked") };
        assert!(chunks.len() >= 3);
        let joined: Vec<u8> = chunks.iter().flat_map(|(_, p)| p.iter().copied()).collect();
        assert_eq!(joined, data);
        assert_eq!(manifest.size, data.len() as u64);
        assert!(chunks.iter().all(|(_, p)| p.len() <= CHUNK_MAX as usize));
    }

    #[test]
    fn an_edit_in_the_middle_keeps_most_chunks() {
        let a = pseudo_random(12 << 20, 2);
        let mut b = a.clone();
        b[6 << 20] ^= 0xff;
        let ids = |d: &[u8]| match split(d) {
            Split::Chunked { chunks, .. } => chunks.iter().map(|(h, _)| *h).collect::<Vec<_>>(),
            _ => unreachable!(),
        };
        let (ia, ib) = (ids(&a), ids(&b));
        let shared = ib.iter().filter(|h| ia.contains(h)).count();
        assert!(shared + 2 >= ib.len(), "shared {shared} of {}", ib.len());
    }
}
