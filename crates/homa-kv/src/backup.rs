//! A backup: replicas of masters' logs, by master slot, in memory. It
//! accepts appends from the current incarnation of each slot's master
//! (a fence refuses older ones once a newer one has started recovering)
//! and serves the entries back, page by page, for recovery.

use crate::proto::{backup, Append, BackupStats, DropOlder, Entry, Fetch, Fetched};
use homa_rpc::{Code, Context, Status};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// One master slot's replica.
#[derive(Debug, Default)]
struct Replica {
    /// Appends of incarnations before this are refused.
    fence: u64,
    entries: BTreeMap<(u64, u64), Entry>,
    bytes: u64,
}

/// What a backup holds. Pure state; [`BackupService`] serves it.
#[derive(Debug, Default)]
pub struct BackupStore {
    slots: HashMap<u32, Replica>,
}

impl BackupStore {
    /// Stores `a`'s entries (idempotent: a resent entry replaces itself).
    pub fn append(&mut self, a: Append) -> Result<(), Status> {
        let r = self.slots.entry(a.slot).or_default();
        if a.epoch < r.fence {
            return Err(Status::new(
                Code::Aborted,
                format!(
                    "slot {} incarnation {} is fenced off (now {})",
                    a.slot, a.epoch, r.fence
                ),
            ));
        }
        for e in a.entries {
            let n = e.wire_len() as u64;
            if let Some(old) = r.entries.insert((e.epoch, e.seq), e) {
                r.bytes -= old.wire_len() as u64;
            }
            r.bytes += n;
        }
        Ok(())
    }

    /// A page of entries after `f.after`, at most about `f.max_bytes`
    /// (at least one entry). Raises the fence to `f.epoch`.
    pub fn fetch(&mut self, f: Fetch) -> Fetched {
        let r = self.slots.entry(f.slot).or_default();
        r.fence = r.fence.max(f.epoch);
        let range = match f.after {
            None => r.entries.range(..),
            Some(k) => r
                .entries
                .range((std::ops::Bound::Excluded(k), std::ops::Bound::Unbounded)),
        };
        let mut entries = Vec::new();
        let mut size = 0usize;
        let mut more = false;
        for (_, e) in range {
            if !entries.is_empty() && size + e.wire_len() > f.max_bytes as usize {
                more = true;
                break;
            }
            size += e.wire_len();
            entries.push(e.clone());
        }
        Fetched { entries, more }
    }

    /// Drops `slot`'s entries of incarnations before `epoch`.
    pub fn drop_older(&mut self, d: DropOlder) {
        if let Some(r) = self.slots.get_mut(&d.slot) {
            let keep = r.entries.split_off(&(d.epoch, 0));
            r.entries = keep;
            r.bytes = r.entries.values().map(|e| e.wire_len() as u64).sum();
            r.fence = r.fence.max(d.epoch);
        }
    }

    pub fn stats(&self) -> BackupStats {
        let mut slots: Vec<_> = self
            .slots
            .iter()
            .map(|(s, r)| (*s, r.entries.len() as u64, r.bytes))
            .collect();
        slots.sort();
        BackupStats { slots }
    }
}

/// The backup service over a [`BackupStore`].
#[derive(Default)]
pub struct BackupService {
    store: Mutex<BackupStore>,
}

impl BackupService {
    fn store(&self) -> std::sync::MutexGuard<'_, BackupStore> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl backup::Service for BackupService {
    fn append(&self, _cx: &Context, a: Append) -> Result<(), Status> {
        self.store().append(a)
    }
    fn fetch(&self, _cx: &Context, f: Fetch) -> Result<Fetched, Status> {
        Ok(self.store().fetch(f))
    }
    fn drop_older(&self, _cx: &Context, d: DropOlder) -> Result<(), Status> {
        self.store().drop_older(d);
        Ok(())
    }
    fn ping(&self, _cx: &Context, _: ()) -> Result<(), Status> {
        Ok(())
    }
    fn stats(&self, _cx: &Context, _: ()) -> Result<BackupStats, Status> {
        Ok(self.store().stats())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn entry(epoch: u64, seq: u64) -> Entry {
        Entry {
            epoch,
            seq,
            version: seq + 1,
            key: Bytes::from(format!("k{seq}")),
            value: Some(Bytes::from(vec![7u8; 100])),
            write_id: 0,
        }
    }

    #[test]
    fn appends_are_idempotent_and_fetched_in_pages() {
        let mut s = BackupStore::default();
        let a = |epoch, r: std::ops::Range<u64>| Append {
            slot: 3,
            epoch,
            entries: r.map(|i| entry(epoch, i)).collect(),
        };
        s.append(a(1, 0..10)).unwrap();
        s.append(a(1, 5..20)).unwrap(); // overlaps
        assert_eq!(s.stats().slots, vec![(3, 20, 20 * (56 + 3 + 100) - 10)]);
        let mut got = Vec::new();
        let mut after = None;
        loop {
            let p = s.fetch(Fetch {
                slot: 3,
                epoch: 2,
                after,
                max_bytes: 500,
            });
            assert!(!p.entries.is_empty() && p.entries.len() <= 4);
            after = p.entries.last().map(|e| (e.epoch, e.seq));
            got.extend(p.entries);
            if !p.more {
                break;
            }
        }
        assert_eq!(got.len(), 20);
        assert!(got.windows(2).all(|w| w[0].seq < w[1].seq));
        // The fetch fenced incarnation 1 off.
        assert_eq!(s.append(a(1, 20..21)).unwrap_err().code(), Code::Aborted);
        s.append(a(2, 0..2)).unwrap();
        s.drop_older(DropOlder { slot: 3, epoch: 2 });
        assert_eq!(s.stats().slots[0].1, 2);
        // Another slot is separate.
        assert!(s
            .fetch(Fetch {
                slot: 4,
                epoch: 1,
                after: None,
                max_bytes: 10
            })
            .entries
            .is_empty());
    }
}
