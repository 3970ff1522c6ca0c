//! The example from crates/homa/README.md, kept compiling and running here.

use homa::Endpoint;

fn main() -> homa::Result<()> {
    // Server: answer every request with its own bytes, from any thread.
    let server = Endpoint::bind("127.0.0.1:0")?;
    let addr = server.local_addr();
    let s = server.clone();
    std::thread::spawn(move || {
        while let Ok(req) = s.recv_request() {
            let body = req.message().to_vec();
            let _ = req.reply(body);
        }
    });

    // Client: one blocking call...
    let client = Endpoint::bind("127.0.0.1:0")?;
    let reply = client.call(addr, &b"hello"[..])?;
    assert_eq!(reply.to_vec(), b"hello");

    // ...or start several and wait later, each by its own handle.
    let pending: Vec<_> = (0..4u8)
        .map(|i| client.send_request(addr, vec![i; 1000]))
        .collect::<Result<_, _>>()?;
    for (i, p) in pending.into_iter().enumerate() {
        let m = p.wait()?; // pool-backed; dropped = space returned
        assert!(m.contiguous().iter().all(|b| *b == i as u8));
    }
    Ok(()) // dropping the last handle shuts the endpoint down
}
