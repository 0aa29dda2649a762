//! Splitting large files into content-defined chunks (FastCDC, the 2020
//! variant) so an edit in the middle of a big file re-uploads only the
//! chunks around it, and leaving their long runs of zeros out as holes.
//!
//! Files of at most [`CHUNK_THRESHOLD`] bytes are stored whole: one object,
//! one GET. Above it, a file becomes chunks of 256 KiB..4 MiB (1 MiB on
//! average) plus a [`ChunkManifest`]. The threshold equals the largest
//! chunk, so a chunked file always has at least two chunks' worth of data.
//!
//! Holes: a large file is seen as blocks of [`HOLE_BLOCK`] bytes at
//! multiples of [`HOLE_BLOCK`]. A run of whole blocks of zeros at least
//! [`HOLE_MIN`] long is a hole: a manifest piece with a length and no
//! chunk. The data between holes is chunked segment by segment. So a
//! sparse file's holes are neither stored nor hashed nor fetched, and
//! where its holes are is a function of its bytes alone, not of how the
//! filesystem happened to allocate them: a sparse file and a dense copy of
//! it get the same id. Reading a file, the holes the filesystem reports
//! (`SEEK_DATA`/`SEEK_HOLE`) are taken as zeros without reading them, so
//! the work follows the data.
//!
//! These parameters are part of the format: changing them changes the ids
//! of every chunked file imported afterwards (old ids stay readable).

use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::object::ChunkManifest;

pub const CHUNK_THRESHOLD: u64 = 4 << 20;
pub const CHUNK_MIN: u32 = 256 << 10;
pub const CHUNK_AVG: u32 = 1 << 20;
pub const CHUNK_MAX: u32 = 4 << 20;
/// The unit in which a large file's zeros are found.
pub const HOLE_BLOCK: u64 = 64 << 10;
/// The shortest run of zero blocks that is a hole: shorter runs stay in
/// the data, so a file with scattered zero blocks is not cut into many
/// small segments.
pub const HOLE_MIN: u64 = 1 << 20;

