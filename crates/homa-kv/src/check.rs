//! A linearizability checker for a history of reads and writes of
//! per-key registers, using the versions the store returns.
//!
//! Every write that was acknowledged has a version, and a read tells
//! which version it saw; a write that failed (or timed out) may or may not
//! have happened, and is placed only if some read saw its value. The
//! history is linearizable if ordering every operation by version (each
//! write at `2v`, each read of `v` at `2v + 1`, reads of no object at 1)
//! respects real time: whenever A ended before B started, A's place is
//! not after B's. That order is then a legal sequential history, so a
//! pass proves linearizability; a failure names the two operations.
//! Deletes are not modelled (a history of writes and reads). Values must
//! be unique per write.

use bytes::Bytes;
use std::collections::HashMap;
use std::time::Instant;

/// What an operation did.
#[derive(Clone, Debug)]
pub enum Kind {
    /// `version`: Some if acknowledged; None if it failed or its outcome
    /// is unknown (it may or may not have taken effect).
    Write { value: Bytes, version: Option<u64> },
    /// What the read returned: (version, value), None when no object.
    Read { seen: Option<(u64, Bytes)> },
}

/// One completed operation.
#[derive(Clone, Debug)]
pub struct Op {
    pub key: Bytes,
    pub start: Instant,
    pub end: Instant,
    pub kind: Kind,
}

/// Why a history is not linearizable.
#[derive(Debug, thiserror::Error)]
#[error("key {key:?}: {what}")]
pub struct Violation {
    pub key: Bytes,
    pub what: String,
}

/// Ends a test's history: reads every key once more (after every other
/// operation), appends those reads, and returns how many writes were
/// acknowledged.
pub fn read_back<E: std::fmt::Debug>(
    history: &mut Vec<Op>,
    keys: &[Bytes],
    mut get: impl FnMut(&Bytes) -> Result<Option<(u64, Bytes)>, E>,
) -> usize {
    for k in keys {
        let start = Instant::now();
        let seen = get(k).expect("the read-back after the run");
        history.push(Op {
            key: k.clone(),
            start,
            end: Instant::now(),
            kind: Kind::Read { seen },
        });
    }
    history
        .iter()
        .filter(|o| {
            matches!(
                o.kind,
                Kind::Write {
                    version: Some(_),
                    ..
                }
            )
        })
        .count()
}

/// Checks every key's register history.
pub fn check(history: &[Op]) -> Result<(), Violation> {
    let mut by_key: HashMap<&Bytes, Vec<&Op>> = HashMap::new();
    for op in history {
        by_key.entry(&op.key).or_default().push(op);
    }
    for (key, ops) in by_key {
        check_key(key, &ops)?;
    }
    Ok(())
}

