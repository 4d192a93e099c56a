//! libcephfs health, read from the client's admin socket at scrape time.
//!
//! libcephfs exposes no C call for its MDS sessions or pending requests, but every libcephfs
//! client serves Ceph's admin socket protocol when the `admin_socket` option names a path (the
//! daemon sets one when metrics are on). We ask it `mds_sessions` (one entry per MDS session with
//! its state: opening/open/stale/closing ...; and the caps held) and `mds_requests` (metadata
//! requests sent and not yet answered), through `ceph_client::admin_socket` (the protocol, which
//! the bench's reader of perf counters shares). libcephfs writes its
//! `mds_requests` answer as one object with a key "request" per request
//! (`{"request": {...}, "request": {...}}`): a JSON map keeps only one of them, so those keys are
//! counted as they are parsed ([`count_mds_requests`]).
//!
//! The admin socket also answers `config show`, which includes secrets: keep its directory
//! private (it is created next to the vhost-user socket by default).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::text::{Kind, TextWriter};

/// Per-command deadline: a scrape must not hang on a wedged client.
const TIMEOUT: Duration = Duration::from_secs(3);

/// What the scrape learned about the libcephfs client.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CephHealth {
    /// The admin socket answered.
    pub up: bool,
    /// MDS sessions: (rank, state name, caps held).
    pub sessions: Vec<(i64, String, u64)>,
    /// Metadata requests sent to an MDS and not yet answered.
    pub requests_in_flight: u64,
}

impl CephHealth {
    /// Build from the JSON answer of `mds_sessions` and the count of `mds_requests`.
    pub fn from_answers(sessions: &Value, requests_in_flight: u64) -> CephHealth {
        let sessions = sessions
            .get("sessions")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .map(|s| {
                        (
                            s.get("mds").and_then(Value::as_i64).unwrap_or(-1),
                            s.get("state")
                                .and_then(Value::as_str)
                                .unwrap_or("unknown")
                                .to_owned(),
                            s.get("num_caps").and_then(Value::as_u64).unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        CephHealth {
            up: true,
            sessions,
            requests_in_flight,
        }
    }

    /// Ask the admin socket at `path`; `up: false` when it does not answer.
    pub async fn query(path: &Path) -> CephHealth {
        let sessions = command(path, "mds_sessions").await;
        let requests = mds_requests(path).await;
        match (sessions, requests) {
            (Ok(s), Ok(r)) => CephHealth::from_answers(&s, r),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(socket = %path.display(), error = %e, "libcephfs admin socket did not answer");
                CephHealth::default()
            }
        }
    }

    pub fn render(&self, w: &mut TextWriter) {
        w.family(
            "ceph_virtiofsd_ceph_admin_socket_up",
            Kind::Gauge,
            "1 if the libcephfs admin socket answered this scrape.",
        );
        w.sample(
            "ceph_virtiofsd_ceph_admin_socket_up",
            &[],
            u8::from(self.up),
        );
        if !self.up {
            return;
        }
        w.family(
            "ceph_virtiofsd_ceph_mds_sessions",
            Kind::Gauge,
            "libcephfs MDS sessions by state (open is healthy; opening, stale, closing are not).",
        );
        let mut by_state: BTreeMap<&str, u64> = BTreeMap::new();
        for (_, state, _) in &self.sessions {
            *by_state.entry(state).or_default() += 1;
        }
        if !by_state.contains_key("open") {
            by_state.insert("open", 0);
        }
        for (state, n) in &by_state {
            w.sample("ceph_virtiofsd_ceph_mds_sessions", &[("state", state)], n);
        }
        w.family(
            "ceph_virtiofsd_ceph_caps",
            Kind::Gauge,
            "Capabilities libcephfs holds from the MDS, by MDS rank.",
        );
        for (mds, _, caps) in &self.sessions {
            let mds = mds.to_string();
            w.sample("ceph_virtiofsd_ceph_caps", &[("mds", &mds)], caps);
        }
        w.family(
            "ceph_virtiofsd_ceph_mds_requests_in_flight",
            Kind::Gauge,
            "Metadata requests libcephfs sent to an MDS and has no answer for yet.",
        );
        w.sample(
            "ceph_virtiofsd_ceph_mds_requests_in_flight",
            &[],
            self.requests_in_flight,
        );
    }
}

/// What libcephfs is waiting for right now, for the slow-request watchdog: metadata requests
/// sent to an MDS (`mds_requests`) and operations sent to OSDs (`objecter_requests`) that
/// have no answer yet. Both zero while a call blocks means it waits inside the client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientWaits {
    pub mds_requests: u64,
    pub osd_ops: u64,
}

/// The `objecter_requests` lists of operations that wait for an answer (`linger_ops` are
/// standing watches, not waits).
const OBJECTER_WAITS: [&str; 5] = [
    "ops",
    "pool_ops",
    "pool_stat_ops",
    "statfs_ops",
    "command_ops",
];

fn list_len(v: &Value, key: &str) -> u64 {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(0, |l| u64::try_from(l.len()).unwrap_or(u64::MAX))
}

impl ClientWaits {
    /// Build from the count of `mds_requests` and the JSON answer of `objecter_requests`.
    pub fn from_answers(mds_requests: u64, objecter: &Value) -> ClientWaits {
        ClientWaits {
            mds_requests,
            osd_ops: OBJECTER_WAITS
                .iter()
                .map(|k| list_len(objecter, k))
                .fold(0, u64::saturating_add),
        }
    }

