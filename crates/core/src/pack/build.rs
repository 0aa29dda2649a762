//! Building packs for a tree: walking it in path order, planning which
//! members go together (v2 recursive, v1 per directory, or a delta on top
//! of a base index), and handing each finished pack to the caller.

use std::collections::HashSet;

use super::{
    build_pack, MemberKind, Mode, PackEntry, PackIndex, MAX_INDEX_LAYERS, MAX_PACK_MEMBERS, PER_DIR_MIN_FILES,
    RUN_PACK_BYTES,
};
use crate::chunk::CHUNK_THRESHOLD;
use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::object::{ChunkManifest, Kind, Tree};

/// Reads an object's bytes while building (from the disk cache at import).
pub type Source<'a> = dyn Fn(&Hash) -> Result<Vec<u8>> + 'a;

/// A file's members as they go in a pack.
struct FileMembers {
    members: Vec<(Hash, MemberKind)>,
    bytes: u64,
}

struct Dir {
    files: Vec<FileMembers>,
    /// Child directories, in name order, interleaved with files by
    /// position: (index into files before which this child comes, child).
    children: Vec<(usize, Dir)>,
    bytes: u64,
    count: u64,
}

/// What a builder produced.
pub struct Built {
    pub index: PackIndex,
    /// Objects too large for any pack (fetched alone).
    pub unpacked: u64,
    /// Those objects' ids: when packs are how content goes up, they go
    /// up alone.
    pub loose: Vec<(Hash, MemberKind)>,
    /// For a delta build with [`Absorb`]: the position in the base's chain
    /// the new layer must go over (the packs of the layers above it were
    /// folded into the new packs).
    pub placed_at: usize,
    /// The index holds only the trees the build walked (the new ones and
    /// those above the base's bottom layer), not every tree of the view:
    /// it can be published only as a layer, over `placed_at`. Its `dirs`
    /// is still the whole tree's.
    pub partial: bool,
}

/// Packs at least this large are never folded into a new layer's pack
/// (see [`build_delta`]): one is worth its own GET, and the number of such
/// packs grows with the bytes stored, not with the checkpoints made.
pub const ABSORB_MAX_PACK_BYTES: u64 = 1 << 20;

/// Whether pack `p` stays as it is when its layer is absorbed.
fn kept_whole(p: &PackEntry) -> bool {
    is_run_pack(p) || p.size >= ABSORB_MAX_PACK_BYTES
}

/// What a delta build may fold in: the base's chain, layer by layer (its
/// top first, the whole bottom last), so that the new layer can absorb the
/// small layers at the top (crate::object::compaction_point) and the new
/// pack the packs they brought. Without it, every checkpoint would leave
/// one more small pack for a cold reader to fetch.
pub struct Absorb {
    /// Each layer's size (trees and packs it holds).
    pub sizes: Vec<usize>,
    /// The packs each layer introduced.
    pub packs: Vec<Vec<Hash>>,
    /// The trees of the bottom (whole) layer, which is never absorbed:
    /// every member below one of them is in the bottom's packs, so a
    /// delta build need not walk them (see [`build_delta`]).
    pub bottom_trees: HashSet<Hash>,
}

/// The bytes of a foldable pack (see [`ABSORB_MAX_PACK_BYTES`]) that count
/// as one entry of its layer's size: a layer whose small packs hold much
/// weighs as much, so the layers above it must add up before a new one
/// absorbs it (and sends those bytes again). Counted by trees and packs
/// alone, a layer of a few trees and one pack of 900 KB was absorbed by
/// every other checkpoint.
const ABSORB_BYTES_PER_ENTRY: u64 = 4 << 10;

impl Absorb {
    pub fn of(layers: &[PackIndex]) -> Absorb {
        let folded_bytes = |l: &PackIndex| {
            let b: u64 = l.packs.iter().filter(|p| !kept_whole(p)).map(|p| p.size).sum();
            (b / ABSORB_BYTES_PER_ENTRY) as usize
        };
        Absorb {
            sizes: layers.iter().map(|l| l.trees.len() + l.packs.len() + folded_bytes(l)).collect(),
            packs: layers.iter().map(|l| l.packs.iter().map(|p| p.id).collect()).collect(),
            bottom_trees: layers.last().map(|b| b.trees.iter().map(|t| t.0).collect()).unwrap_or_default(),
        }
    }
}

