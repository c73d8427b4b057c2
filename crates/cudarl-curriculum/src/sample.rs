//! Deterministic choices of SFT examples: which go to validation, in which order phrasings and
//! shape selections are taken, and the ordered selections of a task's train shapes.

/// A string's position in [0, 1]: the first 8 bytes of its BLAKE3 hash as a little-endian u64,
/// divided by `u64::MAX` (which SFT examples go to validation).
pub fn hash_fraction(s: &str) -> f64 {
    let h = blake3::hash(s.as_bytes());
    let x = u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"));
    x as f64 / u64::MAX as f64
}

/// A deterministic pseudo-random order of `n` items: sorted by the keys `(seed + i) *
/// 0x9E3779B97F4A7C15` passed through SplitMix64's finalizer (Steele, Lea and Flood, "Fast
/// splittable pseudorandom number generators", OOPSLA 2014).
pub fn order(n: usize, seed: u64) -> Vec<usize> {
    let mut keyed: Vec<(u64, usize)> = (0..n)
        .map(|i| {
            let mut z = seed
                .wrapping_add(i as u64)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31), i)
        })
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, i)| i).collect()
}

/// Ordered selections of the train shapes (the empty one, each single shape, each ordered pair,
/// ... all permutations of all subsets).
pub fn shape_variants(shapes: &[String]) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = vec![vec![]];
    let mut frontier: Vec<Vec<usize>> = vec![vec![]];
    for _ in 0..shapes.len() {
        let mut next = Vec::new();
        for f in &frontier {
            for i in 0..shapes.len() {
                if !f.contains(&i) {
                    let mut g = f.clone();
                    g.push(i);
                    out.push(g.iter().map(|&j| shapes[j].clone()).collect());
                    next.push(g);
                }
            }
        }
        frontier = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_variants_are_all_ordered_subsets() {
        let v = shape_variants(&["a".into(), "b".into(), "c".into()]);
        // 1 empty + 3 + 6 + 6.
        assert_eq!(v.len(), 16);
        assert!(v.contains(&vec!["c".to_string(), "a".to_string()]));
        let o = order(50, 1);
        let mut s = o.clone();
        s.sort();
        assert_eq!(s, (0..50).collect::<Vec<_>>());
    }
}
