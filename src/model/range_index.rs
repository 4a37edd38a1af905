//! An interval index over key ranges: which of a set of ranges contain a
//! key, found in time logarithmic in the number of ranges plus the ranges
//! found, where testing each range would be linear.
//!
//! The watch routing table keeps here the ranges watched that are neither
//! one key nor a prefix (`[start, end)` and `[start, ∞)`: etcd's `--from-key`
//! and explicit range ends), each with a value (the sessions that watch it).
//! It is a treap ordered by `(start, end)` whose every node also knows the
//! greatest end in its subtree: a lookup for `key` skips a subtree whose
//! ranges all end at or before `key`, and everything right of a node whose
//! start is past `key`.
//!
//! Invariants: in-order the nodes are strictly ascending by `(start, end)`
//! (one node per distinct range); each node's priority is at least its
//! children's (so the expected depth is logarithmic whatever the order of
//! insertion); each node's `max_end` is the greatest `end` of its subtree.
//!
//! Caveats: the depth is logarithmic in expectation, not in the worst case
//! (priorities come from a fixed-seed generator, not from the ranges, so no
//! client picks them); recursion is as deep as the tree. Empty ranges
//! (`end <= start`) are kept and never found.

use super::mvcc::KeyRange;

/// Where a range ends: before a key, or never. Ordered with every key
/// before `Never`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Before(Vec<u8>),
    Never,
}

impl End {
    fn after(&self, key: &[u8]) -> bool {
        match self {
            End::Before(end) => key < end.as_slice(),
            End::Never => true,
        }
    }
}

/// A range's place in the index: its start, then its end.
fn bounds(range: &KeyRange) -> (Vec<u8>, End) {
    match range {
        KeyRange::Single(key) => {
            let mut end = key.clone();
            end.push(0);
            (key.clone(), End::Before(end))
        }
        KeyRange::Interval(start, end) => (start.clone(), End::Before(end.clone())),
        KeyRange::From(start) => (start.clone(), End::Never),
    }
}

struct Node<V> {
    start: Vec<u8>,
    end: End,
    range: KeyRange,
    value: V,
    priority: u64,
    /// The greatest `end` in this node's subtree.
    max_end: End,
    left: Tree<V>,
    right: Tree<V>,
}

type Tree<V> = Option<Box<Node<V>>>;

impl<V> Node<V> {
    fn update(&mut self) {
        let mut max = self.end.clone();
        for child in [&self.left, &self.right].into_iter().flatten() {
            if child.max_end > max {
                max = child.max_end.clone();
            }
        }
        self.max_end = max;
    }

    fn key(&self) -> (&[u8], &End) {
        (&self.start, &self.end)
    }
}

/// Key ranges with a value each (see the module doc).
pub struct RangeIndex<V> {
    root: Tree<V>,
    len: usize,
    seed: u64,
}

impl<V> Default for RangeIndex<V> {
    fn default() -> Self {
        RangeIndex { root: None, len: 0, seed: 0x9e37_79b9_7f4a_7c15 }
    }
}

impl<V> RangeIndex<V> {
    /// How many distinct ranges the index holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value of `range`, if the index holds it.
    pub fn get_mut(&mut self, range: &KeyRange) -> Option<&mut V> {
        let (start, end) = bounds(range);
        let mut node = self.root.as_deref_mut();
        while let Some(n) = node {
            match (start.as_slice(), &end).cmp(&n.key()) {
                std::cmp::Ordering::Equal => return Some(&mut n.value),
                std::cmp::Ordering::Less => node = n.left.as_deref_mut(),
                std::cmp::Ordering::Greater => node = n.right.as_deref_mut(),
            }
        }
        None
    }

    /// Add `range` with `value`; the caller has checked it is not held yet
    /// (`get_mut`), and a range held already keeps its old value.
    pub fn insert(&mut self, range: KeyRange, value: V) {
        if self.get_mut(&range).is_some() {
            return;
        }
        // Priorities no client chooses.
        let priority = xorshift(&mut self.seed);
        let (start, end) = bounds(&range);
        let node = Box::new(Node { max_end: end.clone(), start, end, range, value, priority, left: None, right: None });
        let (less, more) = split(self.root.take(), (&node.start, &node.end));
        self.root = merge(merge(less, Some(node)), more);
        self.len += 1;
    }

    /// Take `range` out, with its value.
    pub fn remove(&mut self, range: &KeyRange) -> Option<V> {
        let (start, end) = bounds(range);
        let removed = remove(&mut self.root, (&start, &end));
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    /// Call `found` with every range that contains `key`, and its value.
    pub fn containing<'a>(&'a self, key: &[u8], found: &mut impl FnMut(&'a KeyRange, &'a V)) {
        stab(&self.root, key, found);
    }
}

/// The next number of a xorshift64 sequence whose state is `state`.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// `tree` cut into the nodes ordered before `key` and the rest.
fn split<V>(tree: Tree<V>, key: (&[u8], &End)) -> (Tree<V>, Tree<V>) {
    let Some(mut node) = tree else { return (None, None) };
    if node.key() < key {
        let (less, more) = split(node.right.take(), key);
        node.right = less;
        node.update();
        (Some(node), more)
    } else {
        let (less, more) = split(node.left.take(), key);
        node.left = more;
        node.update();
        (less, Some(node))
    }
}

