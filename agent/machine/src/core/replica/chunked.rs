//! A vector kept in chunks of [`CHUNK`] elements: growing adds a chunk and
//! never moves what is held. A `Vec` that grows copies everything into a
//! larger allocation, and holds both for the copy: a master joining a site
//! of 1,000,000 keys grew its entries from 675,000 to 1,012,500 slots,
//! 59 MB and 89 MB at once.

/// Elements per chunk: 16,384 entries of 88 bytes are 1.4 MB.
pub(super) const CHUNK: usize = 1 << 14;

pub(super) struct Chunked<T> {
    /// Each of capacity [`CHUNK`]; all full but the one the next element
    /// goes into, and those after it, which are empty (room reserved).
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Chunked<T> {
    fn default() -> Chunked<T> {
        Chunked { chunks: Vec::new(), len: 0 }
    }
}

impl<T> Chunked<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    /// Elements it holds room for, without a new chunk.
    pub fn capacity(&self) -> usize {
        self.chunks.len() * CHUNK
    }

    /// Room for `additional` more: the chunks they need, now.
    pub fn reserve(&mut self, additional: usize) {
        let needed = self.len.saturating_add(additional).div_ceil(CHUNK);
        while self.chunks.len() < needed {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
    }

    pub fn push(&mut self, value: T) {
        let chunk = self.len / CHUNK;
        if chunk == self.chunks.len() {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        self.chunks[chunk].push(value);
        self.len += 1;
    }

    /// Removes the element at `at`; the last one takes its place.
    pub fn swap_remove(&mut self, at: usize) -> T {
        assert!(at < self.len, "swap_remove at {at} of {}", self.len);
        self.len -= 1;
        let chunk = self.len / CHUNK;
        let last = self.chunks[chunk].pop().expect("the last chunk holds the last element");
        // One empty chunk is kept for the next push; any beyond it go.
        self.chunks.truncate(chunk + 1 + usize::from(!self.chunks[chunk].is_empty()));
        if at == self.len {
            last
        } else {
            std::mem::replace(&mut self[at], last)
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> + Clone {
        self.chunks.iter().flatten()
    }
}

impl<T> std::ops::Index<usize> for Chunked<T> {
    type Output = T;

    fn index(&self, at: usize) -> &T {
        &self.chunks[at / CHUNK][at % CHUNK]
    }
}

impl<T> std::ops::IndexMut<usize> for Chunked<T> {
    fn index_mut(&mut self, at: usize) -> &mut T {
        &mut self.chunks[at / CHUNK][at % CHUNK]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a `Vec` doing the same, across chunk boundaries both ways.
    #[test]
    fn pushes_and_swap_removes_as_a_vec_does() {
        let mut chunked = Chunked::default();
        let mut model = Vec::new();
        for n in 0..3 * CHUNK + 5 {
            chunked.push(n);
            model.push(n);
        }
        // Removing from the front, the middle and the end.
        let mut at = 0;
        while model.len() > CHUNK / 2 {
            at = (at + 7919) % model.len();
            assert_eq!(chunked.swap_remove(at), model.swap_remove(at));
            assert_eq!(chunked.len(), model.len());
        }
        assert!(chunked.iter().eq(model.iter()));
        assert!((0..model.len()).all(|at| chunked[at] == model[at]));
        // Emptied chunks went (one spare kept): 8,192 elements are in one chunk.
        assert_eq!(chunked.capacity(), 2 * CHUNK);
        while !model.is_empty() {
            assert_eq!(chunked.swap_remove(model.len() - 1), model.pop().unwrap());
        }
        assert_eq!(chunked.capacity(), CHUNK);
        chunked.push(1);
        assert!(chunked.iter().eq([1].iter()));
    }

    /// Reserved room is whole chunks, made at once; filling it makes none.
    #[test]
    fn room_reserved_is_whole_chunks_and_filling_it_moves_nothing() {
        let mut chunked = Chunked::default();
        chunked.reserve(CHUNK + 1);
        assert_eq!(chunked.capacity(), 2 * CHUNK);
        chunked.push(0u32);
        let first = std::ptr::from_ref(&chunked[0]);
        for n in 1..2 * CHUNK as u32 {
            chunked.push(n);
        }
        assert_eq!(chunked.capacity(), 2 * CHUNK);
        chunked.push(0);
        assert_eq!(chunked.capacity(), 3 * CHUNK);
        assert_eq!(std::ptr::from_ref(&chunked[0]), first, "growing moved what was held");
    }
}