struct Walk<'a> {
    src: &'a Source<'a>,
    trees: Vec<(Hash, Vec<u8>)>,
    seen_trees: HashSet<Hash>,
    dirs: u64,
    cap: u64,
    unpacked: u64,
    loose: Vec<(Hash, MemberKind)>,
    /// Files too large for a pack of the plan: their members (manifest,
    /// then chunks in file order), packed apart in runs of at most
    /// [`RUN_PACK_BYTES`] (see [`pack_in_order`]).
    runs: Vec<Vec<(Hash, MemberKind)>>,
}

impl<'a> Walk<'a> {
    fn new(src: &'a Source<'a>, cap: u64) -> Walk<'a> {
        Walk {
            src,
            trees: Vec::new(),
            seen_trees: HashSet::new(),
            dirs: 0,
            cap,
            unpacked: 0,
            loose: Vec::new(),
            runs: Vec::new(),
        }
    }

    fn load(&mut self, id: Hash) -> Result<Tree> {
        let bytes = (self.src)(&id)?;
        let t = Tree::decode(&bytes).map_err(|e| Error::corrupt(id, "tree", "", e))?;
        if self.seen_trees.insert(id) {
            self.trees.push((id, bytes));
        }
        Ok(t)
    }

    fn file(&mut self, e: &crate::object::Entry) -> Result<Option<FileMembers>> {
        if !e.chunked {
            if e.size > CHUNK_THRESHOLD {
                self.unpacked += 1;
                self.loose.push((e.id, MemberKind::Blob));
                return Ok(None);
            }
            return Ok(Some(FileMembers { members: vec![(e.id, MemberKind::Blob)], bytes: e.size }));
        }
        let mb = (self.src)(&e.id)?;
        let m = ChunkManifest::decode(&mb).map_err(|er| Error::corrupt(e.id, "chunk manifest", "", er))?;
        // Its stored bytes: holes take none.
        let bytes = mb.len() as u64 + m.spans().filter(|s| s.2.is_some()).map(|s| s.1).sum::<u64>();
        // Inline in the index too (beside the trees): a reader then needs
        // no round trip for it before the chunks (a cold random read of a
        // large file is one GET). It stays a member or an object as well.
        if self.seen_trees.insert(e.id) {
            self.trees.push((e.id, mb));
        }
        let mut members = vec![(e.id, MemberKind::Manifest)];
        members.extend(m.data_chunks().map(|c| (c, MemberKind::Chunk)));
        if bytes > self.cap {
            self.runs.push(members);
            return Ok(None);
        }
        Ok(Some(FileMembers { members, bytes }))
    }

    /// A tree already in the base (not recorded as one the build carries).
    fn peek(&self, id: Hash) -> Result<Tree> {
        let bytes = (self.src)(&id)?;
        Tree::decode(&bytes).map_err(|e| Error::corrupt(id, "tree", "", e))
    }

    /// Directories in tree `id`, itself included, reading only trees.
    fn count_dirs(&self, id: Hash) -> Result<u64> {
        let t = self.peek(id)?;
        let mut n = 1;
        for e in t.entries.iter().filter(|e| e.kind == Kind::Directory) {
            n += self.count_dirs(e.id)?;
        }
        Ok(n)
    }

    /// The new tree `new` against `old`, the base's directory at the same
    /// path (if any), for a delta build: walks only where they differ, and
    /// where a tree above the base's bottom layer may name members of
    /// packs the new one absorbs; the members of every file of a walked
    /// tree go to `out`. Returns how many directories more (or fewer) the
    /// new subtree holds than the old.
    fn diff(
        &mut self,
        old: Option<Hash>,
        new: Hash,
        bottom: &dyn Fn(&Hash) -> bool,
        out: &mut Vec<(Hash, MemberKind)>,
    ) -> Result<i64> {
        if bottom(&new) {
            // Its members are in the bottom's packs, which stay.
            if old == Some(new) {
                return Ok(0);
            }
            let before = match old {
                Some(o) => self.count_dirs(o)? as i64,
                None => 0,
            };
            return Ok(self.count_dirs(new)? as i64 - before);
        }
        let t = self.load(new)?;
        let same = old == Some(new);
        let old_t = match old {
            Some(o) if !same => Some(self.peek(o)?),
            _ => None,
        };
        let old_dirs: std::collections::HashMap<&[u8], Hash> = old_t
            .iter()
            .flat_map(|t| t.entries.iter())
            .filter(|e| e.kind == Kind::Directory)
            .map(|e| (&e.name[..], e.id))
            .collect();
        let mut delta = i64::from(old.is_none());
        for e in &t.entries {
            match e.kind {
                Kind::Directory => {
                    let o = if same { Some(e.id) } else { old_dirs.get(&e.name[..]).copied() };
                    delta += self.diff(o, e.id, bottom, out)?;
                }
                Kind::Gitlink => {}
                _ => {
                    if let Some(f) = self.file(e)? {
                        out.extend(f.members);
                    }
                }
            }
        }
        if let Some(ot) = &old_t {
            let now: HashSet<&[u8]> =
                t.entries.iter().filter(|e| e.kind == Kind::Directory).map(|e| &e.name[..]).collect();
            for e in ot.entries.iter().filter(|e| e.kind == Kind::Directory && !now.contains(&e.name[..])) {
                delta -= self.count_dirs(e.id)? as i64;
            }
        }
        Ok(delta)
    }

    fn dir(&mut self, id: Hash) -> Result<Dir> {
        self.dirs += 1;
        let t = self.load(id)?;
        let mut d = Dir { files: Vec::new(), children: Vec::new(), bytes: 0, count: 0 };
        for e in &t.entries {
            match e.kind {
                Kind::Directory => {
                    let c = self.dir(e.id)?;
                    d.bytes += c.bytes;
                    d.count += c.count;
                    d.children.push((d.files.len(), c));
                }
                Kind::Gitlink => {}
                _ => {
                    if let Some(f) = self.file(e)? {
                        d.bytes += f.bytes;
                        d.count += 1;
                        d.files.push(f);
                    }
                }
            }
        }
        Ok(d)
    }
}

