//! Running `ip` and `tc`: single commands, batches (one process for many
//! commands, which keeps `up` fast), the root check, and installing iproute2
//! on a fresh machine that lacks it.

use crate::{Error, Result};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// Whether this process runs with effective uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Fails with [`Error::NotRoot`] unless we are root.
pub fn require_root() -> Result<()> {
    if is_root() {
        Ok(())
    } else {
        Err(Error::NotRoot)
    }
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
        || ["/sbin", "/usr/sbin", "/bin", "/usr/bin"]
            .iter()
            .any(|d| std::path::Path::new(d).join(bin).is_file())
}

/// Makes sure `ip` and `tc` exist, installing iproute2 with apt-get when they
/// do not and we are root (CI machines start without it). Only one thread
/// of the process tries.
pub fn ensure_iproute2() -> Result<()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if on_path("ip") && on_path("tc") {
        return Ok(());
    }
    require_root()?;
    eprintln!("homa-testbed: `ip`/`tc` not found; installing iproute2 with apt-get");
    for args in [
        &["update"][..],
        &["install", "-y", "--no-install-recommends", "iproute2"][..],
    ] {
        let st = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
            .map_err(|e| Error::Command(format!("apt-get: {e}")))?;
        if !st.success() {
            return Err(Error::Command(format!("apt-get {} failed", args.join(" "))));
        }
    }
    if on_path("ip") && on_path("tc") {
        Ok(())
    } else {
        Err(Error::Command(
            "iproute2 installed but `ip`/`tc` still missing".into(),
        ))
    }
}

/// Runs `prog args...`; on failure the error carries the command and stderr.
pub fn run(prog: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Command(format!("{prog}: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command(format!(
            "`{prog} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Like [`run`] but failure is not an error (for deleting what may not exist).
pub fn run_quiet(prog: &str, args: &[&str]) -> bool {
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Runs many commands in one `ip -batch -` or `tc -batch -` process
/// (`prefix` goes before `-batch`, e.g. `["-n", "ns1"]`). With `force`,
/// failing lines do not stop the batch (and are not reported).
pub fn batch(prog: &str, prefix: &[&str], lines: &[String], force: bool) -> Result<()> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut args: Vec<&str> = prefix.to_vec();
    if force {
        args.push("-force");
    }
    args.extend(["-batch", "-"]);
    let mut child = Command::new(prog)
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(if force { Stdio::null() } else { Stdio::piped() })
        .spawn()
        .map_err(|e| Error::Command(format!("{prog}: {e}")))?;
    {
        let mut stdin = child.stdin.take().expect("piped stdin");
        let text = lines.join("\n") + "\n";
        // A program that exits early closes the pipe; its exit status,
        // below, says whether that was a failure.
        let _ = stdin.write_all(text.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::Command(format!("{prog} -batch: {e}")))?;
    if out.status.success() || force {
        Ok(())
    } else {
        Err(Error::Command(format!(
            "`{prog} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_reports_failures_with_stderr() {
        assert!(run("true", &[]).is_ok());
        let e = run("sh", &["-c", "echo oops >&2; exit 3"]).unwrap_err();
        assert!(e.to_string().contains("oops"), "{e}");
        assert!(!run_quiet("false", &[]));
        assert!(run("/nonexistent/prog", &[]).is_err());
    }

    #[test]
    fn batch_reports_failure_unless_forced() {
        assert!(batch("true", &[], &[], false).is_ok());
        let lines = vec!["link show".to_string()];
        assert!(batch("false", &[], &lines, false).is_err());
        assert!(batch("false", &[], &lines, true).is_ok());
    }
}
