//! Requests that change the broker (`POST /api/reload`) must not come from
//! another web site.
//!
//! A browser holding an admin certificate presents it to any page's
//! requests, so without a check a page on another site could make the
//! browser post a reload (a form, a `fetch` without CORS). Such a request
//! is refused unless it carries [`CHANGE_HEADER`]: a browser sends a header
//! of its own choosing to another origin only after a CORS preflight, which
//! the endpoint never approves (`OPTIONS` is 405 and no route sends
//! `Access-Control-Allow-*`). Browsers also say where a request comes from,
//! so an `Origin` other than the endpoint's own, or `Sec-Fetch-Site` naming
//! another site, is refused even with the header. Tools (`ciphermq-admin`,
//! `curl -H`) send the header and neither of the others.

use hyper::header::{HeaderMap, HOST, ORIGIN};

/// The header a request that changes the broker must carry, with the value
/// [`CHANGE_HEADER_VALUE`].
pub const CHANGE_HEADER: &str = "x-ciphermq-request";

/// The value [`CHANGE_HEADER`] must have.
pub const CHANGE_HEADER_VALUE: &str = "1";

/// Why a request that changes the broker is refused as possibly cross-site,
/// or `None` when it may go on. The text follows `forbidden: ` in the 403.
pub(crate) fn refusal(headers: &HeaderMap) -> Option<String> {
    if let Some(site) = headers.get("sec-fetch-site") {
        // `same-origin`, or `none` (typed in, a bookmark): the user's own.
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return Some(format!(
                "cross-site request refused (Sec-Fetch-Site: {})",
                String::from_utf8_lossy(site.as_bytes())
            ));
        }
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let own = headers
            .get(HOST)
            .map(|host| [b"https://", host.as_bytes()].concat());
        if own.as_deref() != Some(origin.as_bytes()) {
            return Some(format!(
                "cross-origin request refused (Origin: {} is not this endpoint)",
                String::from_utf8_lossy(origin.as_bytes())
            ));
        }
    }
    match headers.get(CHANGE_HEADER) {
        Some(value) if value.as_bytes() == CHANGE_HEADER_VALUE.as_bytes() => None,
        _ => Some(format!(
            "a request that changes the broker needs the header X-CipherMQ-Request: \
             {CHANGE_HEADER_VALUE} (browsers cannot send it from another site)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn a_tool_with_the_header_may_change_the_broker() {
        let tool = headers(&[("host", "127.0.0.1:9091"), ("x-ciphermq-request", "1")]);
        assert_eq!(refusal(&tool), None);
        // The endpoint's own page, from a browser.
        let own = headers(&[
            ("host", "broker:9091"),
            ("origin", "https://broker:9091"),
            ("sec-fetch-site", "same-origin"),
            ("x-ciphermq-request", "1"),
        ]);
        assert_eq!(refusal(&own), None);
    }

    #[test]
    fn what_a_browser_can_send_from_another_site_is_refused() {
        // A form post: no header of its own.
        let form = headers(&[
            ("host", "broker:9091"),
            ("origin", "https://evil.example"),
            ("sec-fetch-site", "cross-site"),
        ]);
        assert!(refusal(&form)
            .unwrap()
            .contains("Sec-Fetch-Site: cross-site"));
        let old_browser = headers(&[("host", "broker:9091"), ("origin", "https://evil.example")]);
        assert!(refusal(&old_browser)
            .unwrap()
            .contains("Origin: https://evil.example"));
        for (name, value) in [
            ("sec-fetch-site", "same-site"),
            ("origin", "null"),
            ("origin", "http://broker:9091"),
        ] {
            let h = headers(&[
                ("host", "broker:9091"),
                ("x-ciphermq-request", "1"),
                (name, value),
            ]);
            assert!(refusal(&h).is_some(), "{name}: {value}");
        }
        for value in ["0", "true", ""] {
            let h = headers(&[("x-ciphermq-request", value)]);
            assert!(
                refusal(&h).unwrap().contains("X-CipherMQ-Request: 1"),
                "{value:?}"
            );
        }
        assert!(refusal(&HeaderMap::new()).is_some());
    }
}