/// A run of members that must stay together, in walk order.
struct Unit {
    members: Vec<(Hash, MemberKind)>,
    bytes: u64,
}

fn flatten(d: &Dir, out: &mut Vec<(Hash, MemberKind)>) {
    let mut ci = 0;
    for (i, f) in d.files.iter().enumerate() {
        while ci < d.children.len() && d.children[ci].0 == i {
            flatten(&d.children[ci].1, out);
            ci += 1;
        }
        out.extend(f.members.iter().copied());
    }
    for (_, c) in &d.children[ci..] {
        flatten(c, out);
    }
}

/// v2: see the module comment. Emits groups of units, each one pack.
fn plan_recursive(d: &Dir, cap: u64, groups: &mut Vec<Vec<Unit>>) {
    if d.bytes <= cap {
        let mut members = Vec::new();
        flatten(d, &mut members);
        groups.push(vec![Unit { members, bytes: d.bytes }]);
        return;
    }
    let mut units = Vec::new();
    let mut ci = 0;
    let flush = |units: &mut Vec<Unit>, groups: &mut Vec<Vec<Unit>>| {
        group_units(std::mem::take(units), cap, groups);
    };
    let child = |c: &Dir, units: &mut Vec<Unit>, groups: &mut Vec<Vec<Unit>>| {
        if c.bytes <= cap {
            let mut members = Vec::new();
            flatten(c, &mut members);
            units.push(Unit { members, bytes: c.bytes });
        } else {
            // Keep name order: what came before goes into packs first.
            flush(units, groups);
            plan_recursive(c, cap, groups);
        }
    };
    for (i, f) in d.files.iter().enumerate() {
        while ci < d.children.len() && d.children[ci].0 == i {
            child(&d.children[ci].1, &mut units, groups);
            ci += 1;
        }
        units.push(Unit { members: f.members.clone(), bytes: f.bytes });
    }
    for (_, c) in &d.children[ci..] {
        child(c, &mut units, groups);
    }
    group_units(units, cap, groups);
}

