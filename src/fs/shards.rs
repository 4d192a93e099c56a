//! Sharded tables: a fixed number of independently locked parts, the one for a key chosen by
//! the key's low bits (the node, handle, credential and cached-inode tables).

/// `N` parts of a table. `N` is a power of two, checked when the program is built, so the part
/// of a key is its low bits: a mask, not a division, on every request. Sequential keys (inode
/// numbers, handles) spread over all parts.
///
/// A table of any other count does not build:
/// ```compile_fail,E0080
/// let t = ceph_virtiofsd::fs::shards::Shards::<u8, 48>::new(|| 0);
/// ```
#[derive(Debug)]
pub struct Shards<T, const N: usize> {
    parts: Box<[T; N]>,
}

impl<T, const N: usize> Shards<T, N> {
    /// Evaluated for each `N` a table is built with: fails the build unless it is a power of two.
    const POWER_OF_TWO: () = assert!(
        N.is_power_of_two(),
        "the shard count must be a power of two"
    );

    /// The key bits that select a part.
    #[allow(clippy::as_conversions)] // usize into u64: exact on every target (`From` is not const)
    const MASK: u64 = N as u64 - 1;

    /// `N` parts, each made by `part`.
    pub fn new(mut part: impl FnMut() -> T) -> Self {
        let () = Self::POWER_OF_TWO;
        Shards {
            parts: Box::new(std::array::from_fn(|_| part())),
        }
    }

    /// The part `key` falls in: its low bits (the same part as `key % N`).
    #[inline]
    #[allow(clippy::indexing_slicing)] // masked below N, the array's length
    pub fn get(&self, key: u64) -> &T {
        // Below N, which is a usize: the conversion cannot fail.
        let i = usize::try_from(key & Self::MASK).unwrap_or(0);
        &self.parts[i]
    }

    /// Every part, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.parts.iter()
    }
}

impl<'a, T, const N: usize> IntoIterator for &'a Shards<T, N> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mask picks the part the remainder picked, for sequential and scattered keys, and
    /// every part gets its share of sequential keys.
    #[test]
    fn the_low_bits_pick_the_part_the_remainder_did() {
        let t: Shards<usize, 64> = {
            let mut next = 0;
            Shards::new(|| {
                next += 1;
                next - 1
            })
        };
        let keys = (0..1000u64).chain([
            u64::MAX,
            u64::MAX - 63,
            1 << 63,
            (1 << 62) | 5,
            0x9e37_79b9_7f4a_7c15,
        ]);
        for key in keys {
            assert_eq!(*t.get(key), (key % 64) as usize, "key {key:#x}");
        }
        let mut hits = [0u32; 64];
        for key in 1000..1000 + 64 * 3 {
            hits[*t.get(key)] += 1;
        }
        assert!(hits.iter().all(|&h| h == 3), "{hits:?}");
        assert_eq!(t.iter().count(), 64);
        assert_eq!(
            (&t).into_iter().copied().collect::<Vec<_>>(),
            (0..64).collect::<Vec<_>>()
        );
    }

    /// One part is a valid table: every key falls in it.
    #[test]
    fn one_part_takes_every_key() {
        let t: Shards<u8, 1> = Shards::new(|| 7);
        assert_eq!((*t.get(0), *t.get(u64::MAX)), (7, 7));
    }
}

/// A hasher for the ids the daemon hands out itself (node ids, handles): identity plus a
/// splitmix64 finaliser, so that sequential ids spread over buckets. Not for keys a guest
/// chooses: only lookups take a guest's value, inserts take ours.
#[derive(Debug, Default)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = i;
    }
}

/// A map keyed by ids the daemon hands out (see [`IdHasher`]).
pub type IdMap<V> = std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;
