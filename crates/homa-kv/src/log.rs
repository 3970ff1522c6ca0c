//! A master's objects: an in-memory log of [`Entry`]s (every write and
//! delete, in order) and a hash index from key to the log position of the
//! key's newest *durable* entry. Entries are appended before they are
//! replicated and become visible (indexed) only once every backup has
//! them. Pure data structure: no I/O, tested on its own.

use crate::proto::{Entry, Versioned};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// How many applied writes' ids a master remembers (the newest): a retry
/// of an older one would be applied again.
pub const REMEMBERED_WRITES: usize = 100_000;

/// The log and its index.
#[derive(Debug, Default)]
pub struct Log {
    epoch: u64,
    entries: Vec<Entry>,
    /// Key → position in `entries` of its newest applied entry.
    index: HashMap<Bytes, usize>,
    /// Entries before this position are applied to the index (durable).
    applied: usize,
    /// The next version to hand out (versions grow across all keys).
    next_version: u64,
    bytes: u64,
    /// Applied writes' ids → their versions (at most
    /// [`REMEMBERED_WRITES`], oldest forgotten first).
    done: HashMap<u128, u64>,
    done_order: VecDeque<u128>,
}

impl Log {
    /// An empty log of incarnation `epoch`.
    pub fn new(epoch: u64) -> Log {
        Log {
            epoch,
            next_version: 1,
            ..Log::default()
        }
    }

    /// The log of a recovered master: the newest entry of every key among
    /// `found` (all backups' entries of earlier incarnations, in any order,
    /// duplicates allowed), rewritten as incarnation `epoch`'s first
    /// entries (tombstones kept, so that no older entry can come back).
    /// Nothing is applied yet: the caller replicates, then [`Self::apply_all`].
    pub fn recovered(epoch: u64, found: impl IntoIterator<Item = Entry>) -> Log {
        // Replay in (epoch, seq) order: later incarnations and later
        // positions win.
        let ordered: BTreeMap<(u64, u64), Entry> =
            found.into_iter().map(|e| ((e.epoch, e.seq), e)).collect();
        let mut newest: HashMap<Bytes, Entry> = HashMap::new();
        let mut max_version = 0;
        // Every found write's id, superseded ones too: a client may still
        // be retrying any of them.
        let mut ids = Vec::new();
        for (_, e) in ordered {
            max_version = max_version.max(e.version);
            if e.write_id != 0 {
                ids.push((e.write_id, e.version));
            }
            newest.insert(e.key.clone(), e);
        }
        let mut keep: Vec<Entry> = newest.into_values().collect();
        keep.sort_by_key(|e| e.version);
        let mut log = Log::new(epoch);
        log.next_version = max_version + 1;
        for e in keep {
            log.push(e.key, e.value, e.version, e.write_id);
        }
        for (id, v) in ids {
            log.remember(id, v);
        }
        log
    }

    fn remember(&mut self, id: u128, version: u64) {
        if id == 0 || self.done.insert(id, version).is_some() {
            return;
        }
        self.done_order.push_back(id);
        if self.done_order.len() > REMEMBERED_WRITES {
            if let Some(old) = self.done_order.pop_front() {
                self.done.remove(&old);
            }
        }
    }

