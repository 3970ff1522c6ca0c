//! `Endpoint::serve`: requests handled inside the serving thread's own
//! receive pass, over real loopback sockets. What may and may not be done
//! from inside a handler, mixing with `recv_request` threads, handlers that
//! keep requests or panic, and shutdown.

use bytes::Bytes;
use homa::{Endpoint, EndpointConfig, Error};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

fn cfg() -> EndpointConfig {
    Endpoint::builder().poll(Duration::from_micros(20)).build()
}

fn payload(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed * 7) as u8 ^ (i >> 8) as u8)
        .collect()
}

/// A new endpoint on a free loopback port.
fn endpoint() -> Endpoint {
    Endpoint::bind_with("127.0.0.1:0", cfg()).unwrap()
}

/// `ep.serve(handler)` on a thread of its own.
fn spawn_serve(
    ep: &Endpoint,
    handler: impl FnMut(homa::Request) + Send + 'static,
) -> JoinHandle<homa::Result<()>> {
    let ep = ep.clone();
    std::thread::spawn(move || ep.serve(handler))
}

/// An echo handler: the reply is the request's own pool space.
fn echo(req: homa::Request) {
    let (message, responder) = req.into_parts();
    let _ = responder.reply(message.into_bytes());
}

#[test]
fn serving_threads_and_queue_threads_answer_every_request() {
    let server = endpoint();
    let addr = server.local_addr();
    let inline = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let inline = inline.clone();
            spawn_serve(&server, move |req| {
                inline.fetch_add(1, Ordering::Relaxed);
                echo(req)
            })
        })
        .collect();
    // A plain `recv_request` thread on the same endpoint.
    let ep = server.clone();
    let queued = std::thread::spawn(move || {
        let mut n = 0u64;
        while let Ok(req) = ep.recv_request() {
            let body = Bytes::from(req.message().to_vec());
            req.reply(body).unwrap();
            n += 1;
        }
        n
    });
    let clients: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                let c = endpoint();
                for i in 0..300u64 {
                    // Short requests and multi-packet ones.
                    let len = [1usize, 100, 1400, 5000, 40_000][(i % 5) as usize];
                    let msg = payload(len, t * 1000 + i);
                    let reply = c.call(addr, msg.clone()).unwrap();
                    assert_eq!(reply.to_vec(), msg, "thread {t} rpc {i}");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    server.shutdown();
    for w in workers {
        w.join().unwrap().unwrap();
    }
    let by_queue = queued.join().unwrap();
    assert_eq!(inline.load(Ordering::Relaxed) + by_queue, 1200);
    assert!(
        inline.load(Ordering::Relaxed) > 0,
        "no request reached a handler"
    );
}

#[test]
fn inside_a_handler_waits_are_refused_and_other_calls_work() {
    let backend = endpoint();
    let backend_thread = spawn_serve(&backend, echo);
    let backend_addr = backend.local_addr();

    let server = endpoint();
    let addr = server.local_addr();
    let (tx, rx) = mpsc::channel();
    // A peer that never answers: a wait on it could only block.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let inner = server.clone();
    let worker = spawn_serve(&server, move |req| {
        // Blocking waits on the endpoint the handler runs on: refused.
        let wait = inner.call(silent_addr, &b"x"[..]);
        assert!(matches!(wait, Err(Error::WaitInHandler)), "{wait:?}");
        assert!(matches!(
            inner.recv_request_timeout(Duration::from_millis(1)),
            Err(Error::WaitInHandler)
        ));
        assert!(matches!(inner.try_recv_request(), Ok(None)));
        // Counters and starting an RPC work (no deadlock).
        assert!(inner.metrics().requests_delivered >= 1);
        let pending = inner.send_request(backend_addr, &b"forwarded"[..]).unwrap();
        tx.send(pending).unwrap();
        echo(req);
    });
    let client = endpoint();
    for i in 0..20u64 {
        let msg = payload(300, i);
        assert_eq!(client.call(addr, msg.clone()).unwrap().to_vec(), msg);
        // The RPC started inside the handler completes once awaited outside.
        let pending = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(
            &*pending
                .wait_timeout(Duration::from_secs(10))
                .unwrap()
                .to_vec(),
            b"forwarded"
        );
    }
    server.shutdown();
    worker.join().unwrap().unwrap();
    backend.shutdown();
    backend_thread.join().unwrap().unwrap();
}

