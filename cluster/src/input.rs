//! Checks on what callers pass in, before any SQL: a bad value is a
//! [`ClusterError::BadInput`] naming it, never a panic or a server error.

use crate::error::ClusterError;

/// Longest node id, owner, exchange name or kind accepted, in bytes.
pub(crate) const MAX_NAME: usize = 255;

/// A node id, owner CN, exchange name or kind: 1 to [`MAX_NAME`] bytes, no
/// control characters (PostgreSQL text cannot hold NUL, and these end up in
/// reply lines).
pub(crate) fn name(what: &'static str, value: &str) -> Result<(), ClusterError> {
    let why = if value.is_empty() {
        "it is empty"
    } else if value.len() > MAX_NAME {
        "it is longer than 255 bytes"
    } else if value.chars().any(char::is_control) {
        "it contains a control character"
    } else if value.chars().any(char::is_whitespace) {
        "it contains whitespace"
    } else {
        return Ok(());
    };
    Err(bad(what, value, why))
}

/// An advertised address: `host:port` with a non-zero port (`[::1]:5700`
/// for IPv6).
pub(crate) fn advertise(value: &str) -> Result<(), ClusterError> {
    name("advertise address", value)?;
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err(bad("advertise address", value, "it has no :port"));
    };
    if host.is_empty() {
        return Err(bad("advertise address", value, "it has no host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(bad(
            "advertise address",
            value,
            "its port is not 1 to 65535",
        )),
    }
}

/// A number stored as PostgreSQL `bigint`.
pub(crate) fn bigint(what: &'static str, value: u64) -> Result<i64, ClusterError> {
    i64::try_from(value).map_err(|_| bad(what, &value.to_string(), "it is above 2^63 - 1"))
}

fn bad(what: &'static str, value: &str, why: &'static str) -> ClusterError {
    ClusterError::BadInput {
        what,
        value: value.to_owned(),
        why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_short_printable_words() {
        assert_eq!(name("owner", "alice"), Ok(()));
        for value in ["", "a b", "a\0b", "a\nb", &"x".repeat(256)] {
            assert!(
                matches!(
                    name("owner", value),
                    Err(ClusterError::BadInput { what: "owner", .. })
                ),
                "{value:?}"
            );
        }
    }

    #[test]
    fn addresses_need_a_host_and_a_port() {
        for good in ["127.0.0.1:5700", "broker-2.example:1", "[::1]:5700"] {
            assert_eq!(advertise(good), Ok(()), "{good}");
        }
        for bad in ["127.0.0.1", ":5700", "h:0", "h:65536", "h:x", ""] {
            assert!(advertise(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn numbers_above_bigint_are_refused() {
        assert_eq!(bigint("epoch", 7), Ok(7));
        assert!(bigint("epoch", u64::MAX).is_err());
    }
}
