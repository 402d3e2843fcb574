//! Reading one command's reply line: success shapes, and refusals turned into
//! [`RequestError`]s that keep the broker's text.

use ciphermq_proto::name::{check_routing_key, check_routing_pattern};
use ciphermq_proto::Reply;

use crate::client::error::RequestError;

/// A line that does not answer the command with success: `Access denied: …`,
/// `Error: …`, `Rate limited`, or something unexpected.
pub(crate) fn refusal(line: String) -> RequestError {
    match Reply::parse(&line) {
        Reply::AccessDenied(whole) => RequestError::Denied(
            whole
                .strip_prefix("Access denied: ")
                .unwrap_or(whole)
                .to_owned(),
        ),
        Reply::Error(text) => RequestError::Broker(text.to_owned()),
        Reply::RateLimited => RequestError::RateLimited,
        _ => RequestError::Unexpected(line),
    }
}

/// `Ok` if the line is exactly `OK <expected>`.
pub(crate) fn ok_exact(line: String, expected: &str) -> Result<(), RequestError> {
    if line.strip_prefix("OK ") == Some(expected) {
        Ok(())
    } else {
        Err(refusal(line))
    }
}

/// The number ending `OK <prefix> <n>`.
pub(crate) fn ok_count(line: String, prefix: &str) -> Result<u64, RequestError> {
    let n = line
        .strip_prefix("OK ")
        .and_then(|rest| rest.strip_prefix(prefix))
        .and_then(|rest| rest.strip_prefix(' '))
        .and_then(|n| n.parse().ok());
    n.ok_or_else(|| refusal(line))
}

/// Checks a queue, exchange or client id against the name rule.
pub(crate) fn check_name(what: &'static str, name: &str) -> Result<(), RequestError> {
    if ciphermq_proto::is_valid_name(name) {
        Ok(())
    } else {
        Err(RequestError::InvalidName {
            what,
            name: name.to_owned(),
            reason: "names are 1 to 255 of [A-Za-z0-9_.:-], not . or ..".to_owned(),
        })
    }
}

/// Checks a publish's routing key.
pub(crate) fn check_key(name: &str) -> Result<(), RequestError> {
    check_routing_key(name).map_err(|e| RequestError::InvalidName {
        what: "routing key",
        name: name.to_owned(),
        reason: e.to_string(),
    })
}

/// Checks a binding key (wildcards allowed).
pub(crate) fn check_pattern(name: &str) -> Result<(), RequestError> {
    check_routing_pattern(name).map_err(|e| RequestError::InvalidName {
        what: "binding key",
        name: name.to_owned(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_keep_the_brokers_text() {
        assert!(matches!(
            refusal("Access denied: receivers may not publish (role=receiver)".into()),
            RequestError::Denied(t) if t == "receivers may not publish (role=receiver)"
        ));
        assert!(matches!(
            refusal("Error: unknown queue q".into()),
            RequestError::Broker(t) if t == "unknown queue q"
        ));
        assert!(matches!(
            refusal("Rate limited".into()),
            RequestError::RateLimited
        ));
        assert!(matches!(
            refusal("OK what".into()),
            RequestError::Unexpected(t) if t == "OK what"
        ));
        assert!(ok_exact("OK declare_queue q".into(), "declare_queue q").is_ok());
        assert!(ok_exact("OK declare_queue qq".into(), "declare_queue q").is_err());
        assert_eq!(
            ok_count("OK purge_queue q 7".into(), "purge_queue q").unwrap(),
            7
        );
        assert!(ok_count("OK purge_queue q x".into(), "purge_queue q").is_err());
        assert!(check_name("queue", "a b").is_err());
        assert!(check_name("queue", "a\nquit").is_err());
        assert!(check_key("a.*").is_err());
        assert!(check_pattern("a.*").is_ok());
    }
}