    /// Ask the admin socket at `path`.
    pub async fn query(path: &Path) -> std::io::Result<ClientWaits> {
        let mds = mds_requests(path).await?;
        let objecter = command(path, "objecter_requests").await?;
        Ok(ClientWaits::from_answers(mds, &objecter))
    }
}

/// How many metadata requests libcephfs has sent and not had answered (`mds_requests`).
async fn mds_requests(path: &Path) -> std::io::Result<u64> {
    let answer = command_raw(path, "mds_requests").await?;
    count_mds_requests(&answer).map_err(std::io::Error::other)
}

/// The number of requests in an `mds_requests` answer: each key "request" of the top object
/// (libcephfs's format), plus the length of a "requests" list should a release write one.
pub fn count_mds_requests(answer: &[u8]) -> serde_json::Result<u64> {
    use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

    struct Count(u64);
    struct CountKeys;

    impl<'de> Visitor<'de> for CountKeys {
        type Value = Count;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Count, A::Error> {
            let mut n = 0u64;
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "request" => {
                        map.next_value::<IgnoredAny>()?;
                        n = n.saturating_add(1);
                    }
                    "requests" => {
                        let list = map.next_value::<Vec<IgnoredAny>>()?;
                        n = n.saturating_add(u64::try_from(list.len()).unwrap_or(u64::MAX));
                    }
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(Count(n))
        }
    }

    impl<'de> Deserialize<'de> for Count {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Count, D::Error> {
            d.deserialize_map(CountKeys)
        }
    }

    serde_json::from_slice::<Count>(answer).map(|c| c.0)
}

/// One admin socket command, with a deadline.
pub async fn command(path: &Path, prefix: &str) -> std::io::Result<Value> {
    let answer = command_raw(path, prefix).await?;
    serde_json::from_slice(&answer).map_err(std::io::Error::other)
}

/// One admin socket command, with a deadline: the answer's bytes.
pub async fn command_raw(path: &Path, prefix: &str) -> std::io::Result<Vec<u8>> {
    let request = serde_json::json!({ "prefix": prefix }).to_string();
    ceph_client::admin_socket::command_async(path, &request, TIMEOUT).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn parses_sessions_and_requests() {
        let sessions = serde_json::json!({
            "id": 4242,
            "sessions": [
                {"mds": 0, "seq": 3, "num_caps": 12, "state": "open"},
                {"mds": 1, "seq": 0, "num_caps": 0, "state": "stale"}
            ],
            "mdsmap_epoch": 7
        });
        let h = CephHealth::from_answers(&sessions, 2);
        assert!(h.up);
        assert_eq!(h.requests_in_flight, 2);
        assert_eq!(h.sessions.len(), 2);
        let mut w = TextWriter::new();
        h.render(&mut w);
        let text = w.finish();
        for line in [
            "ceph_virtiofsd_ceph_admin_socket_up 1",
            "ceph_virtiofsd_ceph_mds_sessions{state=\"open\"} 1",
            "ceph_virtiofsd_ceph_mds_sessions{state=\"stale\"} 1",
            "ceph_virtiofsd_ceph_caps{mds=\"0\"} 12",
            "ceph_virtiofsd_ceph_mds_requests_in_flight 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn counts_mds_requests_in_libcephfs_format() {
        // What libcephfs 16.2 answers: one "request" key per request, in one object.
        let two = br##"{
            "request": {"tid": 6, "op": "setfilelock", "path": "#0x100000013ca", "age": 2.05},
            "request": {"tid": 7, "op": "getattr", "path": "#0x1", "age": 0.1}
        }"##;
        assert_eq!(count_mds_requests(two).ok(), Some(2));
        assert_eq!(count_mds_requests(b"{}").ok(), Some(0));
        assert_eq!(
            count_mds_requests(br#"{"requests": [{"tid": 1}, {"tid": 2}, {"tid": 3}]}"#).ok(),
            Some(3)
        );
        assert!(count_mds_requests(b"[1]").is_err());
        assert!(count_mds_requests(b"{\"request\": ").is_err());
    }

    #[test]
    fn parses_what_the_client_waits_for() {
        let objecter = serde_json::json!({
            "ops": [{"tid": 1}, {"tid": 2}],
            "linger_ops": [{"linger_id": 1}],
            "pool_ops": [],
            "pool_stat_ops": [],
            "statfs_ops": [{"tid": 3}],
            "command_ops": []
        });
        assert_eq!(
            ClientWaits::from_answers(1, &objecter),
            ClientWaits {
                mds_requests: 1,
                osd_ops: 3
            }
        );
        let nothing = serde_json::json!({});
        assert_eq!(
            ClientWaits::from_answers(0, &nothing),
            ClientWaits::default()
        );
    }

    #[test]
    fn down_socket_says_so_only() {
        let mut w = TextWriter::new();
        CephHealth::default().render(&mut w);
        let text = w.finish();
        assert!(text.contains("ceph_virtiofsd_ceph_admin_socket_up 0\n"));
        assert!(!text.contains("mds_sessions"));
    }

    #[test]
    fn speaks_the_admin_socket_protocol() {
        let dir = std::env::temp_dir().join(format!("cvfs-asok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let path = dir.join("fake.asok");
        let _ = std::fs::remove_file(&path);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let health = rt.block_on(async {
            let listener = tokio::net::UnixListener::bind(&path).unwrap_or_else(|e| panic!("{e}"));
            let server = tokio::spawn(async move {
                for _ in 0..2 {
                    let (mut s, _) = listener.accept().await.unwrap_or_else(|e| panic!("{e}"));
                    let mut req = Vec::new();
                    loop {
                        let b = s.read_u8().await.unwrap_or_else(|e| panic!("{e}"));
                        if b == 0 {
                            break;
                        }
                        req.push(b);
                    }
                    let req: Value = serde_json::from_slice(&req).unwrap_or_else(|e| panic!("{e}"));
                    let answer = match req.get("prefix").and_then(Value::as_str) {
                        Some("mds_sessions") => {
                            r#"{"sessions":[{"mds":0,"num_caps":3,"state":"open"}]}"#
                        }
                        Some("mds_requests") => r#"{"request":{"tid":1},"request":{"tid":2}}"#,
                        other => panic!("unexpected command {other:?}"),
                    };
                    let len = u32::try_from(answer.len()).unwrap_or(0);
                    s.write_u32(len).await.unwrap_or_else(|e| panic!("{e}"));
                    s.write_all(answer.as_bytes())
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                }
            });
            let health = CephHealth::query(&path).await;
            server.await.unwrap_or_else(|e| panic!("{e}"));
            health
        });
        assert_eq!(
            health,
            CephHealth {
                up: true,
                sessions: vec![(0, "open".to_owned(), 3)],
                requests_in_flight: 2,
            }
        );
        let missing = rt.block_on(CephHealth::query(&dir.join("none.asok")));
        assert!(!missing.up);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
