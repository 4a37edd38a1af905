//! Speaking to a member below the client libraries: raw TCP, raw HTTP/2
//! (h2), hand-made gRPC frames and HTTP/1.1 bodies sent a byte at a time —
//! what a hostile or broken client can send that no well-behaved library
//! would.
//!
//! Every call here is bounded in time (`within`): a member that stops
//! answering is an outcome to report, never a hung suite.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How a raw gRPC call ended: its `grpc-status` and `grpc-message` (from
/// the headers of a trailers-only answer, or from the trailers), or the
/// HTTP/2 error that ended the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrpcEnd {
    Status { code: i32, message: String },
    Reset(String),
}

impl std::fmt::Display for GrpcEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrpcEnd::Status { code, message } => write!(f, "grpc-status {code} \"{message}\""),
            GrpcEnd::Reset(e) => write!(f, "stream ended: {e}"),
        }
    }
}

/// A gRPC frame: uncompressed, `message` behind its 4-byte length.
pub fn grpc_frame(message: &[u8]) -> Vec<u8> {
    let mut frame = vec![0u8];
    frame.extend((message.len() as u32).to_be_bytes());
    frame.extend(message);
    frame
}

/// A protobuf `bytes` field `field` holding `data` (what a `RaftPayload`
/// is, as field 1).
pub fn proto_bytes(field: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, u64::from(field << 3 | 2));
    put_varint(&mut out, data.len() as u64);
    out.extend(data);
    out
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// An HTTP/2 connection to `addr` (plaintext, prior knowledge, as gRPC).
pub async fn h2_connect(addr: &str, window: u32) -> anyhow::Result<h2::client::SendRequest<Bytes>> {
    Ok(h2_connect_owned(addr, window).await?.0)
}

/// An HTTP/2 connection to `addr`, and the task that drives it: it ends
/// with how the connection ended (a GOAWAY's reason, for one).
pub async fn h2_connect_owned(
    addr: &str,
    window: u32,
) -> anyhow::Result<(h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<Result<(), h2::Error>>)> {
    let tcp = TcpStream::connect(addr).await?;
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .initial_connection_window_size(window.max(65_535))
        // An attacker reads little of what it is sent: without this, h2's
        // own guard against buffered small DATA frames would end this
        // side's connection, not the member's.
        .data_frame_budget(1 << 40)
        .handshake(tcp)
        .await?;
    Ok((client, tokio::spawn(connection)))
}

/// Counts the gRPC messages in a stream's DATA, however its chunks cut
/// them (each message is a 5-byte prefix, then as many bytes as the
/// prefix's length says).
#[derive(Default)]
pub struct GrpcMessages {
    count: usize,
    /// Bytes still to come of the message being read, or of its prefix.
    pending: usize,
    /// The prefix read so far, while it is cut.
    prefix: Vec<u8>,
}

impl GrpcMessages {
    pub fn push(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            if self.pending > 0 {
                let taken = self.pending.min(chunk.len());
                self.pending -= taken;
                chunk = &chunk[taken..];
                continue;
            }
            let taken = (5 - self.prefix.len()).min(chunk.len());
            self.prefix.extend(&chunk[..taken]);
            chunk = &chunk[taken..];
            if self.prefix.len() == 5 {
                self.pending = u32::from_be_bytes(self.prefix[1..5].try_into().expect("4 bytes")) as usize;
                self.prefix.clear();
                self.count += 1;
            }
        }
    }

    /// Messages whose prefix has come.
    pub fn count(&self) -> usize {
        self.count
    }
}

/// A gRPC request's headers for `path`, with `metadata` added.
pub fn grpc_request(addr: &str, path: &str, metadata: &[(&str, String)]) -> http::Request<()> {
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in metadata {
        req = req.header(*name, value.as_str());
    }
    req.body(()).expect("a well-formed request")
}

/// One unary gRPC call of `path` whose body is `body` (any bytes: a frame
/// of garbage, a frame that lies about its length…), read to its end.
pub async fn grpc_call(
    addr: &str,
    path: &str,
    metadata: &[(&str, String)],
    body: Vec<u8>,
    within: Duration,
) -> anyhow::Result<GrpcEnd> {
    let call = async {
        let client = h2_connect(addr, 1 << 20).await?;
        let mut client = client.ready().await?;
        let (answer, mut send) = client.send_request(grpc_request(addr, path, metadata), false)?;
        send.send_data(Bytes::from(body), true)?;
        let answer = match answer.await {
            Ok(a) => a,
            Err(e) => return Ok(GrpcEnd::Reset(e.to_string())),
        };
        Ok::<_, anyhow::Error>(read_grpc_end(answer).await)
    };
    tokio::time::timeout(within, call).await.map_err(|_| anyhow::anyhow!("no answer within {within:?}"))?
}