/// Consecutive units, greedily, into groups of at most `cap` bytes.
fn group_units(units: Vec<Unit>, cap: u64, groups: &mut Vec<Vec<Unit>>) {
    let mut cur: Vec<Unit> = Vec::new();
    let mut bytes = 0;
    for u in units {
        if !cur.is_empty() && bytes + u.bytes > cap {
            groups.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        bytes += u.bytes;
        cur.push(u);
    }
    if !cur.is_empty() {
        groups.push(cur);
    }
}

/// v1: each dense directory's own small files.
fn plan_per_dir(d: &Dir, groups: &mut Vec<Vec<Unit>>) {
    let small: Vec<&FileMembers> = d.files.iter().filter(|f| f.members.len() == 1).collect();
    if small.len() >= PER_DIR_MIN_FILES {
        groups.push(small.iter().map(|f| Unit { members: f.members.clone(), bytes: f.bytes }).collect());
    }
    for (_, c) in &d.children {
        plan_per_dir(c, groups);
    }
}

/// Builds packs for `tree` incrementally on top of `base` (the index of the
/// tree it was derived from, e.g. the previous checkpoint): members already
/// in one of `base`'s packs stay there, and only new members go into new
/// packs (of at most `cap`, in walk order). The resulting index lists the
/// base packs still used, then the new ones. Upload follows the change,
/// not the tree; `mado pack` rebuilds compactly when wanted.
pub fn build_delta(
    tree: Hash,
    cap: u64,
    base: &PackIndex,
    absorb: Option<&Absorb>,
    src: &Source<'_>,
    emit: &mut dyn FnMut(Hash, Vec<u8>) -> Result<()>,
) -> Result<Built> {
    let new_walk = || Walk::new(src, cap);
    let mut w = new_walk();
    let known: HashSet<Hash> = base.trees.iter().map(|t| t.0).collect();
    // Where the new layer goes: its size is about the trees the base
    // lacks, plus its pack.
    let place = |w: &Walk, a: &Absorb| {
        let delta = w.trees.iter().filter(|t| !known.contains(&t.0)).count() + 1;
        crate::object::compaction_point(&a.sizes, delta, MAX_INDEX_LAYERS)
    };
    // Over a layered base, only what differs from the base's tree and
    // what lies above its bottom layer is walked: on a big tree, the
    // change and the layers since the bottom, not every directory. Unless
    // the result is not much smaller than the view (it would be written
    // whole, and a whole index needs every tree): then the whole walk.
    let fast = match absorb {
        Some(a) if !a.bottom_trees.is_empty() => {
            let mut all = Vec::new();
            let delta = w.diff(Some(base.tree), tree, &|id| a.bottom_trees.contains(id), &mut all)?;
            let dirs = base.dirs as i64 + delta;
            (w.trees.len() * 2 <= base.trees.len() && dirs > 0).then(|| (all, dirs as u64, place(&w, a)))
        }
        _ => None,
    };
    let partial = fast.is_some();
    let (all, placed_at) = match fast {
        Some((all, dirs, at)) => {
            w.dirs = dirs;
            (all, at)
        }
        None => {
            w = new_walk();
            let root = w.dir(tree)?;
            let mut all = Vec::new();
            flatten(&root, &mut all);
            let at = absorb.map_or(0, |a| place(&w, a));
            (all, at)
        }
    };
    let listed = Listed { candidates: &base.packs, elsewhere: &|_| false };
    finish_delta(w, tree, cap, absorb, (all, placed_at, partial), listed, src, emit)
}

/// The packs a delta build may list again, and a test for members held by
/// packs that stay below the new layer without being listed in it.
struct Listed<'a> {
    candidates: &'a [PackEntry],
    elsewhere: &'a dyn Fn(&Hash) -> bool,
}