/// A file as stored: either one blob, or chunks plus a manifest (each
/// chunk with its bytes, which are a slice of the file).
pub enum Split<'a> {
    Whole { id: Hash },
    Chunked { manifest: ChunkManifest, encoded: Vec<u8>, id: Hash, chunks: Vec<(Hash, &'a [u8])> },
}

/// What [`split_stream`] found: a small file is handed back whole (it fits
/// in memory by definition); a large one was delivered chunk by chunk.
pub enum Streamed {
    Whole {
        data: Vec<u8>,
    },
    /// `chunks`: the ids of the chunks with bytes, in file order; `size`
    /// counts the holes too.
    Chunked {
        encoded: Vec<u8>,
        id: Hash,
        chunks: Vec<Hash>,
        size: u64,
    },
}

/// A piece of a large file the [`Cutter`] found, in file order.
enum Cut {
    Data(Vec<u8>),
    Hole(u64),
}

/// Finds a large file's holes and chunk cuts from its blocks, given in
/// file order from offset 0: each whole [`HOLE_BLOCK`] (the last may be
/// shorter) as bytes ([`Cutter::block`]), or, where the reader knows them
/// to be zeros, as a count ([`Cutter::zero_blocks`]). Holds at most one
/// chunk's worth of the segment being cut, and counts zeros rather than
/// holding them.
struct Cutter<F: FnMut(Cut) -> Result<()>> {
    emit: F,
    /// The data segment being cut, from `from` on (what is before `from`
    /// was cut already).
    seg: Vec<u8>,
    from: usize,
    /// Zero bytes in the run of whole zero blocks seen last.
    zeros: u64,
}

impl<F: FnMut(Cut) -> Result<()>> Cutter<F> {
    fn new(emit: F) -> Self {
        Cutter { emit, seg: Vec::with_capacity(2 * CHUNK_MAX as usize), from: 0, zeros: 0 }
    }

    fn block(&mut self, b: &[u8]) -> Result<()> {
        if b.len() as u64 == HOLE_BLOCK && b.iter().all(|&x| x == 0) {
            return self.zero_blocks(1);
        }
        self.settle_zeros()?;
        self.seg.extend_from_slice(b);
        self.cut(false)
    }

    fn zero_blocks(&mut self, n: u64) -> Result<()> {
        let before = self.zeros;
        self.zeros += n * HOLE_BLOCK;
        if before < HOLE_MIN && self.zeros >= HOLE_MIN {
            // A hole for sure now: the data before it is a segment.
            self.cut(true)?;
        }
        Ok(())
    }

    /// The run of zeros before the bytes that come next: a hole, or data.
    fn settle_zeros(&mut self) -> Result<()> {
        let z = std::mem::take(&mut self.zeros);
        if z >= HOLE_MIN {
            (self.emit)(Cut::Hole(z))
        } else if z > 0 {
            self.seg.resize(self.seg.len() + z as usize, 0);
            self.cut(false)
        } else {
            Ok(())
        }
    }

    /// Cuts the segment's chunks whose end is known: those that start at
    /// least [`CHUNK_MAX`] bytes before the end of what is held (FastCDC
    /// looks no further than that from a chunk's start, so these cuts are
    /// the ones a cut of the whole segment makes), or `all` at the
    /// segment's end.
    fn cut(&mut self, all: bool) -> Result<()> {
        loop {
            let pending = &self.seg[self.from..];
            if pending.is_empty() || (!all && pending.len() < CHUNK_MAX as usize) {
                break;
            }
            let c = fastcdc::v2020::FastCDC::new(pending, CHUNK_MIN, CHUNK_AVG, CHUNK_MAX)
                .next()
                .expect("FastCDC cuts a chunk from bytes that are there");
            let piece = pending[..c.length].to_vec();
            self.from += c.length;
            (self.emit)(Cut::Data(piece))?;
        }
        if self.from == self.seg.len() || self.from >= CHUNK_MAX as usize {
            self.seg.drain(..self.from);
            self.from = 0;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        self.settle_zeros()?;
        self.cut(true)
    }
}

/// Reads into `buf` until it is full or the reader ends; how many bytes.
fn fill(reader: &mut impl std::io::Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match reader.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
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
    sink: impl FnMut(&Hash, &[u8]) -> Result<()> + Send,
) -> Result<Streamed> {
    use std::io::Read;
    let io_err = |e: std::io::Error| Error::Io { context: format!("reading {what}"), source: e };
    // A file of at most the threshold is stored whole: read one byte more
    // than that to know which it is.
    let mut head = Vec::new();
    (&mut reader).take(CHUNK_THRESHOLD + 1).read_to_end(&mut head).map_err(io_err)?;
    if !needs_chunking(head.len() as u64) {
        return Ok(Streamed::Whole { data: head });
    }
    let mut joined = std::io::Cursor::new(head).chain(reader);
    chunked(sink, |cutter| {
        let mut buf = vec![0u8; HOLE_BLOCK as usize];
        loop {
            let n = fill(&mut joined, &mut buf).map_err(io_err)?;
            if n > 0 {
                cutter.block(&buf[..n])?;
            }
            if n < buf.len() {
                return Ok(());
            }
        }
    })
}

/// Splits the regular file `file` as [`split_stream`] would split its
/// bytes, but without reading what the filesystem reports as holes
/// (`SEEK_DATA`, `SEEK_HOLE`): a 10 GiB file with 1 MiB of data costs
/// what the 1 MiB costs. Read with `pread`, from offset 0 whatever the
/// file's position.
pub fn split_file(
    file: &std::fs::File,
    what: &str,
    sink: impl FnMut(&Hash, &[u8]) -> Result<()> + Send,
) -> Result<Streamed> {
    use std::os::unix::fs::FileExt;
    let io_err = |e: std::io::Error| Error::Io { context: format!("reading {what}"), source: e };
    let meta = file.metadata().map_err(io_err)?;
    let size = meta.len();
    // Holes are asked for only where the filesystem holds fewer blocks than
    // the length: a dense file is read through, and a filesystem that
    // wrongly reports holes over unsynced data (OpenZFS before 2.2.2) cannot
    // make a dense file read as zeros.
    let sparse = {
        use std::os::unix::fs::MetadataExt;
        meta.blocks().saturating_mul(512) < size
    };
    if !needs_chunking(size) {
        struct At<'a>(&'a std::fs::File, u64);
        impl std::io::Read for At<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.read_at(buf, self.1)?;
                self.1 += n as u64;
                Ok(n)
            }
        }
        return split_stream(At(file, 0), what, sink);
    }
    chunked(sink, |cutter| {
        let mut buf = vec![0u8; HOLE_BLOCK as usize];
        let mut at = 0u64;
        while at < size {
            // Where the next data is: the whole blocks before it are zeros.
            let data = match sparse.then(|| rustix::fs::seek(file, rustix::fs::SeekFrom::Data(at))) {
                Some(Ok(d)) => d.min(size),
                // No data from `at` to the end as it is now: zeros to there
                // (if the file got shorter since its length was taken, it
                // ends there: the read below finds its end).
                Some(Err(rustix::io::Errno::NXIO)) => file.metadata().map_err(io_err)?.len().clamp(at, size),
                // Not sparse, or no SEEK_DATA here: every byte is read.
                _ => at,
            };
            let zero_to = data / HOLE_BLOCK * HOLE_BLOCK;
            if zero_to > at {
                cutter.zero_blocks((zero_to - at) / HOLE_BLOCK)?;
                at = zero_to;
                continue;
            }
            // Read the blocks from here to the next hole.
            let hole = match sparse {
                true => rustix::fs::seek(file, rustix::fs::SeekFrom::Hole(data)).map_or(size, |h| h.min(size)),
                false => size,
            };
            let to = hole.div_ceil(HOLE_BLOCK).saturating_mul(HOLE_BLOCK).min(size).max(at + 1);
            while at < to {
                let want = (size - at).min(HOLE_BLOCK) as usize;
                let n = read_full_at(file, &mut buf[..want], at).map_err(io_err)?;
                if n > 0 {
                    cutter.block(&buf[..n])?;
                }
                if n < want {
                    // The file got shorter: it ends here.
                    return Ok(());
                }
                at += n as u64;
            }
        }
        Ok(())
    })
}

