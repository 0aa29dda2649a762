//! Where a new layer of a layered object (a pack index, a stat object)
//! goes: the compaction rule both share.
//!
//! A chain is a whole object at the bottom with layers of changes above
//! it. A new layer that only ever went over its parent would make chains
//! grow without end; one that went over the whole bottom each time the
//! chain filled up would hold every change since that bottom, so the
//! upload of a long-lived workspace's checkpoint would grow with its age.
//! Instead the chain is kept geometric, as an LSM tree's levels or git's
//! split commit-graph chains are (each layer at least twice the size of
//! the one above it): the new layer absorbs every layer above the first
//! one more than twice its size, and any more it must to keep the chain
//! at most `max_layers` long. Each change is then rewritten O(log n)
//! times over n checkpoints, and a checkpoint's upload follows its own
//! change plus, now and then, the small layers it absorbs.

/// The position in `sizes` (the parent's chain, its top first and the
/// whole bottom last, each by number of entries) that the new layer goes
/// over: it holds the changes since the object at that position and
/// replaces every layer above it. `delta` is the size of the new changes
/// alone.
pub fn compaction_point(sizes: &[usize], delta: usize, max_layers: usize) -> usize {
    let n = sizes.len();
    let (mut k, mut size) = (0, delta.max(1));
    // Over position k, the chain is the new layer plus sizes[k..].
    while k + 1 < n && (sizes[k] <= 2 * size || 1 + n - k > max_layers) {
        size += sizes[k];
        k += 1;
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulates `n` checkpoints of `delta` changes each, every change to
    /// a path not changed before; returns the chain (top first) and the
    /// entries uploaded in total and at most at once.
    fn run(n: usize, delta: usize, max: usize, whole: usize) -> (Vec<usize>, usize, usize) {
        let mut chain = vec![whole];
        let (mut total, mut most) = (0, 0);
        for _ in 0..n {
            let k = compaction_point(&chain, delta, max);
            let layer = delta + chain[..k].iter().sum::<usize>();
            chain.drain(..k);
            chain.insert(0, layer);
            assert!(chain.len() <= max, "{chain:?}");
            total += layer;
            most = most.max(layer);
        }
        (chain, total, most)
    }

    #[test]
    fn a_chain_stays_short_and_each_change_is_rewritten_log_times() {
        let (chain, total, most) = run(1000, 10, 8, 1_000_000);
        // 1000 checkpoints of 10 changes: 10,000 changed entries, each
        // rewritten about log2(1000) times at most, not 1000 / 2 times.
        assert!(total <= 10_000 * 12, "{total} entries uploaded");
        assert!(chain.len() <= 8);
        // Layers grow geometrically from the top down (above the bottom).
        for w in chain[..chain.len() - 1].windows(2) {
            assert!(w[1] > w[0], "{chain:?}");
        }
        assert!(most < 10_000, "one upload held {most}");
    }

    #[test]
    fn a_small_change_over_a_big_top_goes_over_it() {
        assert_eq!(compaction_point(&[100, 1000, 50_000], 3, 8), 0);
        // Over a top no more than twice its size, it absorbs the top.
        assert_eq!(compaction_point(&[6, 1000, 50_000], 3, 8), 1);
        assert_eq!(compaction_point(&[7, 1000, 50_000], 3, 8), 0);
        // Absorbing goes on while the next one is small enough.
        assert_eq!(compaction_point(&[3, 8, 50_000], 3, 8), 2);
    }

    #[test]
    fn a_full_chain_is_shortened_and_the_bottom_stays() {
        let full = [3, 10, 100, 1000, 10_000, 100_000, 1_000_000, 10_000_000];
        // Over position 1, the chain is the new layer plus seven: fits 8.
        assert_eq!(compaction_point(&full, 1, 8), 1);
        assert_eq!(compaction_point(&full[..7], 1, 8), 0);
        // The bottom is never absorbed (a layer always goes over it).
        assert_eq!(compaction_point(&[5, 5], 1_000, 8), 1);
        assert_eq!(compaction_point(&[5], 1_000, 8), 0);
        assert_eq!(compaction_point(&[], 1, 8), 0);
    }
}