/// The end of a delta build, once the walk listed the members of what
/// changed (`all`) and the layer's place is known: members no pack that
/// stays holds go in new packs; the index lists the candidate packs used
/// (or, for a partial walk, every one not absorbed), then the new ones.
#[allow(clippy::too_many_arguments)]
fn finish_delta(
    mut w: Walk<'_>,
    tree: Hash,
    cap: u64,
    absorb: Option<&Absorb>,
    (all, placed_at, partial): (Vec<(Hash, MemberKind)>, usize, bool),
    listed: Listed<'_>,
    src: &Source<'_>,
    emit: &mut dyn FnMut(Hash, Vec<u8>) -> Result<()>,
) -> Result<Built> {
    let Listed { candidates, elsewhere } = listed;
    // Only small packs are absorbed (a cold reader's GET each is what
    // folding saves). A large file's packs, and any pack of at least
    // ABSORB_MAX_PACK_BYTES, stay as they are: folding one uploaded its
    // bytes again for a small layer's sake, at every other checkpoint (a
    // 20 MB file beside a few small ones went up again with each 2-byte
    // edit anywhere in the tree).
    let whole: HashSet<Hash> = candidates.iter().filter(|p| kept_whole(p)).map(|p| p.id).collect();
    let absorbed: HashSet<Hash> = absorb
        .map(|a| a.packs[..placed_at].iter().flatten().filter(|p| !whole.contains(p)).copied().collect())
        .unwrap_or_default();
    // A member of an absorbed pack goes in the new pack, unless a pack
    // that stays holds it too.
    let in_base: std::collections::HashMap<Hash, usize> = candidates
        .iter()
        .enumerate()
        .filter(|(_, p)| !absorbed.contains(&p.id))
        .flat_map(|(pi, p)| p.members.iter().map(move |m| (m.id, pi)))
        .collect();
    let mut used = vec![false; candidates.len()];
    let mut seen = HashSet::new();
    let mut fresh: Vec<(Hash, MemberKind)> = Vec::new();
    for (id, kind) in all {
        if !seen.insert(id) {
            continue;
        }
        match in_base.get(&id) {
            Some(pi) => used[*pi] = true,
            None if elsewhere(&id) => {}
            None => fresh.push((id, kind)),
        }
    }
    // Large files' members: those in a base pack stay there (an append
    // to a big file sends its last chunks and its manifest only).
    let mut fresh_runs: Vec<Vec<(Hash, MemberKind)>> = Vec::new();
    for run in std::mem::take(&mut w.runs) {
        let mut new = Vec::new();
        for (id, kind) in run.into_iter().filter(|(id, _)| seen.insert(*id)) {
            match in_base.get(&id) {
                Some(pi) => used[*pi] = true,
                None if elsewhere(&id) => {}
                None => new.push((id, kind)),
            }
        }
        fresh_runs.push(new);
    }
    // A partial walk cannot tell which base packs nothing uses any more:
    // those that stay are all kept (as their layers list them anyway).
    let mut packs: Vec<PackEntry> = candidates
        .iter()
        .zip(&used)
        .filter(|(p, u)| **u || (partial && !absorbed.contains(&p.id)))
        .map(|(p, _)| p.clone())
        .collect();
    pack_in_order(fresh, cap, src, emit, &mut packs)?;
    for run in fresh_runs {
        pack_in_order(run, cap.min(RUN_PACK_BYTES), src, emit, &mut packs)?;
    }
    Ok(Built {
        index: PackIndex {
            tree,
            mode: Mode::Recursive,
            dirs: w.dirs,
            packs,
            trees: w.trees,
            base: Vec::new(),
            deltas: Vec::new(),
        },
        unpacked: w.unpacked,
        loose: w.loose,
        placed_at,
        partial,
    })
}

/// A base index as a checkpoint has it: its chain's layers above the
/// bottom, decoded (they hold the changes since the bottom), and the whole
/// bottom flat, read in place ([`super::flat`]). A delta build over it
/// costs what changed since the bottom, not the size of the tree.
pub struct FlatBase {
    pub above: Vec<PackIndex>,
    pub bottom: std::sync::Arc<super::flat::FlatIndex>,
}

impl std::fmt::Debug for FlatBase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlatBase").field("layers", &self.layers()).finish()
    }
}

impl FlatBase {
    /// Over `layers` (the chain, its top first), the bottom's whole.
    /// Decodes the layers above the bottom; `Err` when one does not decode.
    pub fn of(layers: &[std::sync::Arc<super::flat::FlatIndex>]) -> Result<FlatBase, String> {
        let (bottom, above) = layers.split_last().ok_or("an empty chain")?;
        if !bottom.base().is_empty() {
            return Err(format!("the bottom layer {} names layers below it", bottom.tree().short()));
        }
        let above = above.iter().map(|l| l.to_index()).collect::<Result<Vec<_>, _>>()?;
        Ok(FlatBase { above, bottom: bottom.clone() })
    }

    pub fn tree(&self) -> Hash {
        self.above.first().map_or(self.bottom.tree(), |l| l.tree)
    }

    /// The chain, its top first.
    pub fn layers(&self) -> Vec<Hash> {
        self.above.iter().map(|l| l.tree).chain(std::iter::once(self.bottom.tree())).collect()
    }

    /// The view's trees, bounded from above closely enough for the
    /// partial-walk test and the layer's: the bottom's inline objects (trees
    /// and manifests) and the trees of the layers above it.
    pub fn view_trees(&self) -> usize {
        let above: HashSet<Hash> = self.above.iter().flat_map(|l| l.trees.iter().map(|t| t.0)).collect();
        self.bottom.inline_count() + above.len()
    }

