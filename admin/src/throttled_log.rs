//! Log lines behind a throttle (the endpoint's refusals, sheds, deadlines
//! and failed handshakes: one line a second per kind at most), which say
//! how many like them were left out only when some were.

/// Logs one line at `$level` (`info`, `warn`, …) for an event `$skipped`
/// others of its kind went unlogged before: with `$skipped == 0` the line is
/// the message and fields as given; otherwise it also carries the field
/// `skipped` and ends "(N more not logged since the last line)", so a
/// reader learns of the gap where there is one and is never told of one
/// that is not there.
///
/// `throttled_log!(warn, skipped, "message", peer = %peer, limit = key)`:
/// the message, a literal, comes before the fields.
macro_rules! throttled_log {
    ($level:ident, $skipped:expr, $message:literal $(, $($field:tt)+)?) => {{
        let skipped: u64 = $skipped;
        if skipped == 0 {
            tracing::$level!($($($field)+ ,)? $message);
        } else {
            tracing::$level!(
                $($($field)+ ,)?
                skipped,
                concat!($message, " ({} more not logged since the last line)"),
                skipped
            );
        }
    }};
}

pub(crate) use throttled_log;

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    /// What a subscriber wrote, shared with the test.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The lines `log` writes through a plain-text subscriber.
    fn lines_of(log: impl FnOnce()) -> Vec<String> {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn nothing_about_skipping_unless_something_was_skipped() {
        let peer = "10.0.0.1:4000";
        let lines = lines_of(|| {
            throttled_log!(warn, 0, "admin endpoint: refused", %peer, limit = "admin.max_connections");
            throttled_log!(warn, 7, "admin endpoint: refused", %peer, limit = "admin.max_connections");
            throttled_log!(info, 0, "closed");
            throttled_log!(info, 1, "closed");
        });
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert!(
            lines[0].ends_with(
                "admin endpoint: refused peer=10.0.0.1:4000 limit=\"admin.max_connections\""
            ),
            "{}",
            lines[0]
        );
        assert!(!lines[0].contains("skipped"), "{}", lines[0]);
        assert!(!lines[0].contains("not logged"), "{}", lines[0]);
        assert!(
            lines[1].ends_with(
                "admin endpoint: refused (7 more not logged since the last line) \
                 peer=10.0.0.1:4000 limit=\"admin.max_connections\" skipped=7"
            ),
            "{}",
            lines[1]
        );
        assert!(lines[2].ends_with("closed"), "{}", lines[2]);
        assert!(!lines[2].contains("skipped"), "{}", lines[2]);
        assert!(
            lines[3].ends_with("closed (1 more not logged since the last line) skipped=1"),
            "{}",
            lines[3]
        );
    }
}
