//! A libcephfs client's admin socket: the commands `ceph --admin-daemon PATH ...` sends
//! (`perf dump`, `mds_sessions`, `mds_requests`, `objecter_requests`, ...), spoken directly.
//!
//! libcephfs serves the socket when its `admin_socket` option names a path. Protocol: the
//! command is a JSON object ended by a NUL byte; the answer is a 4-byte big-endian length and
//! that many bytes (JSON). Talking to the socket takes about a millisecond, where the `ceph`
//! command line tool takes seconds to start.
//!
//! The socket also answers `config show`, which includes secrets: keep its directory private.
//!
//! [`command`] blocks; [`command_async`] (feature `tokio`) is the same exchange for a caller on
//! a tokio runtime. This module knows the protocol only, not what an answer means.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Largest answer read (a `mds_requests` dump of many requests stays far below); a longer one
/// is refused with `InvalidData`.
pub const MAX_ANSWER: u32 = 16 << 20;

/// The bytes of one command: its JSON and the NUL that ends it.
fn request(command: &str) -> io::Result<Vec<u8>> {
    if command.as_bytes().contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an admin socket command cannot contain a NUL byte",
        ));
    }
    let mut bytes = Vec::with_capacity(command.len().saturating_add(1));
    bytes.extend_from_slice(command.as_bytes());
    bytes.push(0);
    Ok(bytes)
}

/// The answer's length from its big-endian prefix.
fn answer_len(prefix: [u8; 4]) -> io::Result<usize> {
    let len = u32::from_be_bytes(prefix);
    if len > MAX_ANSWER {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("admin socket answer of {len} bytes is too large"),
        ));
    }
    usize::try_from(len).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Send `command` (a JSON object, e.g. `{"prefix": "mds_requests"}`) to the admin socket at
/// `path` and return the answer's bytes. Each wait on the socket lasts at most `timeout` (not
/// zero); running out of it is `TimedOut`.
pub fn command(path: &Path, command: &str, timeout: Duration) -> io::Result<Vec<u8>> {
    let request = request(command)?;
    let mut stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let exchange = |stream: &mut UnixStream| -> io::Result<Vec<u8>> {
        stream.write_all(&request)?;
        let mut len = [0u8; 4];
        stream.read_exact(&mut len)?;
        let mut body = vec![0u8; answer_len(len)?];
        stream.read_exact(&mut body)?;
        Ok(body)
    };
    // A socket timeout is EAGAIN; say what it means, as `command_async` does.
    exchange(&mut stream).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock => io::Error::from(io::ErrorKind::TimedOut),
        _ => e,
    })
}

/// [`command`] on a tokio runtime: the whole exchange lasts at most `timeout`.
#[cfg(feature = "tokio")]
pub async fn command_async(path: &Path, command: &str, timeout: Duration) -> io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let request = request(command)?;
    let exchange = async {
        let mut stream = tokio::net::UnixStream::connect(path).await?;
        stream.write_all(&request).await?;
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).await?;
        let mut body = vec![0u8; answer_len(len)?];
        stream.read_exact(&mut body).await?;
        Ok(body)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::from(io::ErrorKind::TimedOut)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::path::PathBuf;

    /// A fake admin socket in a fresh directory: answers each connection with what `answer`
    /// makes of the command it read (the bytes before the NUL); `None` answers nothing and
    /// holds the connection until the client goes.
    struct Fake {
        dir: PathBuf,
        path: PathBuf,
        thread: Option<std::thread::JoinHandle<Vec<String>>>,
    }

    impl Fake {
        fn start(name: &str, connections: usize, answer: fn(&str) -> Option<Vec<u8>>) -> Fake {
            let dir = std::env::temp_dir()
                .join(format!("ceph-client-asok-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("client.asok");
            let listener = UnixListener::bind(&path).unwrap();
            let thread = std::thread::spawn(move || {
                let mut seen = Vec::new();
                for _ in 0..connections {
                    let (mut s, _) = listener.accept().unwrap();
                    let mut command = Vec::new();
                    let mut byte = [0u8; 1];
                    while s.read_exact(&mut byte).is_ok() && byte[0] != 0 {
                        command.push(byte[0]);
                    }
                    let command = String::from_utf8(command).unwrap();
                    match answer(&command) {
                        Some(a) => {
                            let _ = s.write_all(&a);
                        }
                        None => {
                            let _ = s.read(&mut byte);
                        }
                    }
                    seen.push(command);
                }
                seen
            });
            Fake {
                dir,
                path,
                thread: Some(thread),
            }
        }

        /// The commands the fake received.
        fn finish(mut self) -> Vec<String> {
            self.thread.take().unwrap().join().unwrap()
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut v = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    const LONG: Duration = Duration::from_secs(10);

    #[test]
    fn sends_the_command_and_reads_the_framed_answer() {
        let fake = Fake::start("answer", 2, |c| {
            Some(framed(format!("{{\"echo\": {c}}}").as_bytes()))
        });
        let answer = command(&fake.path, r#"{"prefix": "perf dump"}"#, LONG).unwrap();
        assert_eq!(answer, br#"{"echo": {"prefix": "perf dump"}}"#);
        let empty = command(&fake.path, "{}", LONG).unwrap();
        assert_eq!(empty, b"{\"echo\": {}}");
        assert_eq!(fake.finish(), [r#"{"prefix": "perf dump"}"#, "{}"]);
    }

    #[test]
    fn refuses_what_is_not_the_protocol() {
        let fake = Fake::start("refuse", 2, |c| {
            Some(match c {
                "big" => (MAX_ANSWER + 1).to_be_bytes().to_vec(),
                // Shorter than announced: the socket closes mid-answer.
                _ => {
                    let mut v = 100u32.to_be_bytes().to_vec();
                    v.extend_from_slice(b"{}");
                    v
                }
            })
        });
        let big = command(&fake.path, "big", LONG).unwrap_err();
        assert_eq!(big.kind(), io::ErrorKind::InvalidData, "{big}");
        let short = command(&fake.path, "short", LONG).unwrap_err();
        assert_eq!(short.kind(), io::ErrorKind::UnexpectedEof, "{short}");
        let nul = command(&fake.path, "a\0b", LONG).unwrap_err();
        assert_eq!(nul.kind(), io::ErrorKind::InvalidInput);
        let missing = command(&fake.dir.join("none.asok"), "{}", LONG).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        assert_eq!(fake.finish(), ["big", "short"]);
    }

    #[test]
    fn a_silent_socket_times_out() {
        let fake = Fake::start("silent", 1, |_| None);
        let e = command(&fake.path, "{}", Duration::from_millis(50)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        fake.finish();
    }

    #[cfg(feature = "tokio")]
    #[test]
    fn the_async_exchange_is_the_same() {
        let fake = Fake::start("async", 2, |c| match c {
            "{}" => Some(framed(b"{\"ok\": 1}")),
            _ => None,
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answer = rt.block_on(command_async(&fake.path, "{}", LONG)).unwrap();
        assert_eq!(answer, b"{\"ok\": 1}");
        let silent = rt
            .block_on(command_async(&fake.path, "wait", Duration::from_millis(50)))
            .unwrap_err();
        assert_eq!(silent.kind(), io::ErrorKind::TimedOut);
        fake.finish();
    }
}