#[test]
fn a_handler_may_pass_requests_to_another_thread() {
    let server = endpoint();
    let addr = server.local_addr();
    let (tx, rx) = mpsc::channel::<homa::Request>();
    let serving = spawn_serve(&server, move |req| tx.send(req).unwrap());
    // The slow path: answered later, from elsewhere, after a pause.
    let answering = std::thread::spawn(move || {
        let mut n = 0;
        while let Ok(req) = rx.recv() {
            std::thread::sleep(Duration::from_micros(200));
            let body = Bytes::from(req.message().to_vec());
            if req.reply(body).is_ok() {
                n += 1;
            }
        }
        n
    });
    let client = endpoint();
    let pending: Vec<_> = (0..50u64)
        .map(|i| (i, client.send_request(addr, payload(2000, i)).unwrap()))
        .collect();
    for (i, p) in pending {
        let reply = p.wait_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(reply.to_vec(), payload(2000, i));
    }
    server.shutdown();
    serving.join().unwrap().unwrap();
    assert_eq!(answering.join().unwrap(), 50);
}

#[test]
fn dropping_a_request_in_the_handler_abandons_it() {
    let server = endpoint();
    let addr = server.local_addr();
    let serving = spawn_serve(&server, |req| {
        if req.message().contiguous().as_ref() != b"ignore me" {
            echo(req)
        }
    });
    let client = endpoint();
    let ignored = client.call_timeout(addr, &b"ignore me"[..], Duration::from_millis(300));
    assert!(matches!(ignored, Err(Error::Timeout)), "{ignored:?}");
    // A call that timed out abandoned its RPC.
    assert_eq!(client.engine_stats().client_rpcs, 0);
    assert_eq!(
        &*client.call(addr, &b"answer me"[..]).unwrap().to_vec(),
        b"answer me"
    );
    // The abandoned RPC was freed at once, not kept until the client gave
    // up; only the answered one may still wait for its acknowledgement.
    assert!(server.engine_stats().server_rpcs <= 1);
    server.shutdown();
    serving.join().unwrap().unwrap();
}

#[test]
fn a_panicking_handler_leaves_the_endpoint_working() {
    let server = endpoint();
    let addr = server.local_addr();
    let doomed = spawn_serve(&server, |req| {
        if req.message().len() == 13 {
            panic!("handler gives up");
        }
        echo(req)
    });
    let client = endpoint();
    let lost = client.call_timeout(addr, &b"thirteen byte"[..], Duration::from_millis(300));
    assert!(lost.is_err());
    assert!(doomed.join().is_err(), "the panic reaches serve's caller");
    // The serving thread no longer counts as polling: with no application
    // thread waiting, the background thread takes the socket over and the
    // engine still receives (the request waits in the queue).
    let pending = client
        .send_request(addr, &b"while nobody serves"[..])
        .unwrap();
    let start = std::time::Instant::now();
    while server.queued_requests() == 0 && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(server.queued_requests(), 1, "nobody received the request");
    // The engine lock was released on the way out: another thread serves.
    let next = spawn_serve(&server, echo);
    assert_eq!(
        &*pending
            .wait_timeout(Duration::from_secs(5))
            .unwrap()
            .to_vec(),
        b"while nobody serves"
    );
    assert_eq!(
        &*client.call(addr, &b"still here"[..]).unwrap().to_vec(),
        b"still here"
    );
    server.shutdown();
    next.join().unwrap().unwrap();
}

#[test]
fn shutdown_inside_a_handler_ends_serve() {
    let server = endpoint();
    let addr = server.local_addr();
    let inner = server.clone();
    let serving = spawn_serve(&server, move |req| {
        echo(req);
        inner.shutdown();
    });
    let client = endpoint();
    // The reply given before the shutdown may or may not have left; either
    // way the call ends.
    let _ = client.call_timeout(addr, &b"last"[..], Duration::from_millis(500));
    serving.join().unwrap().unwrap();
    assert!(server.is_shut_down());
    assert!(matches!(server.serve(echo), Err(Error::Shutdown) | Ok(())));
}
