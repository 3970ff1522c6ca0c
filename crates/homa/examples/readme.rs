//! The example from crates/homa/README.md, kept compiling and running here.

use homa::AsyncEndpoint;
use std::time::Duration;

#[tokio::main]
async fn main() -> homa::Result<()> {
    // Server: a task that answers every request with its own bytes.
    let server = AsyncEndpoint::bind("127.0.0.1:0")?;
    let addr = server.local_addr();
    // The incoming requests are a `Stream` (also `requests.next().await`
    // without `futures`/`tokio-stream`); it ends when the endpoint shuts down.
    let mut requests = server.requests();
    tokio::spawn(async move {
        while let Some(req) = requests.next().await {
            let (message, responder) = req.into_parts();
            // Replying never blocks: fine inside a task.
            let _ = responder.reply(message.into_bytes()); // no copy
        }
    });

    // Client: one call...
    let client = AsyncEndpoint::bind("127.0.0.1:0")?;
    let reply = client.call(addr, &b"hello"[..]).await?;
    assert_eq!(reply.to_vec(), b"hello");

    // ...or several in flight at once: a `PendingRpc` is a future.
    let pending: Vec<_> = (0..4u8)
        .map(|i| client.send_request(addr, vec![i; 1000]))
        .collect::<Result<_, _>>()?;
    for (i, rpc) in pending.into_iter().enumerate() {
        let m = rpc.await?; // pool-backed; dropped = space returned
        assert!(m == vec![i as u8; 1000][..]);
    }

    // With a deadline: on expiry the RPC is abandoned.
    let reply = client
        .call_timeout(addr, &b"ping"[..], Duration::from_secs(1))
        .await?;
    assert_eq!(reply.len(), 4);
    Ok(()) // dropping the last handle of an endpoint shuts it down
}