    /// The version an applied write of id `id` got, if it is remembered.
    pub fn done(&self, id: u128) -> Option<u64> {
        if id == 0 {
            return None;
        }
        self.done.get(&id).copied()
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// All entries (durable or not).
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Entries at and after `from`.
    pub fn since(&self, from: usize) -> &[Entry] {
        &self.entries[from.min(self.entries.len())..]
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of keys and values in the log.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Keys with a live (not deleted) durable object.
    pub fn live_keys(&self) -> usize {
        self.index
            .values()
            .filter(|&&i| self.entries[i].value.is_some())
            .count()
    }

    /// Position of the first entry not yet applied.
    pub fn applied(&self) -> usize {
        self.applied
    }

    /// The durable object of `key`.
    pub fn get(&self, key: &[u8]) -> Option<Versioned> {
        let e = &self.entries[*self.index.get(key)?];
        e.value.as_ref().map(|v| Versioned {
            version: e.version,
            value: v.clone(),
        })
    }

    /// The version a conditional write compares with: of the newest entry
    /// of `key`, applied or not (0: none, or deleted).
    pub fn current_version(&self, key: &[u8]) -> u64 {
        let pending = self.entries[self.applied..]
            .iter()
            .rev()
            .find(|e| e.key.as_ref() == key);
        let e = match pending {
            Some(e) => Some(e),
            None => self.index.get(key).map(|&i| &self.entries[i]),
        };
        e.filter(|e| e.value.is_some()).map_or(0, |e| e.version)
    }

    /// Appends a write (`Some`) or delete (`None`) of `key` with a new
    /// version; returns the entry. Not visible until applied.
    pub fn append(&mut self, key: Bytes, value: Option<Bytes>, write_id: u128) -> Entry {
        let v = self.next_version;
        self.push(key, value, v, write_id)
    }

    fn push(&mut self, key: Bytes, value: Option<Bytes>, version: u64, write_id: u128) -> Entry {
        self.next_version = self.next_version.max(version + 1);
        self.bytes += (key.len() + value.as_ref().map_or(0, |v| v.len())) as u64;
        let e = Entry {
            epoch: self.epoch,
            seq: self.entries.len() as u64,
            version,
            key,
            value,
            write_id,
        };
        self.entries.push(e.clone());
        e
    }

    /// Makes every entry so far visible (they are all durable now).
    pub fn apply_all(&mut self) {
        for i in self.applied..self.entries.len() {
            self.index.insert(self.entries[i].key.clone(), i);
            let (id, v) = (self.entries[i].write_id, self.entries[i].version);
            self.remember(id, v);
        }
        self.applied = self.entries.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn entries_are_visible_once_applied() {
        let mut log = Log::new(1);
        let e = log.append(b("k"), Some(b("v1")), 7);
        assert_eq!((e.epoch, e.seq, e.version), (1, 0, 1));
        assert_eq!(log.get(b"k"), None);
        assert_eq!(log.current_version(b"k"), 1);
        log.apply_all();
        assert_eq!(log.get(b"k").unwrap().value, b("v1"));
        assert_eq!(
            (log.done(7), log.done(8), log.done(0)),
            (Some(1), None, None)
        );
        let e2 = log.append(b("k"), Some(b("v2")), 8);
        assert_eq!(e2.version, 2);
        assert_eq!(log.get(b"k").unwrap().version, 1);
        log.apply_all();
        assert_eq!(log.get(b"k").unwrap().value, b("v2"));
        log.append(b("k"), None, 0);
        log.apply_all();
        assert_eq!(log.get(b"k"), None);
        assert_eq!(log.current_version(b"k"), 0);
        assert_eq!(log.live_keys(), 0);
    }

    #[test]
    fn recovery_keeps_the_newest_entry_of_each_key() {
        let mut a = Log::new(1);
        a.append(b("x"), Some(b("x1")), 11);
        a.append(b("y"), Some(b("y1")), 12);
        a.append(b("x"), Some(b("x2")), 13);
        a.append(b("y"), None, 14);
        // Backups hold overlapping pieces, in any order.
        let mut found: Vec<Entry> = a.entries().to_vec();
        found.extend(a.entries()[1..3].iter().cloned());
        found.reverse();
        let mut r = Log::recovered(2, found);
        assert_eq!(r.len(), 2, "one entry per key, tombstone kept");
        assert!(r.entries().iter().all(|e| e.epoch == 2));
        r.apply_all();
        assert_eq!(
            r.get(b"x").unwrap(),
            Versioned {
                version: 3,
                value: b("x2")
            }
        );
        assert_eq!(r.get(b"y"), None);
        // Every found write is remembered, superseded ones too.
        assert_eq!(
            (r.done(11), r.done(13), r.done(14)),
            (Some(1), Some(3), Some(4))
        );
        // New versions continue above every recovered one.
        assert_eq!(r.append(b("z"), Some(b("z")), 0).version, 5);
        // A later incarnation wins over an earlier one at any seq.
        let mut found = r.entries().to_vec();
        found.push(Entry {
            epoch: 1,
            seq: 99,
            version: 1,
            key: b("x"),
            value: Some(b("stale")),
            write_id: 0,
        });
        let mut r2 = Log::recovered(3, found);
        r2.apply_all();
        assert_eq!(r2.get(b"x").unwrap().value, b("x2"));
        assert_eq!(r2.get(b"z").unwrap().version, 5);
    }
}
