//! Reply lines: written by the broker straight into its output buffer, parsed
//! by clients with [`Reply::parse`].

use std::fmt;

use crate::delivery::Delivery;

/// The reason word of `NACK <message_id> <reason>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NackReason {
    /// The caller's role may not publish.
    AccessDenied,
    /// The caller's publish rate limit is exhausted; retry later.
    RateLimited,
    /// No queue matched the exchange and routing key (or the exchange is unknown).
    NoRoute,
    /// The body lacks a required field, or a name breaks the name rule.
    Invalid,
    /// The body exceeds `performance.max_message_bytes`.
    TooLarge,
    /// A target queue holds `performance.max_queue_size` messages.
    QueueFull,
    /// Free disk space is below `storage.min_free_mb`: nothing new is
    /// stored until consumers free space; retry later.
    DiskFull,
    /// The message could not be made durable.
    Storage,
    /// A target shard did not answer in time.
    Timeout,
}

impl NackReason {
    /// Every reason, in declaration order (`reason as usize` indexes it):
    /// a bounded label set for metrics.
    pub const ALL: [NackReason; 9] = [
        NackReason::AccessDenied,
        NackReason::RateLimited,
        NackReason::NoRoute,
        NackReason::Invalid,
        NackReason::TooLarge,
        NackReason::QueueFull,
        NackReason::DiskFull,
        NackReason::Storage,
        NackReason::Timeout,
    ];

    /// The protocol word.
    pub fn as_str(self) -> &'static str {
        match self {
            NackReason::AccessDenied => "access_denied",
            NackReason::RateLimited => "rate_limited",
            NackReason::NoRoute => "no_route",
            NackReason::Invalid => "invalid",
            NackReason::TooLarge => "too_large",
            NackReason::QueueFull => "queue_full",
            NackReason::DiskFull => "disk_full",
            NackReason::Storage => "storage",
            NackReason::Timeout => "timeout",
        }
    }

    /// Parses the protocol word.
    pub fn parse(s: &str) -> Option<NackReason> {
        Some(match s {
            "access_denied" => NackReason::AccessDenied,
            "rate_limited" => NackReason::RateLimited,
            "no_route" => NackReason::NoRoute,
            "invalid" => NackReason::Invalid,
            "too_large" => NackReason::TooLarge,
            "queue_full" => NackReason::QueueFull,
            "disk_full" => NackReason::DiskFull,
            "storage" => NackReason::Storage,
            "timeout" => NackReason::Timeout,
            _ => return None,
        })
    }

    /// Whether a sender may succeed by publishing the same message again later.
    pub fn is_retriable(self) -> bool {
        matches!(
            self,
            NackReason::RateLimited
                | NackReason::QueueFull
                | NackReason::DiskFull
                | NackReason::Storage
                | NackReason::Timeout
        )
    }
}

impl fmt::Display for NackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Appends `ACK <id>\n`.
#[inline]
pub fn write_ack(out: &mut Vec<u8>, message_id: &str) {
    out.extend_from_slice(b"ACK ");
    out.extend_from_slice(message_id.as_bytes());
    out.push(b'\n');
}

/// Appends `NACK <id> <reason>\n`; `-` stands for an unreadable id.
#[inline]
pub fn write_nack(out: &mut Vec<u8>, message_id: &str, reason: NackReason) {
    out.extend_from_slice(b"NACK ");
    out.extend_from_slice(message_id.as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason.as_str().as_bytes());
    out.push(b'\n');
}

/// Appends one line made of `parts` and a newline.
#[inline]
pub fn write_line(out: &mut Vec<u8>, parts: &[&str]) {
    for part in parts {
        out.extend_from_slice(part.as_bytes());
    }
    out.push(b'\n');
}

