//! Progress: a bar with rate and ETA on a terminal (stderr), nothing otherwise.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Progress {
    bar: Option<ProgressBar>,
    /// When a byte last moved or a store last answered: see [`Progress::silent_for`].
    heard: Mutex<Instant>,
}

impl Progress {
    /// `total`: bytes expected (`None` for stdin). A bar only when stderr is a terminal.
    pub fn new(total: Option<u64>, show: bool) -> Self {
        let bar = (show && std::io::stderr().is_terminal()).then(|| {
            let bar = match total {
                Some(n) => ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr()),
                None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
            };
            let template = if total.is_some() {
                "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}"
            } else {
                "{spinner} {bytes} {binary_bytes_per_sec} {msg}"
            };
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style);
            }
            // Redraw 10 times a second at most, and tick while waiting on the network.
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        Self { bar, heard: Mutex::new(Instant::now()) }
    }

    #[cfg(test)]
    pub fn quiet() -> Self {
        Self::new(None, false)
    }

    /// Payload bytes moved (retried bytes count again: they crossed the wire again).
    pub fn moved(&self, n: u64) {
        self.answered();
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    /// A store answered a request of this copy.
    pub fn answered(&self) {
        *self.heard.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// How long since a byte moved or a store answered, in the whole copy.
    pub fn silent_for(&self) -> Duration {
        self.heard.lock().unwrap_or_else(|p| p.into_inner()).elapsed()
    }

    /// Make the copy look silent for `d` already.
    #[cfg(test)]
    pub fn pretend_silent_for(&self, d: Duration) {
        *self.heard.lock().unwrap() = Instant::now() - d;
    }

    /// A retried transfer: its bytes will be counted again.
    pub fn retrying(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc_length(n);
        }
    }

    /// Bytes read again to verify a copy: shown as a note, not as progress.
    pub fn verified(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.set_message("verifying by re-reading");
            let _ = n;
        }
    }

    /// Print a line without tearing the bar.
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            // Not eprintln!: a hung-up terminal or a closed pipe must not panic a copy
            // that is cleaning up after SIGHUP.
            None => {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "{line}");
            }
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
