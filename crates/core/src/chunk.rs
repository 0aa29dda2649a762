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

/// What [`split_stream`] found: a small file is handed back whole (it fits
/// in memory by definition); a large one was delivered chunk by chunk.
pub enum Streamed {
    Whole { data: Vec<u8> },
    Chunked { encoded: Vec<u8>, id: Hash, chunks: Vec<Hash>, size: u64 },
}

/// Splits what `reader` yields exactly as [`split`] splits the same bytes,
/// holding a few chunks (each ≤ [`CHUNK_MAX`]) in memory: each chunk goes
/// to `sink` as soon as its end is found. So a 20 GB file is hashed,
/// chunked and stored in the same memory as a 5 MB one. Two threads share
/// the work: this one reads and finds cut points, a second hashes each
/// chunk and hands it to `sink`. `what` names the source in an error
/// ("reading {what}").
pub fn split_stream(
    mut reader: impl std::io::Read,
    what: &str,
    mut sink: impl FnMut(&Hash, &[u8]) -> crate::error::Result<()> + Send,
) -> crate::error::Result<Streamed> {
    use crate::error::Error;
    use std::io::Read;
    let io_err = |e: std::io::Error| Error::Io { context: format!("reading {what}"), source: e };
    // A file of at most the threshold is stored whole: read one byte more
    // than that to know which it is.
    let mut head = Vec::new();
    (&mut reader).take(CHUNK_THRESHOLD + 1).read_to_end(&mut head).map_err(io_err)?;
    if !needs_chunking(head.len() as u64) {
        return Ok(Streamed::Whole { data: head });
    }
    let joined = std::io::Cursor::new(head).chain(reader);
    let (chunks, content) = std::thread::scope(|s| {
        // Two chunks queued at most: memory stays at a few chunks.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(2);
        let worker = s.spawn(move || -> crate::error::Result<(Vec<(u64, Hash)>, Hash)> {
            let mut content = blake3::Hasher::new();
            let mut chunks = Vec::new();
            for data in rx {
                let id = Hash::of(&data);
                content.update(&data);
                sink(&id, &data)?;
                chunks.push((data.len() as u64, id));
            }
            Ok((chunks, Hash(*content.finalize().as_bytes())))
        });
        let mut failed = None;
        for c in fastcdc::v2020::StreamCDC::new(joined, CHUNK_MIN, CHUNK_AVG, CHUNK_MAX) {
            match c {
                Ok(c) => {
                    if tx.send(c.data).is_err() {
                        // The worker failed, and says why below.
                        break;
                    }
                }
                Err(fastcdc::v2020::Error::IoError(e)) => failed = Some(io_err(e)),
                Err(other) => failed = Some(io_err(std::io::Error::other(other.to_string()))),
            }
            if failed.is_some() {
                break;
            }
        }
        drop(tx);
        let done = worker.join().map_err(|_| Error::Internal("the chunk hashing thread panicked".into()))??;
        match failed {
            Some(e) => Err(e),
            None => Ok(done),
        }
    })?;
    let manifest = ChunkManifest { size: chunks.iter().map(|(n, _)| n).sum(), content, chunks };
    let encoded = manifest.encode();
    let id = Hash::of(&encoded);
    let ids = manifest.chunks.iter().map(|(_, h)| *h).collect();
    Ok(Streamed::Chunked { size: manifest.size, encoded, id, chunks: ids })
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
pub(crate) mod tests {
    use super::*;

    /// Reproducible incompressible bytes (xorshift; a seed of 0 gives zeros).
    pub(crate) fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
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

    /// The streaming splitter must cut exactly where the in-memory one
    /// does, or the same file would get two ids depending on its path in.
    #[test]
    fn streaming_split_matches_the_in_memory_split() {
        let t = CHUNK_THRESHOLD as usize;
        for (n, seed) in [(0, 1), (5, 2), (t, 3), (t + 1, 4), (t + 4096, 5), (13 << 20, 6), (9 << 20, 7)] {
            let data = pseudo_random(n, seed);
            // A reader that hands out odd-sized pieces, as pipes do.
            struct Dribble<'a>(&'a [u8], usize);
            impl std::io::Read for Dribble<'_> {
                fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                    self.1 = self.1 % 7919 + 1;
                    let k = self.1.min(buf.len()).min(self.0.len());
                    buf[..k].copy_from_slice(&self.0[..k]);
                    self.0 = &self.0[k..];
                    Ok(k)
                }
            }
            let mut seen = Vec::new();
            let got = split_stream(Dribble(&data, 0), "a test file", |id, piece| {
                assert!(id.verifies(piece));
                seen.push((*id, piece.to_vec()));
                Ok(())
            })
            .unwrap();
            match (split(&data), got) {
                (Split::Whole { id }, Streamed::Whole { data: d }) => {
                    assert_eq!(Hash::of(&d), id, "size {n}");
                    assert!(seen.is_empty());
                }
                (
                    Split::Chunked { encoded, id, chunks, .. },
                    Streamed::Chunked { encoded: e2, id: id2, chunks: c2, size },
                ) => {
                    assert_eq!((id, encoded), (id2, e2), "size {n}");
                    assert_eq!(chunks.iter().map(|(h, _)| *h).collect::<Vec<_>>(), c2);
                    assert_eq!(seen.iter().map(|(h, _)| *h).collect::<Vec<_>>(), c2);
                    assert_eq!(seen.concat_pieces(), data);
                    assert_eq!(size, n as u64);
                }
                _ => panic!("size {n}: the two splitters disagree on whole versus chunked"),
            }
        }
    }

    trait Concat {
        fn concat_pieces(&self) -> Vec<u8>;
    }
    impl Concat for Vec<(Hash, Vec<u8>)> {
        fn concat_pieces(&self) -> Vec<u8> {
            self.iter().flat_map(|(_, p)| p.iter().copied()).collect()
        }
    }

    #[test]
    fn a_failing_sink_or_reader_stops_the_split() {
        let data = pseudo_random(10 << 20, 9);
        let mut calls = 0;
        let r = split_stream(&data[..], "a test file", |_, _| {
            calls += 1;
            Err(crate::error::Error::Internal("disk full".into()))
        });
        assert!(r.is_err() && calls == 1);
        struct Broken;
        impl std::io::Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("device gone"))
            }
        }
        let e = split_stream(Broken, "the broken file", |_, _| Ok(())).err().unwrap().to_string();
        assert!(e.contains("device gone") && e.contains("the broken file"), "{e}");
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
