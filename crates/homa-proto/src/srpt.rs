//! An SRPT queue: entries ordered by (remaining bytes, birth, key), with the
//! smallest kept outside the tree. The head is the message being served, and
//! serving it only makes it smaller, so the common per-packet update is one
//! integer store instead of a tree removal and insertion. A queue of one
//! entry (the common case for short messages) never allocates: a `BTreeSet`
//! frees its last node when emptied, so using one alone would cost an
//! allocation and a free per message.

use crate::rpc::RpcKey;
use std::collections::BTreeSet;

pub(crate) type Entry = (u32, u64, RpcKey);

/// An ordered set with its smallest element kept outside the tree.
pub(crate) struct SrptQueue<E = Entry> {
    /// Smallest entry; every entry of `rest` is greater.
    head: Option<E>,
    rest: BTreeSet<E>,
}

impl<E> Default for SrptQueue<E> {
    fn default() -> Self {
        SrptQueue {
            head: None,
            rest: BTreeSet::new(),
        }
    }
}

impl<E: Ord + Copy> SrptQueue<E> {
    pub fn insert(&mut self, e: E) {
        match self.head {
            None => self.head = Some(e),
            Some(h) if e < h => {
                self.rest.insert(h);
                self.head = Some(e);
            }
            Some(_) => {
                self.rest.insert(e);
            }
        }
    }

    pub fn remove(&mut self, e: &E) -> bool {
        if self.head.as_ref() == Some(e) {
            // Usually the only entry: skip the tree's own emptiness walk.
            self.head = if self.rest.is_empty() {
                None
            } else {
                self.rest.pop_first()
            };
            true
        } else {
            self.rest.remove(e)
        }
    }

    pub fn first(&self) -> Option<&E> {
        self.head.as_ref()
    }

    pub fn len(&self) -> usize {
        self.head.is_some() as usize + self.rest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.head.is_none()
    }

    /// Entries in order.
    pub fn iter(&self) -> impl Iterator<Item = &E> + '_ {
        self.head.iter().chain(self.rest.iter())
    }
}

impl SrptQueue<Entry> {
    /// Moves entry `e` to `remaining` bytes. Cheap when `e` is the head and
    /// shrinks (it stays the head).
    pub fn update(&mut self, e: &Entry, remaining: u32) {
        match &mut self.head {
            Some(h) if h == e && remaining <= e.0 => h.0 = remaining,
            _ => {
                if self.remove(e) {
                    self.insert((remaining, e.1, e.2));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_srpt_order_through_updates() {
        let mut q: SrptQueue = SrptQueue::default();
        q.insert((50, 1, 1));
        q.insert((10, 2, 2));
        q.insert((30, 3, 3));
        assert_eq!(q.first(), Some(&(10, 2, 2)));
        q.update(&(10, 2, 2), 5);
        assert_eq!(q.first(), Some(&(5, 2, 2)));
        // A non-head entry that shrinks below the head takes its place.
        q.update(&(30, 3, 3), 1);
        assert_eq!(
            q.iter().copied().collect::<Vec<_>>(),
            [(1, 3, 3), (5, 2, 2), (50, 1, 1)]
        );
        // The head growing (a restart) moves it back.
        q.update(&(1, 3, 3), 60);
        assert_eq!(
            q.iter().copied().collect::<Vec<_>>(),
            [(5, 2, 2), (50, 1, 1), (60, 3, 3)]
        );
        assert!(q.remove(&(5, 2, 2)));
        assert!(!q.remove(&(5, 2, 2)));
        assert_eq!(q.first(), Some(&(50, 1, 1)));
        assert_eq!(q.len(), 2);
        assert!(q.remove(&(50, 1, 1)) && q.remove(&(60, 3, 3)));
        assert!(q.is_empty());
    }
}
