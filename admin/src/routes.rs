//! Who may see what: `/health` and `/ready` answer any client whose
//! certificate the CA signed; every other route answers admin and monitor
//! CNs only (the current, reloadable `acl.admin_cns` and `acl.monitor_cns`:
//! every route here only reads). Unknown paths are 404, other methods than
//! GET on a known path 405; every answer is JSON except the Prometheus text
//! of `/metrics` and the dashboard page (`/`, `/dashboard`).

use std::net::SocketAddr;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Response, StatusCode};
use serde_json::json;

use crate::endpoint::AdminContext;
use crate::slots::Slots;
use crate::{dashboard, metrics, status};

/// The routes the endpoint knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Health,
    Ready,
    Status,
    Queues,
    Connections,
    Metrics,
    Dashboard,
}

impl Route {
    fn of(path: &str) -> Option<Route> {
        Some(match path {
            "/health" => Route::Health,
            "/ready" => Route::Ready,
            "/api/status" => Route::Status,
            "/api/queues" => Route::Queues,
            "/api/connections" => Route::Connections,
            "/metrics" => Route::Metrics,
            "/" | "/dashboard" => Route::Dashboard,
            _ => return None,
        })
    }

    /// Answered for any valid certificate, not only admins'.
    fn is_public(self) -> bool {
        matches!(self, Route::Health | Route::Ready)
    }
}

/// The answer to `method path` from the client whose certificate CN is `cn`
/// (`slots`: the endpoint's own connection numbers, for `/metrics`). `None`:
/// a probe on `admin.probe_address`, to which only the public routes exist.
pub(crate) fn respond(
    ctx: &AdminContext,
    slots: &Slots,
    cn: Option<&str>,
    peer: SocketAddr,
    method: &Method,
    path: &str,
) -> Response<Full<Bytes>> {
    let not_found = || json_response(StatusCode::NOT_FOUND, &json!({ "error": "not found" }));
    let Some(route) = Route::of(path) else {
        return not_found();
    };
    let cn = match cn {
        Some(cn) => cn,
        None if route.is_public() => "",
        None => return not_found(),
    };
    if !route.is_public() && !ctx.broker.access(cn).may_read() {
        tracing::warn!(%cn, %peer, %path, "admin endpoint: forbidden (neither an admin nor a monitor CN)");
        return json_response(StatusCode::FORBIDDEN, &json!({ "error": "forbidden" }));
    }
    if method != Method::GET {
        let mut response = json_response(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({ "error": "method not allowed" }),
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return response;
    }
    match route {
        Route::Health => json_response(StatusCode::OK, &json!({ "status": "ok" })),
        Route::Ready => {
            let bridge = ctx.bridge.as_ref().map(|b| b.status());
            let readiness = status::readiness(ctx.broker.stats(), bridge.as_ref());
            match (readiness.ready, readiness.reason) {
                (true, _) if readiness.warnings.is_empty() => {
                    json_response(StatusCode::OK, &json!({ "status": "ready" }))
                }
                (true, _) => json_response(
                    StatusCode::OK,
                    &json!({ "status": "ready", "warnings": readiness.warnings }),
                ),
                (false, reason) => json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({
                        "status": "not ready",
                        "reason": reason.unwrap_or_default(),
                        "warnings": readiness.warnings,
                    }),
                ),
            }
        }
        Route::Status => json_response(StatusCode::OK, &status::status(ctx)),
        Route::Queues => json_response(StatusCode::OK, &status::queues_document(ctx)),
        Route::Connections => json_response(StatusCode::OK, &status::connections_document(ctx)),
        Route::Dashboard => dashboard::page_response(),
        Route::Metrics => {
            let text = metrics::render(ctx, &slots.stats(), ctx.queue_series);
            response(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                text.into_bytes(),
            )
        }
    }
}

fn json_response(code: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut bytes = body.to_string().into_bytes();
    bytes.push(b'\n');
    response(code, "application/json", bytes)
}

fn response(code: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = code;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
