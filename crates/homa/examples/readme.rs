//! The example from crates/homa/README.md, kept compiling and running here.

use homa::Endpoint;

fn main() -> homa::Result<()> {
    // Server: answer every request with its own bytes. `serve` runs the
    // handler inside this thread's own receive pass (the fastest way);
    // `recv_request` and a reply from any thread work too.
    let server = Endpoint::bind("127.0.0.1:0")?;
    let addr = server.local_addr();
    let s = server.clone();
    std::thread::spawn(move || {
        s.serve(|req| {
            let (message, responder) = req.into_parts();
            let _ = responder.reply(message.into_bytes()); // no copy
        })
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

    // Large messages can be written straight into a send buffer laid out
    // as packets: it leaves without a gather copy, and can be written and
    // sent again once `buf.in_flight()` is false.
    let mut buf = client.new_send_buf(200_000);
    buf.write(0, &[7; 200_000]).unwrap();
    let reply = client.call(addr, buf.clone())?;
    assert_eq!(reply.len(), 200_000);
    Ok(()) // dropping the last handle shuts the endpoint down
}