    fn absorb(&self) -> Absorb {
        let mut a = Absorb::of(&self.above);
        // The bottom is never absorbed, and its size never weighed (a new
        // layer goes at most over it).
        a.sizes.push(usize::MAX);
        a.packs.push(Vec::new());
        a.bottom_trees.clear();
        a
    }
}

/// [`build_delta`] over a [`FlatBase`], when its walk can be partial (the
/// change is small beside the tree); `None` when it cannot, and the whole
/// view is needed (the caller merges the chain and calls [`build_delta`]).
pub fn build_delta_flat(
    tree: Hash,
    cap: u64,
    base: &FlatBase,
    src: &Source<'_>,
    emit: &mut dyn FnMut(Hash, Vec<u8>) -> Result<()>,
) -> Result<Option<Built>> {
    let mut w = Walk::new(src, cap);
    let absorb = base.absorb();
    let above_trees: HashSet<Hash> = base.above.iter().flat_map(|l| l.trees.iter().map(|t| t.0)).collect();
    let bottom = &base.bottom;
    let mut all = Vec::new();
    let delta = w.diff(Some(base.tree()), tree, &|id| bottom.has_inline(id), &mut all)?;
    let dirs = base.above.first().map_or(bottom.dirs(), |l| l.dirs) as i64 + delta;
    if w.trees.len() * 2 > base.view_trees() || dirs <= 0 {
        return Ok(None);
    }
    w.dirs = dirs as u64;
    let new_trees = w.trees.iter().filter(|t| !above_trees.contains(&t.0) && !bottom.has_inline(&t.0)).count();
    let placed_at = crate::object::compaction_point(&absorb.sizes, new_trees + 1, MAX_INDEX_LAYERS);
    let candidates: Vec<PackEntry> = {
        let mut ids = HashSet::new();
        base.above.iter().flat_map(|l| l.packs.iter()).filter(|p| ids.insert(p.id)).cloned().collect()
    };
    let listed = Listed { candidates: &candidates, elsewhere: &|id| bottom.member(id).is_some() };
    finish_delta(w, tree, cap, Some(&absorb), (all, placed_at, true), listed, src, emit).map(Some)
}

/// Builds the packs for `tree`, handing each (id, bytes) to `emit` as it is
/// made (so at most one pack is in memory), and returns the index.
pub fn build(
    tree: Hash,
    mode: Mode,
    cap: u64,
    src: &Source<'_>,
    emit: &mut dyn FnMut(Hash, Vec<u8>) -> Result<()>,
) -> Result<Built> {
    let mut w = Walk::new(src, cap);
    let root = w.dir(tree)?;
    let mut groups = Vec::new();
    match mode {
        Mode::Recursive => plan_recursive(&root, cap, &mut groups),
        Mode::PerDir => plan_per_dir(&root, &mut groups),
    }
    // v1 then leaves what no pack took alone, so needs every member; the
    // walk's copy is dropped otherwise (the plan holds its own: a member
    // a file of the tree, twice over, while the packs are built).
    let every = (mode == Mode::PerDir).then(|| {
        let mut all = Vec::new();
        flatten(&root, &mut all);
        all
    });
    drop(root);
    let mut seen = HashSet::new();
    let mut packs = Vec::new();
    // The plan caps what a group holds before compression; v2 then puts
    // consecutive groups in one pack while their stored (compressed) bytes
    // fit the cap, so a pack of source text is about `cap` on the wire, not
    // a fifth of it, and an import makes that many fewer PUTs. Groups stay
    // whole and in walk order: locality is what the plan decided. In memory:
    // one group's raw bytes and at most `cap` of stored ones.
    let mut pending: Vec<super::Stored> = Vec::new();
    let mut pending_bytes = 0u64;
    let mut flush = |pending: &mut Vec<super::Stored>, packs: &mut Vec<PackEntry>| -> Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        let (bytes, entry) = super::assemble(pending);
        emit(entry.id, bytes)?;
        packs.push(entry);
        pending.clear();
        Ok(())
    };
    for g in groups {
        let ids: Vec<(Hash, MemberKind)> =
            g.into_iter().flat_map(|u| u.members).filter(|(id, _)| seen.insert(*id)).collect();
        if ids.is_empty() {
            continue;
        }
        // A group of more members than a pack takes starts a pack whatever
        // its bytes, and goes on in walk order in the next: it is read a
        // pack's members at a time (a group of a big tree's small files
        // holds hundreds of thousands, `cap` of content twice over).
        let whole = ids.len() <= MAX_PACK_MEMBERS;
        for (i, part) in ids.chunks(MAX_PACK_MEMBERS).enumerate() {
            let stored = stored_of(part, src)?;
            let bytes: u64 = stored.iter().map(|m| m.body.len() as u64).sum();
            let starts =
                mode == Mode::PerDir || pending_bytes + bytes > cap || pending.len() + stored.len() > MAX_PACK_MEMBERS;
            if i == 0 && (!whole || starts) {
                flush(&mut pending, &mut packs)?;
                pending_bytes = 0;
            }
            for m in stored {
                if pending.len() == MAX_PACK_MEMBERS {
                    flush(&mut pending, &mut packs)?;
                    pending_bytes = 0;
                }
                pending_bytes += m.body.len() as u64;
                pending.push(m);
            }
        }
    }
    flush(&mut pending, &mut packs)?;
    if mode == Mode::PerDir {
        let packed: HashSet<Hash> = packs.iter().flat_map(|p| p.members.iter().map(|m| m.id)).collect();
        let mut all = every.unwrap_or_default();
        all.extend(std::mem::take(&mut w.runs).into_iter().flatten());
        let alone: Vec<(Hash, MemberKind)> = all.into_iter().filter(|(id, _)| !packed.contains(id)).collect();
        w.unpacked += alone.len() as u64;
        w.loose.extend(alone);
    }
    for run in std::mem::take(&mut w.runs) {
        let run: Vec<_> = run.into_iter().filter(|(id, _)| seen.insert(*id)).collect();
        pack_in_order(run, cap.min(RUN_PACK_BYTES), src, emit, &mut packs)?;
    }
    Ok(Built {
        index: PackIndex { tree, mode, dirs: w.dirs, packs, trees: w.trees, base: Vec::new(), deltas: Vec::new() },
        unpacked: w.unpacked,
        loose: w.loose,
        placed_at: 0,
        partial: false,
    })
}

