//! Log lines captured per test (test support, behind the `log-capture` feature).
//!
//! One subscriber for the whole test binary, installed by the first capture, writes every line
//! (JSON, with the spans it ran in) to the capture of the thread that logged it, and nowhere
//! else. A subscriber set per test instead (`tracing::subscriber::set_default`) shares tracing's
//! process-wide cache of which callsites anyone listens to with the other tests' threads, and
//! now and then loses a line when they meet a callsite first (measured: 1 run in 40 of the
//! deliver tests, 7 in 60 of the dead-letter ones, at 8 tests at a time).

use std::cell::RefCell;
use std::io::Write;
use std::sync::{Arc, Mutex, Once};

thread_local! {
    static CAPTURE: RefCell<Option<Arc<Mutex<Vec<u8>>>>> = const { RefCell::new(None) };
}

/// The log lines of this thread from [`CapturedLogs::start`] until it is dropped. A test on
/// tokio's current-thread runtime (`#[tokio::test]`'s default) logs on its own thread only.
pub struct CapturedLogs {
    lines: Arc<Mutex<Vec<u8>>>,
}

impl CapturedLogs {
    /// Captures every line this thread logs from now on, at every level.
    pub fn start() -> Self {
        install();
        let lines = Arc::new(Mutex::new(Vec::new()));
        CAPTURE.with(|c| *c.borrow_mut() = Some(Arc::clone(&lines)));
        Self { lines }
    }

    /// Every line so far, as written.
    pub fn text(&self) -> String {
        let bytes = self.lines.lock().map(|l| l.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Every line so far, each a JSON object: `fields` (the message and the line's own
    /// fields), `spans` (outermost first, each its `name` and fields), `level`, `target`.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.text()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for CapturedLogs {
    fn drop(&mut self) {
        CAPTURE.with(|c| *c.borrow_mut() = None);
    }
}

/// Writes to the capture of the thread that logs, if it has one.
struct ThreadCapture;

impl Write for ThreadCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|c| {
            if let Some(lines) = c.borrow().as_ref()
                && let Ok(mut lines) = lines.lock()
            {
                lines.extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn install() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_span_list(true)
            .with_current_span(false)
            .with_max_level(tracing::Level::TRACE)
            .with_writer(|| ThreadCapture)
            .finish();
        // Another global subscriber set first keeps its place; captures then stay empty and
        // the tests that read them fail, saying so.
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}
