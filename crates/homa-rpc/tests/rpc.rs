//! The framework end to end on loopback: typed and raw calls, each
//! threading mode, deadlines, cancellation, unknown methods, panicking
//! handlers, malformed requests, nested fan-out. No timing assertions
//! tighter than whole seconds (the machine is shared).

use bytes::Bytes;
use homa::Endpoint;
use homa_rpc::{Code, Context, Raw, Server, Status};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
pub struct Point {
    x: i32,
    y: i32,
    label: String,
}

homa_rpc::service! {
    /// A test service with a method per mode.
    pub mod demo {
        /// Adds one to both coordinates.
        inline fn bump(Point) -> Point;
        inline fn echo(Raw) -> Raw;
        inline fn boom(u32) -> u32;
        inline fn sleep_ms(u64) -> u64;
        pool fn slow_add((u64, u64)) -> u64;
        pool fn wait_cancel(u64) -> bool;
        task fn async_len(String) -> usize;
        task fn async_sleep(u64) -> u64;
        inline fn fan(u32) -> u32;
        pool fn fan_pool(u32) -> u32;
        pool fn pool_boom(()) -> ();
        task fn task_boom(()) -> ();
        task fn task_until_dropped(()) -> ();
    }
}

homa_rpc::service! {
    /// The nested calls' target.
    pub mod backend {
        inline fn twice(u32) -> u32;
    }
}

struct Backend;

impl backend::Service for Backend {
    fn twice(&self, _cx: &Context, x: u32) -> Result<u32, Status> {
        Ok(x * 2)
    }
}

struct Demo {
    backends: Vec<std::net::SocketAddr>,
    cancelled: Arc<AtomicUsize>,
}

