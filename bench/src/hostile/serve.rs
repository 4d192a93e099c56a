//! `hostile serve`: a line protocol on stdin/stdout, so a test (or a person) can send any
//! request or chain and see exactly what came back. One command per line, one answer line:
//!
//! - `fuse Q LEN HEX`: HEX readable on queue Q (0 hiprio, 1 request), LEN writable bytes (0:
//!   no writable descriptor).
//! - `chain Q TOKEN...`: a hand-built chain, one token per descriptor, in chain order:
//!   `r:HEX` readable bytes, `w:LEN` writable bytes, `x:ADDR:LEN` a readable descriptor at a
//!   raw guest address, `xw:ADDR:LEN` the same marked writable; `[` ... `]` wrap descriptors
//!   into an indirect table. ADDR is a number (0x.. allowed), `oob` (past the end of guest
//!   memory) or `edge` (straddling the end). Any token may end in `/n=K` (next = K-th
//!   descriptor of the chain, sets NEXT: `/n=0` on the last one makes a loop; K >= 1024 is
//!   written as is, outside the table) and `/f=F` (exactly these flags).
//! - `oracle INO`: `inside`, `gone`, or `outside WHY`.
//! - `alive`: `alive` when a GETATTR of node 1 is answered correctly, else `dead`.
//! - `timeout MS`: how long to wait for a chain from now on.
//! - `export`: the export root's inode number (`export 0x...`); `mem`: guest memory bytes.
//! - `settle Q MS`: wait up to MS for the chains of queue Q still out (answered `lost`) to come
//!   back: `settled OUT HEX...`, OUT still out, then the reply of each chain that came back
//!   late since the last `settle` (`-` for an empty one), in the order they came back.
//!
//! Answers to `fuse` and `chain`: `done WRITTEN HEX [outside=INO,...]`, `lost`, or `bogus ID`;
//! `error MSG` for a command that could not be carried out. With an oracle, every node id or
//! inode number in a reply to an entry- or attr-returning opcode is judged, and the outside
//! ones listed.

use std::io::{BufRead, Write};
use std::time::Duration;

use super::device::{Buf, DescSpec};
use super::oracle::{Oracle, Verdict};
use super::session::{Answer, Session};
use super::wire;

fn num(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn parse_token(tok: &str, mem: u64) -> Result<DescSpec, String> {
    let mut parts = tok.split('/');
    let body = parts.next().unwrap_or("");
    let addr = |a: &str, len: u32| -> Result<u64, String> {
        match a {
            "oob" => Ok(mem + 4096),
            "edge" => Ok(mem.saturating_sub(u64::from(len / 2).max(1))),
            _ => num(a).ok_or_else(|| format!("bad address {a}")),
        }
    };
    let buf = match body.split(':').collect::<Vec<_>>().as_slice() {
        ["r", h] => Buf::Read(wire::unhex(h).ok_or_else(|| format!("bad hex in {tok}"))?),
        ["w", n] => Buf::Write(
            num(n)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or("bad length")?,
        ),
        [k @ ("x" | "xw"), a, n] => {
            let len = num(n)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or("bad length")?;
            let b = Buf::Raw {
                addr: addr(a, len)?,
                len,
            };
            let mut d = DescSpec::new(b);
            if *k == "xw" {
                d.flags = Some(super::device::VIRTQ_DESC_F_WRITE);
            }
            return apply(d, parts);
        }
        _ => return Err(format!("unknown token {tok}")),
    };
    apply(DescSpec::new(buf), parts)
}

fn apply<'a>(mut d: DescSpec, opts: impl Iterator<Item = &'a str>) -> Result<DescSpec, String> {
    let write_bit = d.flags.unwrap_or(0) & super::device::VIRTQ_DESC_F_WRITE;
    for o in opts {
        if let Some(n) = o.strip_prefix("n=") {
            d.next = Some(
                num(n)
                    .and_then(|n| u16::try_from(n).ok())
                    .ok_or("bad next")?,
            );
            if write_bit != 0 && d.flags.is_some() {
                d.flags = Some(write_bit | super::device::VIRTQ_DESC_F_NEXT);
            }
        } else if let Some(f) = o.strip_prefix("f=") {
            d.flags = Some(
                num(f)
                    .and_then(|n| u16::try_from(n).ok())
                    .ok_or("bad flags")?,
            );
        } else {
            return Err(format!("unknown option {o}"));
        }
    }
    Ok(d)
}

/// Parse the chain tokens (with `[` `]` for an indirect table).
pub fn parse_chain(tokens: &[&str], mem: u64) -> Result<Vec<DescSpec>, String> {
    let mut out = Vec::new();
    let mut inner: Option<Vec<DescSpec>> = None;
    for t in tokens {
        if *t == "[" {
            if inner.is_some() {
                return Err("nested indirect tables".into());
            }
            inner = Some(Vec::new());
        } else if let Some(rest) = t.strip_prefix(']') {
            let descs = inner.take().ok_or("] without [")?;
            let d = apply(DescSpec::new(Buf::Indirect(descs)), rest.split('/').skip(1))?;
            out.push(d);
        } else {
            let d = parse_token(t, mem)?;
            match &mut inner {
                Some(v) => v.push(d),
                None => out.push(d),
            }
        }
    }
    if inner.is_some() {
        return Err("[ without ]".into());
    }
    Ok(out)
}

/// The first readable bytes of a chain (the request header, for the oracle).
fn request_bytes(descs: &[DescSpec]) -> Option<&[u8]> {
    descs.iter().find_map(|d| match &d.buf {
        Buf::Read(b) => Some(&b[..]),
        Buf::Indirect(v) => v.iter().find_map(|d| match &d.buf {
            Buf::Read(b) => Some(&b[..]),
            _ => None,
        }),
        _ => None,
    })
}

