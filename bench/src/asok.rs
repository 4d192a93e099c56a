//! MDS requests per workload, read from a libcephfs client's perf counters through its admin
//! socket (`ceph_client::admin_socket`, the reader the daemon's metrics use too: the command
//! `ceph --admin-daemon PATH perf dump` sends). Talking to the socket directly takes ~1 ms; the
//! `ceph` CLI takes seconds to start, too slow to run around every workload.
//!
//! Counter used: `client.reply.avgcount` (Pacific `l_c_reply`): incremented in
//! `Client::make_request` once per reply the MDS sends to a metadata request of this client,
//! i.e. the number of MDS round trips. Cap messages and leases are not requests and are not
//! counted.

use std::path::Path;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum AsokError {
    #[error("Admin socket {0}: perf dump failed: {1}")]
    Io(String, std::io::Error),
    #[error("Admin socket {0}: no client.reply.avgcount in the answer (not a libcephfs client?)")]
    NoCounter(String),
}

const COMMAND: &str = r#"{"prefix": "perf dump", "logger": "client", "counter": "reply"}"#;

/// Reads the number of MDS replies this client has received so far.
pub fn mds_replies(path: &Path) -> Result<u64, AsokError> {
    let p = path.display().to_string();
    let body = ceph_client::admin_socket::command(path, COMMAND, Duration::from_secs(10))
        .map_err(|e| AsokError::Io(p.clone(), e))?;
    avgcount(&String::from_utf8_lossy(&body), "reply").ok_or(AsokError::NoCounter(p))
}

/// `"<counter>": { "avgcount": N, ... }` → N.
fn avgcount(json: &str, counter: &str) -> Option<u64> {
    let key = format!("\"{counter}\"");
    let rest = &json[json.find(&key)? + key.len()..];
    let rest = &rest[rest.find("\"avgcount\"")? + "\"avgcount\"".len()..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pacific_perf_dump() {
        let j = "{\n    \"client\": {\n        \"reply\": {\n            \"avgcount\": 1234,\n            \"sum\": 0.000614558,\n            \"avgtime\": 0.000614558\n        }\n    }\n}\n";
        assert_eq!(avgcount(j, "reply"), Some(1234));
        assert_eq!(avgcount(j, "lat"), None);
        assert_eq!(avgcount("{\"reply\": {\"avgcount\": x}}", "reply"), None);
    }
}
