//! The metrics endpoint: a minimal HTTP/1.x server on a tokio current-thread runtime in its own
//! thread ("metrics"), answering `GET /metrics` with the Prometheus text format. It reads the
//! counters (atomics) and asks the filesystem and libcephfs for gauges; it never touches the data
//! path's threads.

use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, error, info};

use super::ceph::CephHealth;
use super::text::CONTENT_TYPE;
use super::{FsStats, Metrics, MetricsEndpoint};

/// Longest request head we read.
const MAX_REQUEST: usize = 8192;
/// A client that does not send its request in this time is dropped.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What a scrape reports besides the counters.
#[derive(Clone)]
pub struct Scrape {
    pub metrics: &'static Metrics,
    /// Queues of the device (hiprio + request queues).
    pub queues: usize,
    pub fs: Option<Arc<dyn FsStats>>,
    /// libcephfs admin socket to ask for MDS health.
    pub admin_socket: Option<PathBuf>,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrape")
            .field("queues", &self.queues)
            .field("admin_socket", &self.admin_socket)
            .finish_non_exhaustive()
    }
}

impl Scrape {
    /// The whole text of one scrape.
    pub async fn render(&self) -> String {
        let health = match &self.admin_socket {
            Some(path) => Some(CephHealth::query(path).await),
            None => None,
        };
        self.metrics
            .render(self.queues, self.fs.as_deref(), health.as_ref())
    }
}

/// Why the endpoint could not start. Each message names the step and what to do.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("Cannot listen for metrics on {0} (pick a free port with --metrics-addr, or use --metrics-socket)")]
    BindTcp(SocketAddr, #[source] io::Error),
    #[error(
        "Cannot listen for metrics on unix socket {0} (check its directory exists and is writable)"
    )]
    BindUnix(PathBuf, #[source] io::Error),
    #[error("Metrics socket path {0} exists and is not a socket: remove it or choose another --metrics-socket")]
    NotASocket(PathBuf),
    #[error("Cannot start the metrics thread (raise the task limit)")]
    Thread(#[source] io::Error),
}

enum Bound {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

/// A running endpoint; stopped (and its unix socket removed) by [`MetricsServer::stop`] or drop.
#[derive(Debug)]
pub struct MetricsServer {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    unix_path: Option<PathBuf>,
    local_addr: Option<SocketAddr>,
}

impl MetricsServer {
    /// Bind now (so a bad address fails at startup), then serve in a "metrics" thread.
    pub fn start(endpoint: &MetricsEndpoint, scrape: Scrape) -> Result<Self, MetricsError> {
        let (bound, unix_path, local_addr) = match endpoint {
            MetricsEndpoint::Tcp(addr) => {
                let l = std::net::TcpListener::bind(addr)
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .map_err(|e| MetricsError::BindTcp(*addr, e))?;
                let local = l.local_addr().ok();
                (Bound::Tcp(l), None, local)
            }
            MetricsEndpoint::Unix(path) => {
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    if !meta.file_type().is_socket() {
                        return Err(MetricsError::NotASocket(path.clone()));
                    }
                    // A socket file left by an earlier run: replace it.
                    let _ = std::fs::remove_file(path);
                }
                let l = std::os::unix::net::UnixListener::bind(path)
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .map_err(|e| MetricsError::BindUnix(path.clone(), e))?;
                (Bound::Unix(l), Some(path.clone()), None)
            }
        };
        match (&local_addr, &unix_path) {
            (Some(addr), _) => info!(%addr, "Serving metrics at http://{addr}/metrics"),
            (_, Some(path)) => info!(socket = %path.display(), "Serving metrics on a unix socket"),
            _ => {}
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(MetricsError::Thread)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let scrape = Arc::new(scrape);
        let thread = std::thread::Builder::new()
            .name("metrics".to_owned())
            .spawn(move || runtime.block_on(serve(bound, scrape, stopped)))
            .map_err(MetricsError::Thread)?;
        Ok(MetricsServer {
            stop: Some(stop),
            thread: Some(thread),
            unix_path,
            local_addr,
        })
    }

    /// The TCP address actually bound (useful with port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                error!("The metrics thread panicked");
            }
        }
        if let Some(path) = self.unix_path.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn serve(bound: Bound, scrape: Arc<Scrape>, mut stopped: tokio::sync::oneshot::Receiver<()>) {
    match bound {
        Bound::Tcp(l) => {
            let l = match tokio::net::TcpListener::from_std(l) {
                Ok(l) => l,
                Err(e) => return error!(error = %e, "Cannot serve metrics"),
            };
            loop {
                tokio::select! {
                    accepted = l.accept() => match accepted {
                        Ok((s, _)) => { tokio::spawn(answer(s, scrape.clone())); }
                        Err(e) => debug!(error = %e, "metrics accept failed"),
                    },
                    _ = &mut stopped => return,
                }
            }
        }
        Bound::Unix(l) => {
            let l = match tokio::net::UnixListener::from_std(l) {
                Ok(l) => l,
                Err(e) => return error!(error = %e, "Cannot serve metrics"),
            };
            loop {
                tokio::select! {
                    accepted = l.accept() => match accepted {
                        Ok((s, _)) => { tokio::spawn(answer(s, scrape.clone())); }
                        Err(e) => debug!(error = %e, "metrics accept failed"),
                    },
                    _ = &mut stopped => return,
                }
            }
        }
    }
}

/// Read the request head (up to the blank line), or `None` if the client gave up or sent junk.
async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> Option<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return (!head.is_empty()).then_some(head);
        }
        head.extend_from_slice(chunk.get(..n)?);
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            return Some(head);
        }
        if head.len() > MAX_REQUEST {
            return None;
        }
    }
}

