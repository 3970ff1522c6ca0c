//! Progress bars on stderr for the phases of a cluster run. On a terminal
//! the bar redraws in place; otherwise (CI logs) only each phase's final
//! line is printed.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// One phase's bar: `label [#####.....] 4.2/10.0 s  note`.
pub struct Bar {
    label: String,
    total: Duration,
    start: Instant,
    tty: bool,
    enabled: bool,
    last_draw: Option<Instant>,
}

/// Renders a bar of `width` cells for `frac` (0..=1).
pub fn render(frac: f64, width: usize) -> String {
    let f = if frac.is_finite() {
        frac.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let full = (f * width as f64).round() as usize;
    format!("[{}{}]", "#".repeat(full), ".".repeat(width - full))
}

impl Bar {
    /// A bar for a phase expected to last `total`; `enabled = false` makes
    /// every call a no-op (for `--json` runs that want a quiet stderr).
    pub fn new(label: &str, total: Duration, enabled: bool) -> Bar {
        Bar {
            label: label.to_string(),
            total,
            start: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            enabled,
            last_draw: None,
        }
    }

    /// Redraws (at most 10 times a second) with a note such as the RPC count.
    pub fn update(&mut self, note: &str) {
        if !self.enabled || !self.tty {
            return;
        }
        if self
            .last_draw
            .is_some_and(|t| t.elapsed() < Duration::from_millis(100))
        {
            return;
        }
        self.last_draw = Some(Instant::now());
        let el = self.start.elapsed().as_secs_f64();
        let tot = self.total.as_secs_f64().max(1e-9);
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r{:<14} {} {:5.1}/{:.1} s  {:<40}",
            self.label,
            render(el / tot, 30),
            el.min(tot),
            tot,
            note
        );
        let _ = err.flush();
    }

    /// Ends the phase with a final line.
    pub fn finish(&mut self, note: &str) {
        if !self.enabled {
            return;
        }
        let el = self.start.elapsed().as_secs_f64();
        let mut err = std::io::stderr().lock();
        let _ = writeln!(
            err,
            "{}{:<14} {} {:5.1} s  {:<40}",
            if self.tty { "\r" } else { "" },
            self.label,
            render(1.0, 30),
            el,
            note
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_rendering() {
        assert_eq!(render(0.0, 4), "[....]");
        assert_eq!(render(0.5, 4), "[##..]");
        assert_eq!(render(2.0, 4), "[####]");
        assert_eq!(render(f64::NAN, 2), "[..]");
        let mut b = Bar::new("x", Duration::from_secs(1), false);
        b.update("n");
        b.finish("done");
    }
}
