//! Where the inode table keeps its nodes: by number, in chunks of
//! [`CHUNK`] consecutive numbers, each slot a pointer or nothing.
//!
//! Numbers are handed out in order and never reused, so the nodes alive
//! at once sit in few chunks: a million nodes take a million 8-byte slots
//! and a thousand chunk entries, where a hash map of them took up to 16
//! bytes a slot at twice the slots it held (its table doubles). A chunk
//! goes when its last node does, so numbers left behind by nodes that
//! went cost nothing; the worst case, one node alive in each chunk, is
//! one chunk's slots a node.

use std::collections::HashMap;

use super::inode::Node;

/// Slots a chunk holds (2 KiB of pointers).
pub(super) const CHUNK: u64 = 256;

struct Chunk {
    slots: [Option<Box<Node>>; CHUNK as usize],
    used: u32,
}

#[derive(Default)]
pub(super) struct Nodes {
    chunks: HashMap<u64, Box<Chunk>>,
    len: usize,
}

fn split(ino: u64) -> (u64, usize) {
    (ino / CHUNK, (ino % CHUNK) as usize)
}

impl Nodes {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn get(&self, ino: u64) -> Option<&Node> {
        let (c, i) = split(ino);
        self.chunks.get(&c)?.slots[i].as_deref()
    }

    pub(super) fn get_mut(&mut self, ino: u64) -> Option<&mut Node> {
        let (c, i) = split(ino);
        self.chunks.get_mut(&c)?.slots[i].as_deref_mut()
    }

    /// Puts `n` at `ino`; the node that was there, if any.
    pub(super) fn insert(&mut self, ino: u64, n: Node) -> Option<Box<Node>> {
        let (c, i) = split(ino);
        let chunk =
            self.chunks.entry(c).or_insert_with(|| Box::new(Chunk { slots: std::array::from_fn(|_| None), used: 0 }));
        let old = chunk.slots[i].replace(Box::new(n));
        if old.is_none() {
            chunk.used += 1;
            self.len += 1;
        }
        old
    }

    pub(super) fn remove(&mut self, ino: u64) -> Option<Box<Node>> {
        let (c, i) = split(ino);
        let chunk = self.chunks.get_mut(&c)?;
        let old = chunk.slots[i].take()?;
        chunk.used -= 1;
        self.len -= 1;
        if chunk.used == 0 {
            self.chunks.remove(&c);
        }
        Some(old)
    }

    /// Every node with its number, in no order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &Node)> {
        self.chunks.iter().flat_map(|(c, chunk)| {
            chunk.slots.iter().enumerate().filter_map(move |(i, s)| s.as_deref().map(|n| (c * CHUNK + i as u64, n)))
        })
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Node> {
        self.iter().map(|(_, n)| n)
    }

    /// Gives back the chunk map's room once most chunks went; whether it did.
    pub(super) fn shrink(&mut self) -> bool {
        let cap = self.chunks.capacity();
        if cap > 64 && self.chunks.len() * 4 < cap {
            self.chunks.shrink_to(self.chunks.len() * 2);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfs::inode::{Body, Name};

    fn node(parent: u64) -> Node {
        Node::new(parent, Name::from(&b"n"[..]), 0o644, (0, 0), Body::Link(Box::from(&b"t"[..])))
    }

    #[test]
    fn nodes_come_back_by_number_and_empty_chunks_go() {
        let mut t = Nodes::default();
        for ino in 1..=3 * CHUNK {
            assert!(t.insert(ino, node(ino)).is_none());
        }
        assert_eq!(t.len(), 3 * CHUNK as usize);
        assert_eq!(t.chunks.len(), 4, "numbers 1..=768 span chunks 0 to 3");
        assert_eq!(t.get(CHUNK + 5).map(|n| n.parent), Some(CHUNK + 5));
        t.get_mut(7).unwrap().parent = 70;
        assert_eq!(t.get(7).unwrap().parent, 70);
        assert!(t.get(0).is_none() && t.get(3 * CHUNK + 1).is_none());
        // Replacing a node counts it once.
        assert_eq!(t.insert(9, node(90)).map(|n| n.parent), Some(9));
        assert_eq!(t.len(), 3 * CHUNK as usize);
        for ino in CHUNK..2 * CHUNK {
            assert_eq!(t.remove(ino).map(|n| n.parent), Some(ino));
        }
        assert!(t.remove(CHUNK).is_none(), "removed twice");
        assert_eq!(t.chunks.len(), 3, "chunk 1 emptied and went");
        assert_eq!(t.len(), 2 * CHUNK as usize);
        let mut seen: Vec<(u64, u64)> = t.iter().map(|(ino, n)| (ino, n.parent)).collect();
        seen.sort_unstable();
        let parent = |i: u64| match i {
            7 => 70,
            9 => 90,
            _ => i,
        };
        let want: Vec<(u64, u64)> = (1..CHUNK).chain(2 * CHUNK..=3 * CHUNK).map(|i| (i, parent(i))).collect();
        assert_eq!(seen, want);
        assert_eq!(t.values().count(), t.len());
        for ino in 1..=3 * CHUNK {
            t.remove(ino);
        }
        assert_eq!((t.len(), t.chunks.len()), (0, 0));
    }
}
