//! What every request passes before a handler: the Host header (DNS rebinding), the browser Origin
//! (CORS: only origins the operator allows), and the API key on every route but `/health` and
//! `/v1/health` (open, as llama-server's). The key that matched becomes the request's [`Tenant`].

use crate::{ApiError, AppState};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// Who a request speaks for: the index of the API key it presented + 1 (0 on a server without keys).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Tenant(pub u64);

pub(crate) async fn check(
    State(s): State<Arc<AppState>>,
    mut req: Request<Body>,
    next: Next,
) -> Response {
    let c = &s.config;
    if let Some(allowed) = &c.allowed_hosts {
        if let Some(host) = req.headers().get(header::HOST) {
            let ok = host.to_str().ok().is_some_and(|h| host_allowed(h, allowed));
            if !ok {
                return ApiError::new(
                    StatusCode::FORBIDDEN,
                    "permission_error",
                    "this Host is not served (start the server with --allowed-hosts to add it)",
                )
                .into_response();
            }
        }
    }
    let origin = req.headers().get(header::ORIGIN).cloned();
    if let Some(o) = &origin {
        let allowed = o
            .to_str()
            .ok()
            .is_some_and(|o| c.cors_origins.iter().any(|a| a == "*" || a == o));
        if !allowed {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "permission_error",
                "requests from this browser origin are not allowed (see --cors-origin)",
            )
            .into_response();
        }
        if req.method() == Method::OPTIONS {
            let mut r = StatusCode::NO_CONTENT.into_response();
            cors(r.headers_mut(), o);
            let h = r.headers_mut();
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, OPTIONS"),
            );
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static("authorization, content-type, x-api-key"),
            );
            h.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            );
            return r;
        }
    }
    let mut tenant = Tenant(0);
    let open = matches!(req.uri().path(), "/health" | "/v1/health");
    if !c.api_keys.is_empty() && !open {
        match key_index(req.headers(), &c.api_keys) {
            Some(i) => tenant = Tenant(i as u64 + 1),
            None => {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "authentication_error",
                    "invalid or missing API key (send Authorization: Bearer KEY)",
                )
                .with_code("invalid_api_key")
                .into_response()
            }
        }
    }
    req.extensions_mut().insert(tenant);
    let mut r = next.run(req).await;
    if let Some(o) = &origin {
        cors(r.headers_mut(), o);
    }
    r
}

fn cors(h: &mut HeaderMap, origin: &HeaderValue) {
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    h.insert(header::VARY, HeaderValue::from_static("Origin"));
}

/// `host` (with or without a port) is one of `allowed` (case-insensitive).
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = if host.starts_with('[') {
        // [::1]:8080 → [::1]
        host.split_inclusive(']').next().unwrap_or(host)
    } else {
        host.rsplit_once(':').map_or(host, |(h, p)| {
            if p.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        })
    };
    allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// Which key the request presents (`Authorization: Bearer KEY`, any case of "Bearer", or
/// `x-api-key: KEY`), compared in constant time per key.
fn key_index(h: &HeaderMap, keys: &[String]) -> Option<usize> {
    let bearer = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
    let given = bearer.or_else(|| h.get("x-api-key").and_then(|v| v.to_str().ok()))?;
    let mut found = None;
    for (i, k) in keys.iter().enumerate() {
        // Constant-time comparison: the time does not tell how much of a key matched.
        let (a, b) = (given.as_bytes(), k.as_bytes());
        let same =
            a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0;
        if same && found.is_none() {
            found = Some(i);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_with_and_without_ports() {
        let a = crate::loopback_hosts();
        for h in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:1",
            "[::1]:8080",
            "LOCALHOST",
        ] {
            assert!(host_allowed(h, &a), "{h}");
        }
        for h in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.2",
            "localhost.evil.example",
        ] {
            assert!(!host_allowed(h, &a), "{h}");
        }
    }

    #[test]
    fn keys_by_header_and_case() {
        let keys = vec!["k1".to_string(), "k2".to_string()];
        let mut h = HeaderMap::new();
        assert_eq!(key_index(&h, &keys), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("bearer k2"));
        assert_eq!(key_index(&h, &keys), Some(1));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic k2"));
        assert_eq!(key_index(&h, &keys), None);
        h.remove(header::AUTHORIZATION);
        h.insert("x-api-key", HeaderValue::from_static("k1"));
        assert_eq!(key_index(&h, &keys), Some(0));
    }
}