/// Read an answer to its end and say how the call ended.
pub async fn read_grpc_end(answer: http::Response<h2::RecvStream>) -> GrpcEnd {
    let (parts, mut body) = answer.into_parts();
    if let Some(end) = status_of(&parts.headers) {
        return end;
    }
    while let Some(chunk) = body.data().await {
        match chunk {
            Ok(chunk) => {
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            Err(e) => return GrpcEnd::Reset(e.to_string()),
        }
    }
    match body.trailers().await {
        Ok(Some(trailers)) => {
            status_of(&trailers).unwrap_or_else(|| GrpcEnd::Reset("trailers without grpc-status".into()))
        }
        Ok(None) => GrpcEnd::Reset("no trailers".into()),
        Err(e) => GrpcEnd::Reset(e.to_string()),
    }
}

fn status_of(headers: &http::HeaderMap) -> Option<GrpcEnd> {
    let code = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .map(|m| m.replace("%20", " ").replace("%3A", ":"))
        .unwrap_or_default();
    Some(GrpcEnd::Status { code, message })
}

/// Send `bytes` to `addr` on a fresh TCP connection and read whatever comes
/// back until the member closes it or `within` passes; how many bytes came
/// back.
pub async fn send_raw(addr: &str, bytes: &[u8], within: Duration) -> anyhow::Result<usize> {
    let talk = async {
        let mut tcp = TcpStream::connect(addr).await?;
        // The member may close as soon as it sees garbage: a write after
        // that fails, which is an answer too.
        let _ = tcp.write_all(bytes).await;
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer).await;
        Ok::<_, anyhow::Error>(answer.len())
    };
    match tokio::time::timeout(within, talk).await {
        Ok(read) => read,
        // Still open: the member waits for more, which is fine.
        Err(_) => Ok(0),
    }
}

/// The HTTP/2 connection preface a client sends first.
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// An HTTP/1.1 POST of `path` to the gateway whose chunked body is `body`,
/// one byte per chunk, written as fast as the member reads; the first line
/// of the answer's body (a streaming call's first message, which comes
/// once the member has parsed the request), if one came within `within`.
pub async fn post_bytewise(addr: &str, path: &str, body: &[u8], within: Duration) -> anyhow::Result<Option<String>> {
    let talk = async {
        let mut tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).await?;
        // A chunk per byte, written in large writes: the member's HTTP
        // parser sees each chunk as a frame of its own.
        for piece in body.chunks(4096) {
            let mut out = Vec::with_capacity(piece.len() * 6);
            for b in piece {
                out.extend(b"1\r\n");
                out.push(*b);
                out.extend(b"\r\n");
            }
            tcp.write_all(&out).await?;
        }
        tcp.write_all(b"0\r\n\r\n").await?;
        let mut answer = Vec::new();
        let mut buf = vec![0u8; 4096];
        loop {
            let n = tcp.read(&mut buf).await?;
            if n == 0 {
                return Ok(None);
            }
            answer.extend(&buf[..n]);
            let text = String::from_utf8_lossy(&answer);
            if let Some(line) = text.lines().find(|l| l.starts_with("{\"result\"") || l.starts_with("{\"error\"")) {
                return Ok::<_, anyhow::Error>(Some(line.to_string()));
            }
        }
    };
    match tokio::time::timeout(within, talk).await {
        Ok(answer) => answer,
        Err(_) => Ok(None),
    }
}

/// An HTTP/1.1 POST of `body` to `path`, read to its end: the status line
/// and what follows the headers.
pub async fn http_post(addr: &str, path: &str, body: &[u8], within: Duration) -> anyhow::Result<(String, String)> {
    let talk = async {
        let mut tcp = TcpStream::connect(addr).await?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n",
            body.len()
        );
        tcp.write_all(head.as_bytes()).await?;
        tcp.write_all(body).await?;
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer).await?;
        let text = String::from_utf8_lossy(&answer).to_string();
        let status = text.lines().next().unwrap_or_default().to_string();
        let rest = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Ok::<_, anyhow::Error>((status, rest))
    };
    tokio::time::timeout(within, talk).await.map_err(|_| anyhow::anyhow!("no answer within {within:?}"))?
}

/// CPU seconds (user and system) process `pid` has used so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which ends at the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let (utime, stime): (f64, f64) = (fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?);
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((utime + stime) / ticks)
}

/// The peak resident memory of process `pid`, in bytes (`VmHWM`).
pub fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