fn check_key(key: &Bytes, ops: &[&Op]) -> Result<(), Violation> {
    let fail = |what: String| Violation {
        key: key.clone(),
        what,
    };
    // Writes by value: (version if acknowledged, the op).
    let mut writes: HashMap<&Bytes, (Option<u64>, &Op)> = HashMap::new();
    let mut versions: HashMap<u64, &Bytes> = HashMap::new();
    for op in ops {
        if let Kind::Write { value, version } = &op.kind {
            if writes.insert(value, (*version, op)).is_some() {
                return Err(fail(format!("value {value:?} written twice")));
            }
            if let Some(v) = version {
                if versions.insert(*v, value).is_some() {
                    return Err(fail(format!("version {v} acknowledged twice")));
                }
            }
        }
    }
    // (place, start, end) of every placed operation; a write of unknown
    // outcome that was seen has no end that constrains others.
    let mut placed: Vec<(u64, Instant, Option<Instant>)> = Vec::new();
    for op in ops {
        match &op.kind {
            Kind::Write {
                version: Some(v), ..
            } => placed.push((2 * v, op.start, Some(op.end))),
            Kind::Write { version: None, .. } => {}
            Kind::Read { seen: None } => placed.push((1, op.start, Some(op.end))),
            Kind::Read {
                seen: Some((v, value)),
            } => {
                match writes.get(value) {
                    Some((Some(wv), _)) if wv == v => {}
                    Some((Some(wv), _)) => {
                        return Err(fail(format!(
                            "a read saw {value:?} at version {v}, written as version {wv}"
                        )))
                    }
                    Some((None, w)) => {
                        if versions.insert(*v, value).is_some_and(|x| x != value) {
                            return Err(fail(format!("version {v} holds two values")));
                        }
                        placed.push((2 * v, w.start, None));
                    }
                    None => return Err(fail(format!("a read saw {value:?}, never written"))),
                }
                placed.push((2 * v + 1, op.start, Some(op.end)));
            }
        }
    }
    // Sweep: operations by start; all that ended before it must be placed
    // at or before it.
    let mut by_end: Vec<(Instant, u64)> = placed
        .iter()
        .filter_map(|(p, _, e)| e.map(|e| (e, *p)))
        .collect();
    by_end.sort();
    let mut by_start: Vec<(Instant, u64)> = placed.iter().map(|(p, s, _)| (*s, *p)).collect();
    by_start.sort();
    let mut i = 0;
    let mut max_before = 0u64;
    for (start, place) in by_start {
        while i < by_end.len() && by_end[i].0 < start {
            max_before = max_before.max(by_end[i].1);
            i += 1;
        }
        if place < max_before {
            return Err(fail(format!(
                "an operation at place {place} (version {}) started after one at place \
                 {max_before} (version {}) had ended",
                place / 2,
                max_before / 2
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    struct H {
        t0: Instant,
        ops: Vec<Op>,
    }

    impl H {
        fn new() -> H {
            H {
                t0: Instant::now(),
                ops: Vec::new(),
            }
        }
        fn at(&self, ms: u64) -> Instant {
            self.t0 + Duration::from_millis(ms)
        }
        fn w(&mut self, s: u64, e: u64, val: &str, version: Option<u64>) -> &mut H {
            self.ops.push(Op {
                key: Bytes::from_static(b"k"),
                start: self.at(s),
                end: self.at(e),
                kind: Kind::Write {
                    value: Bytes::copy_from_slice(val.as_bytes()),
                    version,
                },
            });
            self
        }
        fn r(&mut self, s: u64, e: u64, seen: Option<(u64, &str)>) -> &mut H {
            self.ops.push(Op {
                key: Bytes::from_static(b"k"),
                start: self.at(s),
                end: self.at(e),
                kind: Kind::Read {
                    seen: seen.map(|(v, x)| (v, Bytes::copy_from_slice(x.as_bytes()))),
                },
            });
            self
        }
    }

    #[test]
    fn legal_histories_pass() {
        let mut h = H::new();
        h.r(0, 1, None)
            .w(2, 5, "a", Some(1))
            .r(3, 4, Some((1, "a"))) // concurrent with the write: may see it
            .w(6, 9, "b", Some(2))
            .r(7, 8, Some((1, "a"))) // concurrent: may still see a
            .r(10, 11, Some((2, "b")))
            .w(12, 13, "lost?", None) // failed, never seen: fine
            .w(14, 20, "c", None) // failed but applied: seen later
            .r(21, 22, Some((4, "c")));
        check(&h.ops).unwrap();
    }

    #[test]
    fn stale_reads_lost_writes_and_phantoms_fail() {
        let mut h = H::new();
        h.w(0, 1, "a", Some(1)).r(2, 3, None);
        assert!(
            check(&h.ops).is_err(),
            "a read missed an acknowledged write"
        );
        let mut h = H::new();
        h.w(0, 1, "a", Some(1))
            .w(2, 3, "b", Some(2))
            .r(4, 5, Some((1, "a")));
        assert!(check(&h.ops).is_err(), "a stale read");
        let mut h = H::new();
        h.r(0, 1, Some((1, "z")));
        assert!(check(&h.ops).is_err(), "a value never written");
        let mut h = H::new();
        h.r(0, 1, Some((1, "a"))).w(2, 3, "a", Some(1));
        assert!(check(&h.ops).is_err(), "a read from the future");
        let mut h = H::new();
        h.w(0, 1, "a", Some(2)).w(2, 3, "b", Some(1));
        assert!(check(&h.ops).is_err(), "versions against real time");
    }
}