/// Members `ids` read and made ready to store (compressed where it pays).
fn stored_of(ids: &[(Hash, MemberKind)], src: &Source<'_>) -> Result<Vec<super::Stored>> {
    let data: Vec<Vec<u8>> = ids.iter().map(|(id, _)| src(id)).collect::<Result<_>>()?;
    let members: Vec<(Hash, MemberKind, &[u8])> =
        ids.iter().zip(&data).map(|((id, k), d)| (*id, *k, d.as_slice())).collect();
    Ok(super::stored_members(&members))
}

/// Members in the order given, in packs of at most `cap` raw bytes and
/// [`MAX_PACK_MEMBERS`] members each (a member larger than that alone),
/// each handed to `emit` as it is made: at most one pack's members in
/// memory.
fn pack_in_order(
    members: Vec<(Hash, MemberKind)>,
    cap: u64,
    src: &Source<'_>,
    emit: &mut dyn FnMut(Hash, Vec<u8>) -> Result<()>,
    packs: &mut Vec<PackEntry>,
) -> Result<()> {
    let mut group: Vec<(Hash, MemberKind, Vec<u8>)> = Vec::new();
    let mut bytes = 0u64;
    let mut flush = |group: &mut Vec<(Hash, MemberKind, Vec<u8>)>, packs: &mut Vec<PackEntry>| -> Result<()> {
        if group.is_empty() {
            return Ok(());
        }
        let members: Vec<(Hash, MemberKind, &[u8])> = group.iter().map(|(h, k, d)| (*h, *k, d.as_slice())).collect();
        let (b, entry) = build_pack(&members);
        emit(entry.id, b)?;
        packs.push(entry);
        group.clear();
        Ok(())
    };
    for (id, kind) in members {
        let data = src(&id)?;
        if (bytes + data.len() as u64 > cap || group.len() == MAX_PACK_MEMBERS) && !group.is_empty() {
            flush(&mut group, packs)?;
            bytes = 0;
        }
        bytes += data.len() as u64;
        group.push((id, kind, data));
    }
    flush(&mut group, packs)
}

/// A pack of one large file's members (a manifest and chunks, no whole
/// blob): see [`RUN_PACK_BYTES`].
pub fn is_run_pack(p: &PackEntry) -> bool {
    !p.members.is_empty() && p.members.iter().all(|m| m.kind != MemberKind::Blob)
}
