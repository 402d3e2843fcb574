//! Who may see what: `/health` and `/ready` answer any client whose
//! certificate the CA signed; the routes that read answer admin and monitor
//! CNs (the current, reloadable `acl.admin_cns` and `acl.monitor_cns`);
//! `POST /api/reload`, the one that changes the broker, answers admins only,
//! and only a request that cannot come from another web site
//! ([`crate::same_origin`]).
//! Unknown paths are 404, another method than a route's own 405; every answer is JSON except the Prometheus text
//! of `/metrics` and the dashboard page (`/`, `/dashboard`).

use std::net::SocketAddr;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderMap, HeaderValue, ALLOW, CACHE_CONTROL, CONNECTION, CONTENT_TYPE};
use hyper::{Method, Response, StatusCode};
use serde_json::json;

use crate::broker_view::Access;
use crate::endpoint::AdminContext;
use crate::slots::Slots;
use crate::{dashboard, metrics, same_origin, status};

/// The routes the endpoint knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Health,
    Ready,
    Status,
    Queues,
    Connections,
    Cluster,
    Metrics,
    Dashboard,
    Reload,
}

impl Route {
    fn of(path: &str) -> Option<Route> {
        Some(match path {
            "/health" => Route::Health,
            "/ready" => Route::Ready,
            "/api/status" => Route::Status,
            "/api/queues" => Route::Queues,
            "/api/connections" => Route::Connections,
            "/api/cluster" => Route::Cluster,
            "/metrics" => Route::Metrics,
            "/" | "/dashboard" => Route::Dashboard,
            "/api/reload" => Route::Reload,
            _ => return None,
        })
    }

    /// Answered for any valid certificate, not only admins'.
    fn is_public(self) -> bool {
        matches!(self, Route::Health | Route::Ready)
    }

    /// Changes the broker: admins only (monitors only read).
    fn changes(self) -> bool {
        matches!(self, Route::Reload)
    }

    /// The one method it answers.
    fn method(self) -> Method {
        if self.changes() {
            Method::POST
        } else {
            Method::GET
        }
    }
}

/// The answer to `method path` (with `headers`) from the client whose
/// certificate CN is `cn` (`slots`: the endpoint's own connection numbers,
/// for `/metrics`). `None`: a probe on `admin.probe_address`, to which only
/// the public routes exist.
pub(crate) fn respond(
    ctx: &AdminContext,
    slots: &Slots,
    cn: Option<&str>,
    peer: SocketAddr,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
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
    let access = ctx.broker.access(cn);
    if !route.is_public() && !access.may_read() {
        tracing::warn!(%cn, %peer, %path, "admin endpoint: forbidden (neither an admin nor a monitor CN)");
        return json_response(StatusCode::FORBIDDEN, &json!({ "error": "forbidden" }));
    }
    if route.changes() && access != Access::Admin {
        tracing::warn!(%cn, %peer, %path, "admin endpoint: forbidden (changes the broker: admin CNs only)");
        return json_response(
            StatusCode::FORBIDDEN,
            &json!({ "error": "forbidden: admins only" }),
        );
    }
    if *method != route.method() {
        let mut response = json_response(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({ "error": "method not allowed" }),
        );
        let allow = if route.changes() { "POST" } else { "GET" };
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static(allow));
        return response;
    }
    if route.changes() {
        if let Some(why) = same_origin::refusal(headers) {
            tracing::warn!(%cn, %peer, %path, %why, "admin endpoint: forbidden (may come from another web site)");
            return json_response(
                StatusCode::FORBIDDEN,
                &json!({ "error": format!("forbidden: {why}") }),
            );
        }
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
        Route::Cluster => {
            let doc = match ctx.broker.cluster() {
                Some(cluster) => json!({ "enabled": true, "cluster": cluster }),
                None => json!({ "enabled": false }),
            };
            json_response(StatusCode::OK, &doc)
        }
        Route::Dashboard => dashboard::page_response(),
        Route::Reload => match ctx.broker.reload() {
            Ok(()) => {
                tracing::info!(%cn, %peer, "admin endpoint: reload");
                json_response(StatusCode::OK, &json!({ "status": "reloaded" }))
            }
            Err(error) => {
                json_response(StatusCode::UNPROCESSABLE_ENTITY, &json!({ "error": error }))
            }
        },
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

/// The answer to a request whose connection's certificate no longer names a
/// client (revoked, or no identity under a reloaded `tls.identity`): 403 with
/// `why`, and the connection closes after it.
pub(crate) fn no_identity(why: &str) -> Response<Full<Bytes>> {
    let mut response = json_response(
        StatusCode::FORBIDDEN,
        &json!({ "error": format!("forbidden: {why}; closing the connection") }),
    );
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
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
