//! The store in one process on loopback: operations and typed errors,
//! replication to every backup, a backup's replacement, a master's
//! recovery, and a linearizability check over a concurrent history with
//! both failures. Bounded: every wait has a deadline of a few seconds.

use bytes::Bytes;
use homa_kv::check::{check, read_back, Kind, Op};
use homa_kv::cluster::{ClusterSpec, LocalCluster};
use homa_kv::proto::backup;
use homa_kv::{KvClient, KvError, MAX_VALUE};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn cluster(masters: u32, backups: usize) -> LocalCluster {
    LocalCluster::start(ClusterSpec {
        masters,
        backups,
        replicas: 3,
        ..ClusterSpec::default()
    })
    .unwrap()
}

/// (slot, entries, bytes) that backup `addr` holds.
fn held(addr: SocketAddr) -> Vec<(u32, u64, u64)> {
    let rpc = homa_rpc::Client::new(homa::Endpoint::bind("127.0.0.1:0").unwrap());
    backup::Client::new(rpc.with_timeout(Duration::from_secs(1)), addr)
        .stats(&())
        .unwrap()
        .slots
}

fn entries_of(addr: SocketAddr, slot: u32) -> u64 {
    held(addr).iter().find(|s| s.0 == slot).map_or(0, |s| s.1)
}

#[test]
fn operations_and_typed_errors() {
    let c = cluster(2, 3);
    let kv = c.client().unwrap();
    assert_eq!(kv.get(b"nothing").unwrap(), None);
    let v1 = kv.put(b"a", &b"one"[..]).unwrap();
    let got = kv.get(b"a").unwrap().unwrap();
    assert_eq!((got.version, &got.value[..]), (v1, &b"one"[..]));
    // Conditional writes.
    let e = kv.put_if(b"a", &b"x"[..], v1 + 100).unwrap_err();
    assert!(
        matches!(e, KvError::VersionMismatch { expected, current } if expected == v1 + 100 && current == v1),
        "{e}"
    );
    let v2 = kv.put_if(b"a", &b"two"[..], v1).unwrap();
    assert!(v2 > v1);
    assert!(kv.put_if(b"new", &b"n"[..], 0).is_ok());
    assert!(matches!(
        kv.put_if(b"new", &b"n"[..], 0),
        Err(KvError::VersionMismatch { .. })
    ));
    // Delete, and a delete of nothing.
    kv.delete(b"a").unwrap();
    assert_eq!(kv.get(b"a").unwrap(), None);
    kv.delete(b"a").unwrap();
    // Multi-read across both masters.
    let keys: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    for k in &keys {
        kv.put(k.as_bytes(), Bytes::from(k.clone())).unwrap();
    }
    let mut ks: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    ks.push(b"absent");
    let got = kv.multi_get(&ks).unwrap();
    for (k, v) in keys.iter().zip(&got) {
        assert_eq!(&v.as_ref().unwrap().value[..], k.as_bytes());
    }
    assert_eq!(got[20], None);
    // The largest value goes through; one byte more is refused.
    let big = Bytes::from(vec![9u8; MAX_VALUE]);
    kv.put(b"big", big.clone()).unwrap();
    assert_eq!(kv.get(b"big").unwrap().unwrap().value, big);
    let e = kv.put(b"big", vec![0u8; MAX_VALUE + 1]).unwrap_err();
    assert!(matches!(e, KvError::ValueTooLarge(_)), "{e}");
    assert!(matches!(
        kv.get(&[b'k'; 300]),
        Err(KvError::KeyTooLong(300))
    ));
}

#[test]
fn every_acknowledged_write_is_on_all_replicas() {
    let c = cluster(1, 3);
    let kv = c.client().unwrap();
    for i in 0..50 {
        kv.put(format!("k{i}").as_bytes(), vec![1u8; 100]).unwrap();
    }
    for b in c.backups().into_iter().flatten() {
        assert_eq!(entries_of(b, 0), 50, "backup {b}");
    }
}