/// The nodes of `less` and then of `more` (every one of `less` ordered
/// before every one of `more`) in one tree.
fn merge<V>(less: Tree<V>, more: Tree<V>) -> Tree<V> {
    match (less, more) {
        (None, tree) | (tree, None) => tree,
        (Some(mut l), Some(mut m)) => {
            if l.priority >= m.priority {
                l.right = merge(l.right.take(), Some(m));
                l.update();
                Some(l)
            } else {
                m.left = merge(Some(l), m.left.take());
                m.update();
                Some(m)
            }
        }
    }
}

fn remove<V>(tree: &mut Tree<V>, key: (&[u8], &End)) -> Option<V> {
    let node = tree.as_mut()?;
    let removed = match key.cmp(&node.key()) {
        std::cmp::Ordering::Less => remove(&mut node.left, key),
        std::cmp::Ordering::Greater => remove(&mut node.right, key),
        std::cmp::Ordering::Equal => {
            let mut gone = tree.take().expect("matched above");
            *tree = merge(gone.left.take(), gone.right.take());
            return Some(gone.value);
        }
    };
    if removed.is_some() {
        node.update();
    }
    removed
}

fn stab<'a, V>(tree: &'a Tree<V>, key: &[u8], found: &mut impl FnMut(&'a KeyRange, &'a V)) {
    let Some(node) = tree else { return };
    // Nothing below ends after `key`: nothing below contains it.
    if !node.max_end.after(key) {
        return;
    }
    stab(&node.left, key, found);
    // Everything from here right starts after `key`.
    if node.start.as_slice() > key {
        return;
    }
    if node.end.after(key) {
        found(&node.range, &node.value);
    }
    stab(&node.right, key, found);
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            xorshift(&mut self.0)
        }
        fn key(&mut self) -> Vec<u8> {
            let len = self.next() % 3;
            (0..len).map(|_| b'a' + (self.next() % 4) as u8).collect()
        }
        fn range(&mut self) -> KeyRange {
            match self.next() % 3 {
                0 => KeyRange::From(self.key()),
                1 => KeyRange::Single(self.key()),
                _ => KeyRange::Interval(self.key(), self.key()),
            }
        }
    }

    fn found(index: &RangeIndex<u32>, key: &[u8]) -> Vec<u32> {
        let mut values = Vec::new();
        index.containing(key, &mut |range, value| {
            assert!(range.contains(key));
            values.push(*value);
        });
        values.sort_unstable();
        values
    }

    fn check_shape(tree: &Tree<u32>) -> usize {
        let Some(node) = tree else { return 0 };
        let mut max = node.end.clone();
        for child in [&node.left, &node.right].into_iter().flatten() {
            assert!(child.priority <= node.priority, "heap order");
            max = max.max(child.max_end.clone());
        }
        assert_eq!(node.max_end, max, "max_end is the subtree's greatest end");
        if let Some(left) = &node.left {
            assert!(left.key() < node.key());
        }
        if let Some(right) = &node.right {
            assert!(right.key() > node.key());
        }
        1 + check_shape(&node.left) + check_shape(&node.right)
    }

    #[test]
    fn lookups_find_exactly_the_ranges_a_scan_finds() {
        let mut rng = Rng(7);
        for _round in 0..40 {
            let mut index = RangeIndex::default();
            let mut held: Vec<(KeyRange, u32)> = Vec::new();
            for step in 0..300u32 {
                let range = rng.range();
                if rng.next().is_multiple_of(3) {
                    let expected = held.iter().position(|(r, _)| *r == range).map(|i| held.remove(i).1);
                    assert_eq!(index.remove(&range), expected);
                } else if index.get_mut(&range).is_none() {
                    index.insert(range.clone(), step);
                    held.push((range, step));
                }
                assert_eq!(index.len(), held.len());
                assert_eq!(check_shape(&index.root), held.len());
                let key = rng.key();
                let mut expected: Vec<u32> = held.iter().filter(|(r, _)| r.contains(&key)).map(|(_, v)| *v).collect();
                expected.sort_unstable();
                assert_eq!(found(&index, &key), expected, "key {key:?}");
            }
        }
    }

    /// The lookup's cost, counted in nodes visited: with 4,096 ranges, a key
    /// in one of them costs a few dozen visits, not 4,096 tests.
    #[test]
    fn a_lookup_visits_a_logarithmic_number_of_ranges() {
        fn visits(tree: &Tree<()>, key: &[u8]) -> usize {
            let Some(node) = tree else { return 0 };
            if !node.max_end.after(key) {
                return 1;
            }
            let mut n = 1 + visits(&node.left, key);
            if node.start.as_slice() <= key {
                n += visits(&node.right, key);
            }
            n
        }
        let key = |i: u32| format!("key/{i:06}").into_bytes();
        let mut index = RangeIndex::default();
        // Disjoint ranges, and as many nested ones around the middle.
        for i in 0..2048 {
            index.insert(KeyRange::Interval(key(2 * i), key(2 * i + 1)), ());
        }
        for i in 0..2048 {
            index.insert(KeyRange::From(key(4096 + i)), ());
        }
        assert_eq!(index.len(), 4096);
        let mut most = 0;
        for i in 0..2048 {
            let probe = key(2 * i);
            let mut n = 0;
            index.containing(&probe, &mut |_, _| n += 1);
            assert_eq!(n, 1);
            most = most.max(visits(&index.root, &probe));
        }
        assert!(most < 200, "a lookup that finds one range visited {most} nodes");
    }
}