fn judge(oracle: &mut Option<Oracle>, req: Option<&[u8]>, reply: &[u8]) -> String {
    let (Some(o), Some(req)) = (oracle.as_mut(), req) else {
        return String::new();
    };
    let Some((_, opcode, _, _)) = wire::in_header(req) else {
        return String::new();
    };
    o.stale();
    let out: Vec<String> = wire::handed_out(opcode, reply)
        .into_iter()
        .filter(|&(_, ino)| matches!(o.check(ino), Verdict::Outside(_)))
        .map(|(_, ino)| format!("{ino:#x}"))
        .collect();
    if out.is_empty() {
        String::new()
    } else {
        format!(" outside={}", out.join(","))
    }
}

fn answer(a: &Answer, extra: String) -> String {
    match a {
        Answer::Done { written, reply } => format!("done {written} {}{extra}", wire::hex(reply)),
        Answer::Lost => "lost".into(),
        Answer::Bogus(id) => format!("bogus {id}"),
    }
}

fn command(s: &mut Session, oracle: &mut Option<Oracle>, line: &str) -> Result<String, String> {
    let toks: Vec<&str> = line.split_whitespace().collect();
    let queue = |t: Option<&&str>| -> Result<usize, String> {
        match t.and_then(|q| q.parse::<usize>().ok()) {
            Some(q) if q < s.dev.queues.len() => Ok(q),
            _ => Err("queue must be 0 (hiprio) or 1 (request)".into()),
        }
    };
    match toks.first().copied() {
        Some("fuse") => {
            let q = queue(toks.get(1))?;
            let len = toks
                .get(2)
                .and_then(|n| num(n))
                .and_then(|n| u32::try_from(n).ok())
                .ok_or("fuse Q LEN HEX")?;
            let req = wire::unhex(toks.get(3).copied().unwrap_or("")).ok_or("bad hex")?;
            let a = s.send(q, &req, len).map_err(|e| e.to_string())?;
            let extra = match &a {
                Answer::Done { reply, .. } => judge(oracle, Some(&req), reply),
                _ => String::new(),
            };
            Ok(answer(&a, extra))
        }
        Some("chain") => {
            let q = queue(toks.get(1))?;
            let descs = parse_chain(toks.get(2..).unwrap_or(&[]), s.dev.mem_size)?;
            let a = s.chain(q, &descs).map_err(|e| e.to_string())?;
            let extra = match &a {
                Answer::Done { reply, .. } => judge(oracle, request_bytes(&descs), reply),
                _ => String::new(),
            };
            Ok(answer(&a, extra))
        }
        Some("oracle") => {
            let o = oracle
                .as_mut()
                .ok_or("no oracle: give --ceph-conf and --export")?;
            let ino = toks.get(1).and_then(|n| num(n)).ok_or("oracle INO")?;
            o.stale();
            Ok(match o.check(ino) {
                Verdict::Inside => "inside".into(),
                Verdict::Gone => "gone".into(),
                Verdict::Outside(why) => format!("outside {why}"),
            })
        }
        Some("alive") => Ok(if s.alive().map_err(|e| e.to_string())? {
            "alive".into()
        } else {
            "dead".into()
        }),
        Some("timeout") => {
            let ms = toks.get(1).and_then(|n| num(n)).ok_or("timeout MS")?;
            s.timeout = Duration::from_millis(ms);
            Ok("ok".into())
        }
        Some("export") => {
            let o = oracle
                .as_ref()
                .ok_or("no oracle: give --ceph-conf and --export")?;
            Ok(format!("export {:#x}", o.export_ino()))
        }
        Some("mem") => Ok(format!("mem {}", s.dev.mem_size)),
        Some("settle") => {
            let q = queue(toks.get(1))?;
            let ms = toks.get(2).and_then(|n| num(n)).ok_or("settle Q MS")?;
            let (out, late) = s
                .settle(q, Duration::from_millis(ms))
                .map_err(|e| e.to_string())?;
            let mut line = format!("settled {out}");
            for r in late {
                line.push(' ');
                if r.is_empty() {
                    line.push('-');
                } else {
                    line.push_str(&wire::hex(&r));
                }
            }
            Ok(line)
        }
        _ => Err(format!("unknown command: {line}")),
    }
}

/// Serve commands from stdin until it closes.
pub fn run(mut s: Session, mut oracle: Option<Oracle>) -> std::io::Result<()> {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {}", s.dev.mem_size)?;
    out.flush()?;
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let a = command(&mut s, &mut oracle, &line).unwrap_or_else(|e| format!("error {e}"));
        writeln!(out, "{a}")?;
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_tokens_parse() {
        let c = parse_chain(
            &["r:0a0b", "w:16/n=0", "x:oob:8", "[", "r:01", "]/f=4"],
            1 << 20,
        )
        .expect("parse");
        assert_eq!(c.len(), 4);
        assert_eq!(c[0].buf, Buf::Read(vec![10, 11]));
        assert_eq!(c[1].next, Some(0));
        assert_eq!(
            c[2].buf,
            Buf::Raw {
                addr: (1 << 20) + 4096,
                len: 8
            }
        );
        assert!(matches!(&c[3].buf, Buf::Indirect(v) if v.len() == 1));
        assert_eq!(c[3].flags, Some(4));
        assert!(parse_chain(&["["], 0).is_err());
        assert!(parse_chain(&["q:1"], 0).is_err());
    }
}