#[test]
fn a_dead_backup_is_replaced_and_the_log_re_replicated() {
    let mut c = cluster(1, 4);
    let kv = c.client().unwrap();
    for i in 0..200 {
        kv.put(format!("k{i}").as_bytes(), format!("v{i}")).unwrap();
    }
    let backups = c.backups();
    let (victim, spare) = {
        let holds: Vec<bool> = backups
            .iter()
            .map(|b| entries_of(b.unwrap(), 0) == 200)
            .collect();
        assert_eq!(holds.iter().filter(|h| **h).count(), 3);
        (
            holds.iter().position(|h| *h).unwrap(),
            holds.iter().position(|h| !*h).unwrap(),
        )
    };
    c.kill_backup(victim);
    let t0 = Instant::now();
    kv.put(b"after", &b"the failure"[..]).unwrap();
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "write resumed after {took:?}"
    );
    // The spare now holds the whole log, and every key reads back.
    assert_eq!(entries_of(backups[spare].unwrap(), 0), 201);
    for i in 0..200 {
        let v = kv.get(format!("k{i}").as_bytes()).unwrap().unwrap();
        assert_eq!(&v.value[..], format!("v{i}").as_bytes());
    }
    // The coordinator dropped the dead backup.
    let end = Instant::now() + Duration::from_secs(3);
    while kv.table().backups.len() != 3 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        kv.refresh().unwrap();
    }
    assert_eq!(kv.table().backups.len(), 3);
}

#[test]
fn a_restarted_master_recovers_every_acknowledged_write() {
    let mut c = cluster(1, 3);
    let kv = c.client().unwrap();
    let mut expect = std::collections::HashMap::new();
    for i in 0..300u32 {
        let k = format!("k{}", i % 120);
        let v = kv.put(k.as_bytes(), format!("v{i}")).unwrap();
        expect.insert(k, Some((v, format!("v{i}"))));
    }
    for i in (0..120).step_by(7) {
        let k = format!("k{i}");
        kv.delete(k.as_bytes()).unwrap();
        expect.insert(k, None);
    }
    let old = c.masters()[0];
    c.kill_master(0);
    let rec = c.restart_master(0).unwrap();
    assert!(rec.grant.epoch >= 2);
    assert_eq!(rec.objects, expect.values().filter(|v| v.is_some()).count());
    assert_ne!(c.masters()[0], old);
    // The client finds the new master by itself.
    for (k, want) in &expect {
        let got = kv.get(k.as_bytes()).unwrap();
        match want {
            Some((v, val)) => {
                let g = got.unwrap();
                assert_eq!((g.version, &g.value[..]), (*v, val.as_bytes()), "{k}");
            }
            None => assert_eq!(got, None, "{k} was deleted"),
        }
    }
    let max = expect.values().flatten().map(|v| v.0).max().unwrap();
    assert!(kv.put(b"k1", &b"later"[..]).unwrap() > max);
    // Older incarnations' entries were dropped from every backup: each
    // holds the recovered log (one entry per key) and the new write.
    for b in c.backups().into_iter().flatten() {
        assert_eq!(entries_of(b, 0), 121, "backup {b}");
    }
}

