//! Delivery lines: `Message: <message_id> <queue> <delivery_count> <json>`, the
//! JSON byte-identical to what was published.

/// One delivery as a client reads it, borrowing from the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery<'a> {
    /// The message id (as published).
    pub message_id: &'a str,
    /// The queue it comes from: `ack <id> <queue>` names it.
    pub queue: &'a str,
    /// 1 on first delivery, one more on each redelivery.
    pub delivery_count: u32,
    /// The published body, unchanged.
    pub body: &'a str,
}

impl<'a> Delivery<'a> {
    /// Parses a whole line starting with `Message: `.
    pub fn parse(line: &'a str) -> Option<Delivery<'a>> {
        Delivery::parse_fields(line.strip_prefix("Message: ")?)
    }

    /// Parses what follows `Message: `.
    pub(crate) fn parse_fields(rest: &'a str) -> Option<Delivery<'a>> {
        let rest = rest.strip_suffix('\r').unwrap_or(rest);
        let mut parts = rest.splitn(4, ' ');
        let message_id = parts.next()?;
        let queue = parts.next()?;
        let delivery_count = parts.next()?.parse().ok()?;
        let body = parts.next()?;
        Some(Delivery {
            message_id,
            queue,
            delivery_count,
            body,
        })
    }
}

/// Appends a delivery line for `body` (which carries `message_id`).
#[inline]
pub fn write_delivery(out: &mut Vec<u8>, message_id: &str, queue: &str, count: u32, body: &[u8]) {
    out.extend_from_slice(b"Message: ");
    out.extend_from_slice(message_id.as_bytes());
    out.push(b' ');
    out.extend_from_slice(queue.as_bytes());
    out.push(b' ');
    let mut digits = [0u8; 10];
    out.extend_from_slice(format_u32(count, &mut digits));
    out.push(b' ');
    out.extend_from_slice(body);
    out.push(b'\n');
}

/// Formats `n` in decimal into `buf` without allocating.
pub fn format_u32(mut n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let mut out = Vec::new();
        write_delivery(&mut out, "m1", "receiver_1_queue", 12, br#"{"a": "b c"}"#);
        assert_eq!(out, b"Message: m1 receiver_1_queue 12 {\"a\": \"b c\"}\n");
        let line = std::str::from_utf8(&out[..out.len() - 1]).unwrap();
        let d = Delivery::parse(line).unwrap();
        assert_eq!(d.message_id, "m1");
        assert_eq!(d.queue, "receiver_1_queue");
        assert_eq!(d.delivery_count, 12);
        assert_eq!(d.body, r#"{"a": "b c"}"#);
    }

    #[test]
    fn formats_numbers() {
        let mut b = [0u8; 10];
        assert_eq!(format_u32(0, &mut b), b"0");
        assert_eq!(format_u32(4_294_967_295, &mut b), b"4294967295");
    }

    #[test]
    fn rejects_short_lines() {
        assert!(Delivery::parse("Message: m1 q").is_none());
        assert!(Delivery::parse("Message: m1 q x {}").is_none());
    }
}