/// One reply line as a client sees it, borrowing from the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<'a> {
    /// `HELLO ciphermq/1 <client_id> <role>`
    Hello {
        /// The CN the broker read from the client certificate.
        client_id: &'a str,
        /// `sender`, `receiver` or `admin`.
        role: &'a str,
    },
    /// `OK <command> …` (the text after `OK `).
    Ok(&'a str),
    /// `ACK <message_id>`: durable in every target queue.
    Ack(&'a str),
    /// `NACK <message_id> <reason>`; `reason` is kept as text so that a newer
    /// broker's reasons still parse.
    Nack {
        /// The message id, or `-`.
        message_id: &'a str,
        /// The reason word.
        reason: &'a str,
    },
    /// `ACK_CONFIRMED <message_id>`
    AckConfirmed(&'a str),
    /// `NACK_CONFIRMED <message_id>`
    NackConfirmed(&'a str),
    /// `Public key registered`
    PublicKeyRegistered,
    /// `PUBLIC_KEY <client_id> <b64>`
    PublicKey {
        /// Whose key.
        client_id: &'a str,
        /// Standard base64 of 32 bytes.
        key_b64: &'a str,
    },
    /// `Message: <id> <queue> <count> <json>`
    Message(Delivery<'a>),
    /// `Access denied: …` (the whole line).
    AccessDenied(&'a str),
    /// `Rate limited`
    RateLimited,
    /// `Error: <reason>` (the text after `Error: `).
    Error(&'a str),
    /// Anything else.
    Unknown(&'a str),
}

impl<'a> Reply<'a> {
    /// Classifies one line (without its newline).
    pub fn parse(line: &'a str) -> Reply<'a> {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(rest) = line.strip_prefix("ACK ") {
            return Reply::Ack(rest);
        }
        if let Some(rest) = line.strip_prefix("Message: ") {
            return match Delivery::parse_fields(rest) {
                Some(d) => Reply::Message(d),
                None => Reply::Unknown(line),
            };
        }
        if let Some(rest) = line.strip_prefix("NACK ") {
            return match rest.split_once(' ') {
                Some((message_id, reason)) => Reply::Nack { message_id, reason },
                None => Reply::Unknown(line),
            };
        }
        if let Some(rest) = line.strip_prefix("ACK_CONFIRMED ") {
            return Reply::AckConfirmed(rest);
        }
        if let Some(rest) = line.strip_prefix("NACK_CONFIRMED ") {
            return Reply::NackConfirmed(rest);
        }
        if let Some(rest) = line.strip_prefix("OK ") {
            return Reply::Ok(rest);
        }
        if let Some(rest) = line.strip_prefix("Error: ") {
            return Reply::Error(rest);
        }
        if line.starts_with("Access denied") {
            return Reply::AccessDenied(line);
        }
        if line == "Rate limited" {
            return Reply::RateLimited;
        }
        if line == "Public key registered" {
            return Reply::PublicKeyRegistered;
        }
        if let Some(rest) = line.strip_prefix("PUBLIC_KEY ") {
            if let Some((client_id, key_b64)) = rest.split_once(' ') {
                return Reply::PublicKey { client_id, key_b64 };
            }
        }
        if let Some(rest) = line.strip_prefix("HELLO ") {
            let mut parts = rest.split(' ');
            if let (Some(crate::PROTOCOL), Some(client_id), Some(role), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            {
                return Reply::Hello { client_id, role };
            }
        }
        Reply::Unknown(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_ack_and_nack() {
        let mut out = Vec::new();
        write_ack(&mut out, "m1");
        write_nack(&mut out, "m2", NackReason::QueueFull);
        write_line(&mut out, &["OK fetch ", "3"]);
        assert_eq!(out, b"ACK m1\nNACK m2 queue_full\nOK fetch 3\n");
    }

    #[test]
    fn parses_every_reply_kind() {
        assert_eq!(Reply::parse("ACK m1"), Reply::Ack("m1"));
        assert_eq!(
            Reply::parse("NACK m1 no_route"),
            Reply::Nack {
                message_id: "m1",
                reason: "no_route"
            }
        );
        assert_eq!(Reply::parse("ACK_CONFIRMED m1"), Reply::AckConfirmed("m1"));
        assert_eq!(
            Reply::parse("NACK_CONFIRMED m1"),
            Reply::NackConfirmed("m1")
        );
        assert_eq!(Reply::parse("OK consume q"), Reply::Ok("consume q"));
        assert_eq!(
            Reply::parse("Error: line too long"),
            Reply::Error("line too long")
        );
        assert_eq!(Reply::parse("Rate limited"), Reply::RateLimited);
        assert_eq!(
            Reply::parse("Public key registered"),
            Reply::PublicKeyRegistered
        );
        assert_eq!(
            Reply::parse("PUBLIC_KEY r1 QUFB"),
            Reply::PublicKey {
                client_id: "r1",
                key_b64: "QUFB"
            }
        );
        assert_eq!(
            Reply::parse("HELLO ciphermq/1 sender_1 sender"),
            Reply::Hello {
                client_id: "sender_1",
                role: "sender"
            }
        );
        assert!(matches!(
            Reply::parse("Access denied: x (role=sender)"),
            Reply::AccessDenied(_)
        ));
        assert!(matches!(
            Reply::parse("Message: m1 q 2 {\"a\":1}"),
            Reply::Message(_)
        ));
        assert_eq!(Reply::parse("what"), Reply::Unknown("what"));
    }

    #[test]
    fn reasons_round_trip() {
        for (i, r) in NackReason::ALL.into_iter().enumerate() {
            assert_eq!(NackReason::parse(r.as_str()), Some(r));
            // `ALL` is indexed by the reason (metrics count by it).
            assert_eq!(r as usize, i);
        }
        // A full disk frees up as consumers drain: senders retry it.
        assert!(NackReason::DiskFull.is_retriable());
        assert!(!NackReason::Invalid.is_retriable());
    }
}
