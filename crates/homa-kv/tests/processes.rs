//! The store as real processes on loopback (the `homa-kv` binary, as
//! `homa kv` runs it): a backup killed (SIGKILL) in the middle of a
//! write-heavy run, and a master killed and restarted. No root needed.

use homa_kv::KvClient;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A process of the store, killed when dropped.
struct Proc {
    child: Child,
    addr: SocketAddr,
}

impl Proc {
    /// Starts `homa-kv ARGS` and waits for its `ROLE ADDR` line.
    fn start(args: &[&str]) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_homa-kv"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("homa-kv starts");
        let mut line = String::new();
        let out = child.stdout.take().unwrap();
        BufReader::new(out).read_line(&mut line).unwrap();
        let addr = line
            .split_whitespace()
            .nth(1)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("{args:?} printed {line:?}"));
        Proc { child, addr }
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn store(backups: usize) -> (Proc, Vec<Proc>, Proc) {
    let coord = Proc::start(&["coordinator", "--masters", "1"]);
    let c = coord.addr.to_string();
    // One at a time: they enlist in this order, and the master's first
    // replicas are the first three.
    let bs = (0..backups)
        .map(|_| Proc::start(&["backup", "--coordinator", &c]))
        .collect();
    let m = Proc::start(&["master", "--coordinator", &c, "--replicas", "3"]);
    (coord, bs, m)
}

#[test]
fn a_backup_killed_mid_write_heavy_run_loses_no_acknowledged_write() {
    backup_fails_mid_run(false);
}

/// A stopped (SIGSTOP) backup does not answer at all: the master finds
/// out by its replication timeout (200 ms), not from the kernel.
#[test]
fn a_frozen_backup_is_replaced_too() {
    backup_fails_mid_run(true);
}

fn signal(p: &Proc, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &p.child.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig}");
}

