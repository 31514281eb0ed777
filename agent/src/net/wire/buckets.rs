//! Sets of buckets on the wire: `DiffRequest.empty` and `DiffChunk.whole`
//! are bitmaps of the id space's buckets (bucket b is bit b % 8 of byte
//! b / 8), 128 bytes for 1,024 buckets where a list would take up to 3 KB.

use keysync_machine::core::digest::N_BUCKETS;
use keysync_machine::node::Whole;

/// The bitmap of `buckets` (empty when there are none); buckets out of range are left out.
pub fn to_bitmap(buckets: impl IntoIterator<Item = u32>) -> Vec<u8> {
    let mut bitmap = Vec::new();
    for bucket in buckets.into_iter().filter(|&b| (b as usize) < N_BUCKETS) {
        bitmap.resize(N_BUCKETS / 8, 0);
        bitmap[bucket as usize / 8] |= 1 << (bucket % 8);
    }
    bitmap
}

/// The buckets a bitmap names, in order; `None` when it is neither empty
/// nor one bit per bucket.
pub fn from_bitmap(bitmap: &[u8]) -> Option<Vec<u32>> {
    match bitmap.len() {
        0 => Some(Vec::new()),
        n if n == N_BUCKETS / 8 => {
            Some((0..N_BUCKETS as u32).filter(|&b| bitmap[b as usize / 8] & (1 << (b % 8)) != 0).collect())
        }
        _ => None,
    }
}

/// `DiffChunk.whole` and `whole_counts` read together; `None` when they
/// do not match (a bitmap of the wrong size, or a count per bucket missing
/// or extra).
pub fn whole_from_wire(bitmap: &[u8], counts: &[u32]) -> Option<Vec<Whole>> {
    let buckets = from_bitmap(bitmap)?;
    (buckets.len() == counts.len()).then(|| buckets.into_iter().zip(counts.iter().copied()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bitmap_names_its_buckets_and_nothing_else() {
        assert!(to_bitmap([]).is_empty(), "no bucket: no bytes");
        let bitmap = to_bitmap([0, 9, 1023, 5000]);
        assert_eq!(bitmap.len(), 128);
        assert_eq!(bitmap[1], 0b10, "bucket 9 is bit 1 of byte 1");
        assert_eq!(from_bitmap(&bitmap), Some(vec![0, 9, 1023]), "5000 is no bucket");
        assert_eq!(from_bitmap(&[]), Some(vec![]));
        assert_eq!(from_bitmap(&[1; 127]), None, "one bit per bucket, or nothing");
    }

    #[test]
    fn whole_buckets_need_one_count_each() {
        let bitmap = to_bitmap([3, 7]);
        assert_eq!(whole_from_wire(&bitmap, &[10, 20]), Some(vec![(3, 10), (7, 20)]));
        assert_eq!(whole_from_wire(&bitmap, &[10]), None);
        assert_eq!(whole_from_wire(&[], &[10]), None);
        assert_eq!(whole_from_wire(&[], &[]), Some(vec![]));
    }
}