#[test]
fn concurrent_history_with_failures_is_linearizable() {
    let mut c = cluster(1, 4);
    let coord = c.coordinator();
    let history = Arc::new(Mutex::new(Vec::<Op>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let keys: Vec<Bytes> = (0..6).map(|i| Bytes::from(format!("reg{i}"))).collect();
    let workers: Vec<_> = (0..3u64)
        .map(|w| {
            let (history, stop, keys) = (history.clone(), stop.clone(), keys.clone());
            std::thread::spawn(move || {
                let kv = KvClient::connect(coord)
                    .unwrap()
                    .with_attempt_timeout(Duration::from_millis(400))
                    .with_retry_for(Duration::from_secs(5));
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let key = keys[((n * 7 + w) % keys.len() as u64) as usize].clone();
                    let start = Instant::now();
                    let kind = if n & 1 == 0 {
                        let value = Bytes::from(format!("w{w}-{n}"));
                        let version = kv.put(&key, value.clone()).ok();
                        Kind::Write { value, version }
                    } else {
                        match kv.get(&key) {
                            Ok(seen) => Kind::Read {
                                seen: seen.map(|v| (v.version, v.value)),
                            },
                            Err(_) => continue,
                        }
                    };
                    let op = Op {
                        key,
                        start,
                        end: Instant::now(),
                        kind,
                    };
                    history.lock().unwrap().push(op);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // A backup of the master's log dies...
    let victim = c
        .backups()
        .iter()
        .position(|b| entries_of(b.unwrap(), 0) > 0)
        .unwrap();
    c.kill_backup(victim);
    std::thread::sleep(Duration::from_millis(300));
    // ...then the master.
    c.kill_master(0);
    c.restart_master(0).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    // Final reads of every key, after everything.
    let kv = c.client().unwrap();
    let mut h = history.lock().unwrap().clone();
    let acked = read_back(&mut h, &keys, |k| {
        kv.get(k).map(|o| o.map(|v| (v.version, v.value)))
    });
    assert!(acked > 20, "only {acked} acknowledged writes");
    check(&h).unwrap();
}

#[test]
fn a_retried_write_is_applied_once_even_across_a_recovery() {
    use homa_kv::proto::{master, WriteReq};
    use homa_rpc::Raw;
    let mut c = cluster(1, 3);
    let rpc = homa_rpc::Client::new(homa::Endpoint::bind("127.0.0.1:0").unwrap())
        .with_timeout(Duration::from_secs(2));
    let send = |c: &LocalCluster, req: &WriteReq| {
        rpc.call::<Raw, u64>(c.masters()[0].unwrap(), master::ids::write, &req.encode())
    };
    let req = |id: u128, value: &'static str| WriteReq {
        flags: 0,
        id,
        expected: 0,
        key: Bytes::from_static(b"k"),
        value: Bytes::from_static(value.as_bytes()),
    };
    let first = send(&c, &req(42, "a")).unwrap();
    let other = send(&c, &req(43, "b")).unwrap();
    // The retry of write 42 (its answer was "lost") changes nothing.
    assert_eq!(send(&c, &req(42, "a")).unwrap(), first);
    let kv = c.client().unwrap();
    assert_eq!(kv.get(b"k").unwrap().unwrap().version, other);
    let b0 = c.backups()[0].unwrap();
    assert_eq!(entries_of(b0, 0), 2);
    // Nor after a recovery, although write 42 was superseded.
    c.restart_master(0).unwrap();
    assert_eq!(send(&c, &req(42, "a")).unwrap(), first);
    assert_eq!(send(&c, &req(43, "b")).unwrap(), other);
    assert_eq!(kv.get(b"k").unwrap().unwrap().value, &b"b"[..]);
}

#[test]
fn an_idle_master_replaces_a_lost_backup_too() {
    let mut c = cluster(1, 4);
    let kv = c.client().unwrap();
    for i in 0..50 {
        kv.put(format!("k{i}").as_bytes(), vec![3u8; 10]).unwrap();
    }
    let backups = c.backups();
    let holds: Vec<bool> = backups
        .iter()
        .map(|b| entries_of(b.unwrap(), 0) == 50)
        .collect();
    let victim = holds.iter().position(|h| *h).unwrap();
    let spare = holds.iter().position(|h| !*h).unwrap();
    c.kill_backup(victim);
    // No write: the master's watcher finds the loss (every 250 ms).
    let t0 = Instant::now();
    while entries_of(backups[spare].unwrap(), 0) < 50 {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "the spare got no log"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("replaced after {:?} without a write", t0.elapsed());
}
