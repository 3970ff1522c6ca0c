//! Running code inside a network namespace: a thread that has called
//! setns(2) on the namespace's `/run/netns/NAME` file. Sockets it opens
//! belong to that namespace for their whole life, whichever thread uses them
//! later, so a bench node can run as ordinary threads of this process.

use crate::{Error, Result};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;

/// The file `ip netns add NAME` creates for a namespace.
pub fn netns_path(name: &str) -> std::path::PathBuf {
    std::path::Path::new("/run/netns").join(name)
}

/// Moves the calling thread into namespace `name`. Threads it spawns
/// afterwards start in the same namespace.
pub fn enter(name: &str) -> Result<()> {
    let f = File::open(netns_path(name))
        .map_err(|e| Error::Netns(format!("cannot open namespace {name}: {e}")))?;
    // SAFETY: setns on a valid descriptor; it only changes this thread's
    // network namespace.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if r != 0 {
        return Err(Error::Netns(format!(
            "setns({name}): {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Spawns a named thread that runs `f` inside namespace `ns`.
pub fn spawn_in<T, F>(ns: &str, thread_name: String, f: F) -> Result<JoinHandle<Result<T>>>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    let ns = ns.to_string();
    std::thread::Builder::new()
        .name(thread_name)
        .spawn(move || {
            enter(&ns)?;
            f()
        })
        .map_err(|e| Error::Netns(format!("spawn: {e}")))
}

/// Runs `f` inside namespace `ns` on a helper thread and waits for it.
pub fn run_in<T, F>(ns: &str, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    spawn_in(ns, format!("in-{ns}"), f)?
        .join()
        .map_err(|_| Error::Netns(format!("thread in {ns} panicked")))?
}

/// Writes a sysctl under /proc/sys from inside namespace `ns` (the network
/// sysctls are per namespace; no `sysctl` binary needed).
pub fn write_sysctl(ns: &str, key: &str, value: &str) -> Result<()> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    let value = value.to_string();
    run_in(ns, move || {
        std::fs::write(&path, value).map_err(|e| Error::Netns(format!("{path}: {e}")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_namespace_is_an_error() {
        let e = run_in("homa-no-such-namespace", || Ok(())).unwrap_err();
        assert!(e.to_string().contains("homa-no-such-namespace"), "{e}");
    }
}
