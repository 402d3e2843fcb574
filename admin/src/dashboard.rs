//! The web dashboard: one self-contained page (`admin/dashboard/index.html`,
//! inline CSS and JavaScript, no other asset) embedded in the binary. It
//! polls `api/status`, `api/queues`, `api/connections`, `api/cluster` and `metrics` once a
//! second with relative URLs, so the same page works from the admin
//! endpoint (`GET /` over mTLS) and behind `ciphermq-admin dashboard`.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{
    HeaderValue, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use hyper::{Response, StatusCode};

/// The page, as built into this binary.
pub const PAGE: &str = include_str!("../dashboard/index.html");

/// What the page may do: run its own inline script and style, fetch from
/// its own origin, nothing else (no other origin, no framing).
const POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                      connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
                      frame-ancestors 'none'";

/// The page as an HTTP response, with headers that keep it from being
/// framed, sniffed or cached.
pub fn page_response() -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(PAGE.as_bytes())));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_fetches_only_relative_urls_and_loads_nothing_else() {
        // The SVG namespace is a name, not an address anything is fetched from.
        let page = PAGE.replace("\"http://www.w3.org/2000/svg\"", "");
        for forbidden in [
            "http://",
            "https://",
            "<script src",
            "@import",
            "\"/api",
            "\"/metrics",
        ] {
            assert!(
                !page.contains(forbidden),
                "the dashboard must be self-contained and use relative URLs: found {forbidden:?}"
            );
        }
        for url in [
            "\"api/status\"",
            "\"api/queues\"",
            "\"api/connections\"",
            "\"metrics\"",
        ] {
            assert!(page.contains(url), "the page no longer polls {url}");
        }
    }
}