/// Status line and body for a request line.
pub fn route(request_line: &str) -> (&'static str, bool) {
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("");
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics" | "/") => ("200 OK", true),
        ("GET" | "HEAD", _) => ("404 Not Found", false),
        _ => ("405 Method Not Allowed", false),
    }
}

async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, scrape: Arc<Scrape>) {
    let Ok(Some(head)) = tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut s)).await else {
        return;
    };
    let text = String::from_utf8_lossy(&head);
    let line = text.lines().next().unwrap_or("");
    let (status, ok) = route(line);
    let body = if ok {
        scrape.render().await
    } else {
        format!("{status}: try GET /metrics\n")
    };
    let head_only = line.starts_with("HEAD ");
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(response.as_bytes()).await;
    if !head_only {
        let _ = s.write_all(body.as_bytes()).await;
    }
    let _ = s.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(mut s: impl Read + Write, request: &str) -> String {
        s.write_all(request.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap_or_else(|e| panic!("{e}"));
        out
    }

    fn scrape() -> Scrape {
        Scrape {
            metrics: super::super::global(),
            queues: 2,
            fs: None,
            admin_socket: None,
        }
    }

    #[test]
    fn routes() {
        assert_eq!(route("GET /metrics HTTP/1.1"), ("200 OK", true));
        assert_eq!(route("GET /metrics?x=1 HTTP/1.0"), ("200 OK", true));
        assert_eq!(route("HEAD / HTTP/1.1"), ("200 OK", true));
        assert!(!route("GET /other HTTP/1.1").1);
        assert_eq!(route("POST /metrics HTTP/1.1").0, "405 Method Not Allowed");
        assert!(!route("").1);
    }

    #[test]
    fn serves_over_tcp_and_unix() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}"));
        let server = MetricsServer::start(&MetricsEndpoint::Tcp(any), scrape())
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = server.local_addr().unwrap_or_else(|| panic!("no address"));
        let s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        let out = get(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains("Content-Type: text/plain; version=0.0.4"));
        assert!(out.contains("# TYPE ceph_virtiofsd_fuse_requests_total counter\n"));
        assert!(out.contains("ceph_virtiofsd_queue_in_flight{queue=\"1\"}"));
        let s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        let out = get(s, "GET /nope HTTP/1.1\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 404 Not Found\r\n"), "{out}");
        server.stop();
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "still listening"
        );

        let dir = std::env::temp_dir().join(format!("cvfs-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let path = dir.join("metrics.sock");
        std::fs::write(&path, b"not a socket").unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            MetricsServer::start(&MetricsEndpoint::Unix(path.clone()), scrape()),
            Err(MetricsError::NotASocket(_))
        ));
        std::fs::remove_file(&path).unwrap_or_else(|e| panic!("{e}"));
        let server = MetricsServer::start(&MetricsEndpoint::Unix(path.clone()), scrape())
            .unwrap_or_else(|e| panic!("{e}"));
        let s = std::os::unix::net::UnixStream::connect(&path).unwrap_or_else(|e| panic!("{e}"));
        let out = get(s, "GET /metrics HTTP/1.0\n\n");
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains("ceph_virtiofsd_write_bytes_total"));
        drop(server);
        assert!(!path.exists(), "socket file left behind");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
