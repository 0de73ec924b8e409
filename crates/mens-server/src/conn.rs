//! Connections: the accept loop and the registry that bounds them. At most `max_connections` at
//! once and `max_connections_per_client` from one address; when either cap is reached the oldest
//! idle connection (no request in flight: keep-alive, or still sending its header) is closed to make
//! room, so idle or slow clients cannot lock a well-behaved one out. Only when every connection is
//! busy is a new one refused (503).

use axum::body::Body;
use axum::http::Request;
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use futures_util::StreamExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// Requests in flight on one connection (a response body being streamed counts).
#[derive(Clone, Default)]
pub(crate) struct Busy(Arc<AtomicUsize>);

struct Entry {
    ip: IpAddr,
    opened: Instant,
    busy: Busy,
    close: Arc<Notify>,
}

#[derive(Default)]
pub(crate) struct Registry {
    conns: Mutex<HashMap<u64, Entry>>,
    next: AtomicUsize,
}

/// What to do with a new connection.
#[derive(Debug, PartialEq)]
enum Admit {
    Accept,
    /// Close this (idle) connection first, then accept.
    Shed(u64),
    Refuse,
}

impl Registry {
    fn admit(&self, ip: IpAddr, max: usize, per_client: usize) -> Admit {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let from_ip = conns.values().filter(|e| e.ip == ip).count();
        let idle_oldest = |same_ip: bool| {
            conns
                .iter()
                .filter(|(_, e)| e.busy.0.load(Ordering::SeqCst) == 0 && (!same_ip || e.ip == ip))
                .min_by_key(|(_, e)| e.opened)
                .map(|(&id, _)| id)
        };
        if from_ip >= per_client {
            return idle_oldest(true).map_or(Admit::Refuse, Admit::Shed);
        }
        if conns.len() >= max {
            // The address holding most connections gives up its oldest idle one first.
            return idle_oldest(false).map_or(Admit::Refuse, Admit::Shed);
        }
        Admit::Accept
    }

    fn insert(&self, ip: IpAddr) -> (u64, Busy, Arc<Notify>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed) as u64;
        let busy = Busy::default();
        let close = Arc::new(Notify::new());
        let e = Entry {
            ip,
            opened: Instant::now(),
            busy: busy.clone(),
            close: close.clone(),
        };
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, e);
        (id, busy, close)
    }

    fn close(&self, id: u64) {
        if let Some(e) = self
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
        {
            e.close.notify_one();
        }
    }

    fn remove(&self, id: u64) {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    pub(crate) fn open(&self) -> usize {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Middleware: the connection is busy from a request's start until its response body is done.
pub(crate) async fn track(req: Request<Body>, next: Next) -> Response {
    let Some(busy) = req.extensions().get::<Busy>().cloned() else {
        return next.run(req).await;
    };
    busy.0.fetch_add(1, Ordering::SeqCst);
    struct Done(Busy);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0 .0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let done = Done(busy);
    let r = next.run(req).await;
    let (parts, body) = r.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _ = &done;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

/// The answer to a connection refused because every other one is busy.
fn refused() -> Vec<u8> {
    let body = r#"{"error":{"message":"too many connections, all busy; retry later","type":"server_error","param":null,"code":"overloaded"}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The accept loop (see the module comment).
pub(crate) async fn accept_loop(
    listener: TcpListener,
    app: Router,
    registry: Arc<Registry>,
    limits: (usize, usize),
    header_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let (max, per_client) = (limits.0.max(1), limits.1.max(1));
    tokio::pin!(shutdown);
    loop {
        let (mut stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return Ok(()),
        };
        match registry.admit(peer.ip(), max, per_client) {
            Admit::Accept => {}
            Admit::Shed(id) => {
                tracing::debug!("closing idle connection {id} to admit {peer}");
                registry.close(id);
            }
            Admit::Refuse => {
                tokio::spawn(async move {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), stream.write_all(&refused()))
                            .await;
                });
                continue;
            }
        }
        let _ = stream.set_nodelay(true);
        let (id, busy, close) = registry.insert(peer.ip());
        let svc = tower::ServiceBuilder::new()
            .map_request(move |mut r: Request<hyper::body::Incoming>| {
                r.extensions_mut().insert(busy.clone());
                r
            })
            .service(app.clone());
        let svc = hyper_util::service::TowerToHyperService::new(svc);
        let reg = registry.clone();
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                // A client may shut its write side once its request is sent and still get the answer.
                .half_close(true)
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = close.notified() => {}
            }
            reg.remove(id);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_shed_the_oldest_idle_connection() {
        let r = Registry::default();
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let (first, busy_first, _) = r.insert(a);
        std::thread::sleep(Duration::from_millis(2));
        let (second, _, _) = r.insert(a);
        assert_eq!(r.admit(b, 3, 2), Admit::Accept);
        // Per-client cap: the oldest idle connection of that address goes.
        assert_eq!(r.admit(a, 3, 2), Admit::Shed(first));
        busy_first.0.fetch_add(1, Ordering::SeqCst);
        assert_eq!(r.admit(a, 3, 2), Admit::Shed(second));
        // Global cap: any address's oldest idle one; none idle: refuse.
        let (third, busy_third, _) = r.insert(b);
        assert_eq!(r.admit(b, 3, 3), Admit::Shed(second));
        r.close(second);
        let (_, busy_fourth, _) = r.insert(b);
        busy_fourth.0.fetch_add(1, Ordering::SeqCst);
        busy_third.0.fetch_add(1, Ordering::SeqCst);
        assert_eq!(r.admit(b, 3, 3), Admit::Refuse);
        busy_third.0.fetch_sub(1, Ordering::SeqCst);
        assert_eq!(r.admit(b, 3, 3), Admit::Shed(third));
    }
}