fn backup_fails_mid_run(freeze: bool) {
    let (coord, mut backups, _master) = store(4);
    let stop = Arc::new(AtomicBool::new(false));
    // Every acknowledged write: (key, version), and when it was acknowledged.
    let acked = Arc::new(Mutex::new(Vec::<(String, u64, Instant)>::new()));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (stop, acked) = (stop.clone(), acked.clone());
            let c = coord.addr;
            std::thread::spawn(move || {
                let kv = KvClient::connect(c).unwrap();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let k = format!("w{w}-{i}");
                    if let Ok(v) = kv.put(k.as_bytes(), k.clone().into_bytes()) {
                        acked.lock().unwrap().push((k, v, Instant::now()));
                    }
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let killed_at = Instant::now();
    // One of the master's three replicas.
    let frozen = if freeze {
        signal(&backups[0], "-STOP");
        Some(backups.remove(0))
    } else {
        backups.remove(0).kill();
        None
    };
    std::thread::sleep(Duration::from_millis(1_000));
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    // Writes resumed within 1 s: the longest pause between acknowledgements
    // (of either writer) around the kill.
    let mut times: Vec<Instant> = acked.iter().map(|a| a.2).collect();
    times.sort();
    let gap = times
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    let after = times.iter().filter(|t| **t > killed_at).count();
    assert!(
        after > 10,
        "only {after} writes acknowledged after the kill"
    );
    assert!(gap < Duration::from_secs(1), "writes paused for {gap:?}");
    eprintln!(
        "{} writes acknowledged, {after} after the kill; longest pause {gap:?}",
        acked.len()
    );
    if let Some(p) = frozen {
        signal(&p, "-CONT");
        p.kill();
    }
    // The spare backup took the dead one's place and holds the whole log.
    let rpc = homa_rpc::Client::new(homa::Endpoint::bind("127.0.0.1:0").unwrap());
    let spare = homa_kv::proto::backup::Client::new(rpc, backups[2].addr)
        .with_timeout(Duration::from_secs(1))
        .stats(&())
        .unwrap();
    let held = spare.slots.first().map_or(0, |s| s.1);
    assert!(held >= acked.len() as u64, "{held} entries on the spare");
    // Every acknowledged write reads back.
    let kv = KvClient::connect(coord.addr).unwrap();
    for (k, v, _) in &acked {
        let got = kv.get(k.as_bytes()).unwrap().expect("acknowledged key");
        assert_eq!((got.version, &got.value[..]), (*v, k.as_bytes()));
    }
}

#[test]
fn a_master_killed_and_restarted_recovers_every_acknowledged_write() {
    let (coord, _backups, master) = store(3);
    let kv = KvClient::connect(coord.addr)
        .unwrap()
        .with_attempt_timeout(Duration::from_millis(500));
    let mut acked = Vec::new();
    for i in 0..400u32 {
        let k = format!("k{}", i % 300);
        let val = format!("v{i}");
        acked.push((k.clone(), kv.put(k.as_bytes(), val.into_bytes()).unwrap()));
    }
    let last: std::collections::HashMap<String, (u64, String)> = acked
        .iter()
        .enumerate()
        .map(|(i, (k, v))| (k.clone(), (*v, format!("v{i}"))))
        .collect();
    master.kill();
    let c = coord.addr.to_string();
    let _new = Proc::start(&["master", "--coordinator", &c, "--slot", "0"]);
    for (k, (v, val)) in &last {
        let got = kv.get(k.as_bytes()).unwrap().expect("recovered");
        assert_eq!((got.version, &got.value[..]), (*v, val.as_bytes()), "{k}");
    }
    assert!(kv.put(b"k0", &b"again"[..]).unwrap() > acked.last().unwrap().1);
}

/// Three clients read and write six registers while one of the master's
/// backups is killed and then the master is killed and restarted; the
/// history, final reads included, must be linearizable.
#[test]
fn a_history_with_real_process_failures_is_linearizable() {
    use bytes::Bytes;
    use homa_kv::check::{check, read_back, Kind, Op};
    let (coord, mut backups, master) = store(4);
    let history = Arc::new(Mutex::new(Vec::<Op>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let keys: Vec<Bytes> = (0..6).map(|i| Bytes::from(format!("reg{i}"))).collect();
    let clients: Vec<_> = (0..3u64)
        .map(|w| {
            let (history, stop, keys) = (history.clone(), stop.clone(), keys.clone());
            let c = coord.addr;
            std::thread::spawn(move || {
                let kv = KvClient::connect(c)
                    .unwrap()
                    .with_attempt_timeout(Duration::from_millis(400))
                    .with_retry_for(Duration::from_secs(5));
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let key = keys[((n * 5 + w) % keys.len() as u64) as usize].clone();
                    let start = Instant::now();
                    let kind = if n % 3 == 2 {
                        match kv.get(&key) {
                            Ok(seen) => Kind::Read {
                                seen: seen.map(|v| (v.version, v.value)),
                            },
                            Err(_) => continue,
                        }
                    } else {
                        let value = Bytes::from(format!("c{w}-{n}"));
                        let version = kv.put(&key, value.clone()).ok();
                        Kind::Write { value, version }
                    };
                    let end = Instant::now();
                    history.lock().unwrap().push(Op {
                        key,
                        start,
                        end,
                        kind,
                    });
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    backups.remove(0).kill();
    std::thread::sleep(Duration::from_millis(300));
    master.kill();
    let c = coord.addr.to_string();
    let _new = Proc::start(&["master", "--coordinator", &c, "--slot", "0"]);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for t in clients {
        t.join().unwrap();
    }
    let kv = KvClient::connect(coord.addr).unwrap();
    let mut h = history.lock().unwrap().clone();
    let acked = read_back(&mut h, &keys, |k| {
        kv.get(k).map(|o| o.map(|v| (v.version, v.value)))
    });
    assert!(acked > 20, "only {acked} acknowledged writes");
    eprintln!("{} operations, {acked} acknowledged writes", h.len());
    check(&h).unwrap();
}