impl Demo {
    fn fan_out(&self, cx: &Context, n: u32) -> Result<u32, Status> {
        let rpc = cx.client()?;
        let stubs: Vec<_> = self
            .backends
            .iter()
            .take(n as usize)
            .map(|a| backend::Client::new(rpc.clone(), *a))
            .collect();
        // Start them all, then wait for each: they overlap.
        let calls = stubs
            .iter()
            .enumerate()
            .map(|(i, s)| s.start().twice(&(i as u32 + 1)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut sum = 0;
        for c in calls {
            sum += c.wait()?;
        }
        Ok(sum)
    }
}

impl demo::Service for Demo {
    fn bump(&self, _cx: &Context, p: Point) -> Result<Point, Status> {
        Ok(Point {
            x: p.x + 1,
            y: p.y + 1,
            label: p.label,
        })
    }
    fn echo(&self, _cx: &Context, m: homa::Message) -> Result<Bytes, Status> {
        Ok(m.into_bytes())
    }
    fn boom(&self, _cx: &Context, x: u32) -> Result<u32, Status> {
        if x == 13 {
            panic!("unlucky number");
        }
        Ok(x)
    }
    fn sleep_ms(&self, _cx: &Context, ms: u64) -> Result<u64, Status> {
        std::thread::sleep(Duration::from_millis(ms));
        Ok(ms)
    }
    fn slow_add(&self, cx: &Context, (a, b): (u64, u64)) -> Result<u64, Status> {
        std::thread::sleep(Duration::from_millis(5));
        assert!(!cx.is_cancelled());
        Ok(a + b)
    }
    fn wait_cancel(&self, cx: &Context, ms: u64) -> Result<bool, Status> {
        let end = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < end {
            if cx.is_cancelled() {
                self.cancelled.fetch_add(1, Ordering::SeqCst);
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(false)
    }
    async fn async_len(self: Arc<Self>, _cx: Context, s: String) -> Result<usize, Status> {
        tokio::task::yield_now().await;
        Ok(s.len())
    }
    async fn async_sleep(self: Arc<Self>, _cx: Context, ms: u64) -> Result<u64, Status> {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(ms)
    }
    fn fan(&self, cx: &Context, n: u32) -> Result<u32, Status> {
        self.fan_out(cx, n)
    }
    fn pool_boom(&self, _cx: &Context, _: ()) -> Result<(), Status> {
        panic!("pool handler fell over");
    }
    async fn task_boom(self: Arc<Self>, _cx: Context, _: ()) -> Result<(), Status> {
        panic!("task handler fell over");
    }
    async fn task_until_dropped(self: Arc<Self>, _cx: Context, _: ()) -> Result<(), Status> {
        // Counts when the framework aborts this task (cancel notice).
        struct Count(Arc<AtomicUsize>);
        impl Drop for Count {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let _c = Count(self.cancelled.clone());
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(())
    }
    fn fan_pool(&self, cx: &Context, n: u32) -> Result<u32, Status> {
        self.fan_out(cx, n)
    }
}

struct Setup {
    addr: std::net::SocketAddr,
    client: homa_rpc::Client,
    servers: Vec<Server>,
    cancelled: Arc<AtomicUsize>,
    _rt: tokio::runtime::Runtime,
}

impl Drop for Setup {
    fn drop(&mut self) {
        for s in &self.servers {
            s.shutdown();
        }
    }
}

fn serve_on_thread(s: &Server) {
    let s = s.clone();
    std::thread::spawn(move || s.serve());
}

fn setup() -> Setup {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut servers = Vec::new();
    let mut backends = Vec::new();
    for _ in 0..3 {
        let ep = Endpoint::bind("127.0.0.1:0").unwrap();
        backends.push(ep.local_addr());
        let s = Server::builder(ep)
            .workers(1)
            .service(backend::server(Backend))
            .build();
        serve_on_thread(&s);
        servers.push(s);
    }
    let cancelled = Arc::new(AtomicUsize::new(0));
    let ep = Endpoint::bind("127.0.0.1:0").unwrap();
    let addr = ep.local_addr();
    let s = Server::builder(ep)
        .workers(2)
        .runtime(rt.handle().clone())
        .service(demo::server(Demo {
            backends,
            cancelled: cancelled.clone(),
        }))
        .build();
    serve_on_thread(&s);
    servers.push(s);
    let client = homa_rpc::Client::new(Endpoint::bind("127.0.0.1:0").unwrap());
    Setup {
        addr,
        client,
        servers,
        cancelled,
        _rt: rt,
    }
}

#[test]
fn typed_and_raw_round_trips() {
    let s = setup();
    let c = demo::Client::new(s.client.clone(), s.addr);
    let p = Point {
        x: 1,
        y: -2,
        label: "here".into(),
    };
    let r = c.bump(&p).unwrap();
    assert_eq!((r.x, r.y, r.label.as_str()), (2, -1, "here"));
    let big = Bytes::from(vec![7u8; 100_000]);
    let m = c.echo(&big).unwrap();
    assert_eq!(m.len(), 100_000);
    assert!(m.to_vec().iter().all(|b| *b == 7));
    assert_eq!(c.echo(&Bytes::new()).unwrap().len(), 0);
}

#[test]
fn worker_pool_and_async_handlers() {
    let s = setup();
    let c = demo::Client::new(s.client.clone(), s.addr);
    // Several pool calls in flight at once.
    let calls: Vec<_> = (0..6u64)
        .map(|i| c.start().slow_add(&(i, 10)).unwrap())
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        assert_eq!(call.wait().unwrap(), i as u64 + 10);
    }
    assert_eq!(c.async_len(&"hello".to_string()).unwrap(), 5);
    assert_eq!(c.async_sleep(&3).unwrap(), 3);
}

#[test]
fn async_client_stub() {
    let s = setup();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let c = demo::AsyncClient::new(s.client.clone(), s.addr);
    rt.block_on(async {
        let (a, b) = tokio::join!(c.async_len(&"abc".to_string()), c.slow_add(&(1, 2)));
        assert_eq!((a.unwrap(), b.unwrap()), (3, 3));
        let short = c.with_timeout(Duration::from_millis(20));
        let e = short.async_sleep(&3_000).await.unwrap_err();
        assert_eq!(e.code(), Code::DeadlineExceeded);
    });
}

#[test]
fn unknown_method_is_unimplemented() {
    let s = setup();
    let r = s
        .client
        .call::<u32, u32>(s.addr, homa_rpc::method_id("demo/nope"), &1);
    assert_eq!(r.unwrap_err().code(), Code::Unimplemented);
    // A response that does not decode as the caller's type is Internal.
    let r = s
        .client
        .call::<Raw, Point>(s.addr, demo::ids::echo, &Bytes::from_static(&[0xff]));
    assert_eq!(r.unwrap_err().code(), Code::Internal);
    // A method of another service is unknown here too.
    let r = s.client.call::<u32, u32>(s.addr, backend::ids::twice, &1);
    assert_eq!(r.unwrap_err().code(), Code::Unimplemented);
}

#[test]
fn panicking_handler_is_internal_and_the_server_goes_on() {
    let s = setup();
    let c = demo::Client::new(s.client.clone(), s.addr);
    let e = c.boom(&13).unwrap_err();
    assert_eq!(e.code(), Code::Internal);
    assert!(e.message().contains("unlucky number"), "{e}");
    assert_eq!(c.boom(&7).unwrap(), 7);
    // A pool handler's panic and an async one: the worker and the
    // runtime go on.
    for _ in 0..2 {
        assert_eq!(c.pool_boom(&()).unwrap_err().code(), Code::Internal);
        assert_eq!(c.task_boom(&()).unwrap_err().code(), Code::Internal);
    }
    assert_eq!(c.slow_add(&(1, 1)).unwrap(), 2);
    assert_eq!(c.async_len(&"x".to_string()).unwrap(), 1);
}

#[test]
fn malformed_requests_get_a_status_and_the_server_goes_on() {
    let s = setup();
    let raw = s.client.endpoint();
    let bump = demo::ids::bump.to_le_bytes();
    let cases: Vec<Vec<u8>> = vec![
        vec![],
        vec![1],
        vec![9; 12],
        vec![
            1, 0x80, 12, 0, bump[0], bump[1], bump[2], bump[3], 0, 0, 0, 0,
        ],
        vec![1, 0, 200, 0, bump[0], bump[1], bump[2], bump[3], 0, 0, 0, 0],
        // A good header and a body that is not a Point.
        vec![
            1, 0, 12, 0, bump[0], bump[1], bump[2], bump[3], 0, 0, 0, 0, 0xff,
        ],
    ];
    for bytes in cases {
        let reply = raw.call(s.addr, bytes.clone()).unwrap();
        let v = reply.to_vec();
        let status = homa_rpc::wire::decode_response(&v, v.len()).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{bytes:?}: {status}");
    }
    let c = demo::Client::new(s.client.clone(), s.addr);
    let p = Point {
        x: 0,
        y: 0,
        label: String::new(),
    };
    assert_eq!(c.bump(&p).unwrap().x, 1);
}

#[test]
fn deadlines_are_enforced_at_both_ends() {
    let s = setup();
    let c = demo::Client::new(s.client.clone(), s.addr);
    let short = c.with_timeout(Duration::from_millis(30));
    // Inline, pool and task handlers that overrun.
    let t0 = Instant::now();
    assert_eq!(
        short.sleep_ms(&300).unwrap_err().code(),
        Code::DeadlineExceeded
    );
    assert_eq!(
        short.wait_cancel(&300).unwrap_err().code(),
        Code::DeadlineExceeded
    );
    assert_eq!(
        short.async_sleep(&3_000).unwrap_err().code(),
        Code::DeadlineExceeded
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    // A deadline already past never leaves.
    let past = s
        .client
        .with_deadline(Instant::now() - Duration::from_millis(1));
    let r = past.call::<u64, u64>(s.addr, demo::ids::sleep_ms, &0);
    assert_eq!(r.unwrap_err().code(), Code::DeadlineExceeded);
    // The server is still there.
    assert_eq!(c.sleep_ms(&0).unwrap(), 0);
}

#[test]
fn a_dropped_call_is_seen_as_cancelled_by_a_pool_handler() {
    let s = setup();
    let c = demo::Client::new(s.client.clone(), s.addr);
    let call = c.start().wait_cancel(&5_000).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    drop(call); // sends the cancel notice
    let end = Instant::now() + Duration::from_secs(5);
    while s.cancelled.load(Ordering::SeqCst) == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(s.cancelled.load(Ordering::SeqCst), 1);
}

#[test]
fn nested_fan_out_inline_and_pool() {
    let s = setup();
    let c = demo::Client::new(s.client.clone(), s.addr);
    assert_eq!(c.fan(&1).unwrap(), 2);
    assert_eq!(c.fan(&3).unwrap(), 2 + 4 + 6);
    assert_eq!(c.fan_pool(&3).unwrap(), 12);
    // The deadline goes with the nested calls (plenty here).
    assert_eq!(c.with_timeout(Duration::from_secs(5)).fan(&3).unwrap(), 12);
}

#[test]
fn a_dropped_async_call_aborts_a_task_handler() {
    let s = setup();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let c = demo::AsyncClient::new(s.client.clone(), s.addr);
    rt.block_on(async {
        // The request leaves at once; the future is dropped by the timeout.
        let r = tokio::time::timeout(Duration::from_millis(50), c.task_until_dropped(&())).await;
        assert!(r.is_err());
    });
    let end = Instant::now() + Duration::from_secs(5);
    while s.cancelled.load(Ordering::SeqCst) == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(s.cancelled.load(Ordering::SeqCst), 1);
}