fn read_full_at(file: &std::fs::File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A manifest's pieces: (length, chunk id or `None` for a hole).
type Pieces = Vec<(u64, Option<Hash>)>;

/// Runs `feed` on a [`Cutter`] on this thread while a second thread hashes
/// each chunk it cuts and hands it to `sink`; the manifest of what was
/// fed.
fn chunked<S, Feed>(mut sink: S, feed: Feed) -> Result<Streamed>
where
    S: FnMut(&Hash, &[u8]) -> Result<()> + Send,
    Feed: FnOnce(&mut Cutter<Box<dyn FnMut(Cut) -> Result<()> + '_>>) -> Result<()>,
{
    let (pieces, content) = std::thread::scope(|s| {
        // Two chunks queued at most: memory stays at a few chunks.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Cut>(2);
        let worker = s.spawn(move || -> Result<(Pieces, Option<Hash>)> {
            let mut content = Some(blake3::Hasher::new());
            let mut pieces = Vec::new();
            for cut in rx {
                match cut {
                    Cut::Data(data) => {
                        let id = Hash::of(&data);
                        if let Some(c) = &mut content {
                            c.update(&data);
                        }
                        sink(&id, &data)?;
                        pieces.push((data.len() as u64, Some(id)));
                    }
                    Cut::Hole(n) => {
                        content = None;
                        pieces.push((n, None));
                    }
                }
            }
            Ok((pieces, content.map(|c| Hash(*c.finalize().as_bytes()))))
        });
        // A send fails only when the worker stopped, and it says why.
        let emit: Box<dyn FnMut(Cut) -> Result<()>> =
            Box::new(move |cut| tx.send(cut).map_err(|_| Error::Internal("the chunk hashing thread stopped".into())));
        let mut cutter = Cutter::new(emit);
        let fed = feed(&mut cutter).and_then(|()| cutter.finish());
        let done = worker.join().map_err(|_| Error::Internal("the chunk hashing thread panicked".into()))?;
        match (fed, done) {
            // The worker's own failure (the sink's) explains a failed send.
            (_, Err(e)) => Err(e),
            (Err(e), Ok(_)) => Err(e),
            (Ok(()), Ok(done)) => Ok(done),
        }
    })?;
    let manifest = ChunkManifest { size: pieces.iter().map(|(n, _)| n).sum(), content, chunks: pieces };
    let encoded = manifest.encode();
    let id = Hash::of(&encoded);
    let ids = manifest.data_chunks().collect();
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
    let mut spans: Vec<(u64, u64, Option<Hash>)> = Vec::new();
    let mut at = 0u64;
    let mut cutter = Cutter::new(|cut| {
        let (len, id) = match cut {
            Cut::Data(d) => (d.len() as u64, Some(Hash::of(&d))),
            Cut::Hole(n) => (n, None),
        };
        spans.push((at, len, id));
        at += len;
        Ok(())
    });
    for b in data.chunks(HOLE_BLOCK as usize) {
        cutter.block(b).expect("cutting in memory does not fail");
    }
    cutter.finish().expect("cutting in memory does not fail");
    let chunks: Vec<(Hash, &[u8])> =
        spans.iter().filter_map(|&(o, n, id)| Some((id?, &data[o as usize..(o + n) as usize]))).collect();
    let holes = spans.iter().any(|s| s.2.is_none());
    let manifest = ChunkManifest {
        size: data.len() as u64,
        content: (!holes).then(|| Hash::of(data)),
        chunks: spans.iter().map(|&(_, n, id)| (n, id)).collect(),
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
        let holed = |n: usize, seed: u64| {
            let mut d = pseudo_random(n, seed);
            d[(2 << 20) + 3..(5 << 20) + 9].fill(0);
            d
        };
        for (n, seed) in [(0, 1), (5, 2), (t, 3), (t + 1, 4), (t + 4096, 5), (13 << 20, 6), (9 << 20, 7), (11 << 20, 0)]
        {
            let data = if seed == 0 { holed(n, 8) } else { pseudo_random(n, seed) };
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
                    // (The holed case's pieces leave its hole out.)
                    assert!(seed == 0 || seen.concat_pieces() == data, "size {n}");
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

    /// Bytes without a hole are cut exactly where FastCDC cuts the whole
    /// file, and named by the hash of all their bytes: the ids of every
    /// chunked file stored before holes were found stay what they were.
    #[test]
    fn a_file_without_holes_is_cut_as_fastcdc_cuts_it_whole() {
        let mut data = pseudo_random(23 << 20, 11);
        // Zero runs too short, or not aligned, to be holes.
        data[(3 << 20) + 5..(4 << 20) + 5].fill(0);
        data[8 << 20..(9 << 20) - 1].fill(0);
        let Split::Chunked { manifest, .. } = split(&data) else { panic!("not chunked") };
        let want: Vec<u64> =
            fastcdc::v2020::FastCDC::new(&data, CHUNK_MIN, CHUNK_AVG, CHUNK_MAX).map(|c| c.length as u64).collect();
        assert_eq!(manifest.chunks.iter().map(|c| c.0).collect::<Vec<_>>(), want);
        assert_eq!(manifest.content, Some(Hash::of(&data)));
        assert!(!manifest.has_holes());
    }

    /// `size` bytes, zeros but for `islands` of (offset, length) random
    /// bytes.
    fn islands(size: usize, islands: &[(usize, usize)]) -> Vec<u8> {
        let mut d = vec![0u8; size];
        for (k, &(at, n)) in islands.iter().enumerate() {
            d[at..at + n].copy_from_slice(&pseudo_random(n, 100 + k as u64));
        }
        d
    }

    #[test]
    fn long_aligned_runs_of_zeros_are_holes_and_short_ones_data() {
        let m = 1 << 20;
        // Data, a 3 MiB run (a hole), data, 960 KiB of zeros (data), data
        // and a zero tail (a hole).
        let data = islands(20 * m, &[(0, 2 * m + 7), (5 * m + 100, 3 * m), (9 * m, 3 * m), (13 * m - 1, 2)]);
        let Split::Chunked { manifest, chunks, .. } = split(&data) else { panic!("not chunked") };
        assert_eq!(manifest.content, None);
        let holes: Vec<(u64, u64)> = manifest.spans().filter(|s| s.2.is_none()).map(|s| (s.0, s.1)).collect();
        // The first run starts at the block after the data's end, and ends
        // at the block holding the next data; 8 MiB + 100 .. 9 MiB is a
        // zero run of less than a block's multiple that stays data.
        let block = HOLE_BLOCK as usize;
        let first_from = (2 * m + 7).div_ceil(block) * block;
        let first_to = (5 * m + 100) / block * block;
        let tail_from = (13 * m + 1).div_ceil(block) * block;
        assert_eq!(
            holes,
            vec![(first_from as u64, (first_to - first_from) as u64), (tail_from as u64, (20 * m - tail_from) as u64)]
        );
        // The pieces make the file, holes as zeros.
        let mut back = vec![0u8; data.len()];
        let mut chunk = chunks.iter();
        for (at, len, id) in manifest.spans() {
            if let Some(id) = id {
                let (cid, bytes) = chunk.next().unwrap();
                assert_eq!((*cid, bytes.len() as u64), (id, len));
                back[at as usize..(at + len) as usize].copy_from_slice(bytes);
            }
        }
        assert!(back == data);
        // A file of zeros is one hole.
        let zeros = vec![0u8; 5 * m];
        let Split::Chunked { manifest, chunks, .. } = split(&zeros) else { panic!("not chunked") };
        assert_eq!((manifest.chunks, chunks.len()), (vec![(5 * m as u64, None)], 0));
    }

    /// A sparse file is read as its data; its holes and chunks are where
    /// they are in a dense copy of the same bytes.
    #[test]
    fn a_sparse_file_splits_as_its_bytes_do_reading_only_its_data() {
        use std::os::unix::fs::FileExt;
        let m = 1usize << 20;
        let dir = tempfile::tempdir().unwrap();
        let isl = [(3 * m + 4096, 300_000), (20 * m - 10, 70_000), (40 * m, m)];
        let size = 47 * m + 123;
        let sparse = std::fs::File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(dir.path().join("s"))
            .unwrap();
        sparse.set_len(size as u64).unwrap();
        let dense = islands(size, &isl);
        for &(at, n) in &isl {
            sparse.write_all_at(&dense[at..at + n], at as u64).unwrap();
        }
        let mut given = 0u64;
        let Streamed::Chunked { id, size: got, .. } = split_file(&sparse, "s", |_, b| {
            given += b.len() as u64;
            Ok(())
        })
        .unwrap() else {
            panic!("not chunked")
        };
        let Split::Chunked { id: want, .. } = split(&dense) else { panic!("not chunked") };
        assert_eq!((id, got), (want, size as u64));
        // What was hashed: the islands, rounded out to blocks (and to 1 MiB
        // where zeros between are too short to be a hole).
        assert!(given < 6 * m as u64, "{given} bytes hashed of a file with 1.4 MiB of data");
        // The stream splitter agrees.
        let Streamed::Chunked { id: streamed, .. } = split_stream(&dense[..], "d", |_, _| Ok(())).unwrap() else {
            panic!("not chunked")
        };
        assert_eq!(streamed, want);
        // A dense copy (every block on disk, no hole reported) is read
        // through, zeros and all, to the same id.
        std::fs::write(dir.path().join("d"), &dense).unwrap();
        let d = std::fs::File::open(dir.path().join("d")).unwrap();
        let mut read = 0u64;
        let Streamed::Chunked { id: from_dense, .. } = split_file(&d, "d", |_, b| {
            read += b.len() as u64;
            Ok(())
        })
        .unwrap() else {
            panic!("not chunked")
        };
        assert_eq!(from_dense, want);

        // 16 GiB apparent, 1 MiB of data: only the data is read.
        let big = std::fs::File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(dir.path().join("b"))
            .unwrap();
        big.set_len(16 << 30).unwrap();
        big.write_all_at(&pseudo_random(m, 5), 7 << 30).unwrap();
        let mut given = 0u64;
        let Streamed::Chunked { encoded, chunks, size, .. } = split_file(&big, "b", |_, b| {
            given += b.len() as u64;
            Ok(())
        })
        .unwrap() else {
            panic!("not chunked")
        };
        let manifest = ChunkManifest::decode(&encoded).unwrap();
        assert_eq!(size, 16 << 30);
        assert_eq!(given, m as u64);
        assert_eq!(manifest.chunks.iter().map(|c| c.1.is_some()).collect::<Vec<_>>(), vec![false, true, false]);
        assert_eq!(chunks.len(), 1);
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
