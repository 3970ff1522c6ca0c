//! kv-bench's Redis side: a primary and R replicas (`redis-server`
//! processes on free loopback ports, no persistence), and closed-loop GET
//! and SET+WAIT R through the `redis` crate, one command at a time (no
//! pipelining). The processes are killed when [`RedisCluster`] drops.

use hdrhistogram::Histogram;
use homa_bench::stats::{new_histogram, record};
use rand::Rng;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A Redis primary and its replicas.
pub struct RedisCluster {
    children: Vec<Child>,
    dir: std::path::PathBuf,
    pub port: u16,
    pub replicas: usize,
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn spawn(port: u16, primary: Option<u16>, dir: &std::path::Path) -> anyhow::Result<Child> {
    let mut c = Command::new("redis-server");
    c.args(["--port", &port.to_string()])
        // Full syncs straight over the socket, at once; any file a server
        // still writes goes to a directory removed at the end.
        .args(["--repl-diskless-sync", "yes"])
        .args(["--repl-diskless-sync-delay", "0"])
        .arg("--dir")
        .arg(dir)
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .args(["--protected-mode", "no"])
        .args(["--daemonize", "no"])
        .args(["--logfile", ""]);
    if let Some(p) = primary {
        c.args(["--replicaof", "127.0.0.1", &p.to_string()]);
    }
    c.stdout(Stdio::null()).stderr(Stdio::null());
    c.spawn().map_err(|e| {
        anyhow::anyhow!(
            "redis-server did not start ({e}); install it with scripts/install-redis.sh"
        )
    })
}

fn connect(port: u16) -> redis::RedisResult<redis::Connection> {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let con = c.get_connection_with_timeout(Duration::from_secs(2))?;
    Ok(con)
}

impl RedisCluster {
    /// Starts the primary and `replicas` replicas, and waits until every
    /// replica is online.
    pub fn start(replicas: usize) -> anyhow::Result<RedisCluster> {
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("homa-kv-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut rc = RedisCluster {
            children: vec![spawn(port, None, &dir)?],
            dir,
            port,
            replicas,
        };
        for _ in 0..replicas {
            let p = free_port()?;
            rc.children.push(spawn(p, Some(port), &rc.dir)?);
        }
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            let online = connect(port).ok().and_then(|mut c| {
                let info: String = redis::cmd("INFO").arg("replication").query(&mut c).ok()?;
                Some(info.lines().filter(|l| l.contains("state=online")).count())
            });
            if online == Some(replicas) {
                return Ok(rc);
            }
            anyhow::ensure!(
                Instant::now() < end,
                "redis: {online:?} of {replicas} replicas online after 15 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Loads `keys` keys of `size` bytes.
    pub fn load(&self, keys: &[String], size: usize) -> anyhow::Result<()> {
        let mut c = connect(self.port)?;
        let v = vec![b'r'; size];
        for k in keys {
            redis::cmd("SET").arg(k).arg(&v).exec(&mut c)?;
        }
        Ok(())
    }

    /// `count` GETs of random keys (after `warmup`), each alone.
    pub fn get(
        &self,
        keys: &[String],
        size: usize,
        count: u64,
        warmup: u64,
        max: Duration,
    ) -> anyhow::Result<Histogram<u64>> {
        let mut c = connect(self.port)?;
        timed(count, warmup, max, |rng| {
            let k = &keys[rng.gen_range(0..keys.len())];
            let v: Option<Vec<u8>> = redis::cmd("GET").arg(k).query(&mut c)?;
            anyhow::ensure!(v.map(|v| v.len()) == Some(size), "redis GET of {k}");
            Ok(())
        })
    }

    /// `count` SETs of random keys, each followed by `WAIT R` (the
    /// write's latency is the two round trips).
    pub fn set_wait(
        &self,
        keys: &[String],
        size: usize,
        count: u64,
        warmup: u64,
        max: Duration,
    ) -> anyhow::Result<Histogram<u64>> {
        let mut c = connect(self.port)?;
        let v = vec![b'w'; size];
        let r = self.replicas;
        timed(count, warmup, max, |rng| {
            let k = &keys[rng.gen_range(0..keys.len())];
            set_wait(&mut c, k, &v, r)
        })
    }

    /// A connection to the primary.
    pub fn connection(&self) -> anyhow::Result<redis::Connection> {
        Ok(connect(self.port)?)
    }
}

/// SET `k` then `WAIT r`: returns once `r` replicas have the write.
pub fn set_wait(c: &mut redis::Connection, k: &str, v: &[u8], r: usize) -> anyhow::Result<()> {
    redis::cmd("SET").arg(k).arg(v).exec(c)?;
    // WAIT returns at its timeout with fewer replicas; waiting again waits
    // for the same write, so the time counted is until all R have it (or
    // the run fails after 5 s).
    for _ in 0..5 {
        let acked: i64 = redis::cmd("WAIT").arg(r).arg(1000).query(c)?;
        if acked as usize >= r {
            return Ok(());
        }
    }
    anyhow::bail!("WAIT: fewer than {r} replicas after 5 s")
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `op` `warmup` times, then up to `count` times (or until `max`
/// has passed) into a histogram of nanoseconds.
pub fn timed(
    count: u64,
    warmup: u64,
    max: Duration,
    mut op: impl FnMut(&mut rand::rngs::ThreadRng) -> anyhow::Result<()>,
) -> anyhow::Result<Histogram<u64>> {
    let mut rng = rand::thread_rng();
    for _ in 0..warmup {
        op(&mut rng)?;
    }
    let mut h = new_histogram();
    let end = Instant::now() + max;
    for _ in 0..count {
        let t0 = Instant::now();
        op(&mut rng)?;
        record(&mut h, t0.elapsed().as_nanos() as u64);
        if t0 > end {
            break;
        }
    }
    Ok(h)
}
