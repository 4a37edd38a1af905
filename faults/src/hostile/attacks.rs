//! The attacks, each an `async` function of the cluster under attack that
//! answers what it saw, or why the member's answer was not the one
//! expected. The checks every attack is followed by are the suite's
//! (`hostile::Target::still_serving`).

use std::time::{Duration, Instant};

use etcd_client::{Error, GetOptions, LeaderKey, ProclaimOptions, Txn, TxnOp, WatchOptions};
use futures::future::BoxFuture;

use super::raw::{self, GrpcEnd};
use super::Target;

type Attack = for<'a> fn(&'a mut Target) -> BoxFuture<'a, anyhow::Result<String>>;

/// Every attack, in the order the suite runs them (those that turn auth on
/// last: it stays on).
pub const ALL: &[(&str, Attack)] = &[
    ("txn-response-limit", txn_response_limit),
    ("nested-and-wide-txns", nested_and_wide_txns),
    ("maximal-requests", maximal_requests),
    ("garbage-on-client-port", garbage_on_client_port),
    ("gateway-bytewise", gateway_bytewise),
    ("stream-flood", stream_flood),
    ("slowloris", slowloris),
    ("slow-watcher", slow_watcher),
    ("range-watch-flood", range_watch_flood),
    ("watch-create-pipeline", watch_create_pipeline),
    ("proclaim-hijack", proclaim_hijack),
    ("lock-api-abuse", lock_api_abuse),
    ("lock-delay-abuse", lock_delay_abuse),
    ("peer-garbage", peer_garbage),
    ("auth-flood", auth_flood),
];

/// 64 KiB of bytes with no structure, the same every run (a multiplicative
/// hash of the position with an odd `multiplier`).
fn noise(multiplier: u32) -> Vec<u8> {
    (0..65_536u32).map(|i| (i.wrapping_mul(multiplier) >> 13) as u8).collect()
}

/// The gRPC code and message of a client error.
fn status(e: &Error) -> (tonic::Code, String) {
    match e {
        Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => (tonic::Code::Unknown, other.to_string()),
    }
}

/// That `result` failed with `code` and a message containing `words`.
fn expect_refusal<T>(what: &str, result: Result<T, Error>, code: tonic::Code, words: &str) -> anyhow::Result<String> {
    match result {
        Ok(_) => anyhow::bail!("{what}: served, expected {code:?} \"{words}\""),
        Err(e) => {
            let (got, message) = status(&e);
            anyhow::ensure!(
                got == code && message.contains(words),
                "{what}: got {got:?} \"{message}\", expected {code:?} \"{words}\""
            );
            Ok(format!("{what}: {got:?} \"{message}\""))
        }
    }
}

/// 100 values of 1 MiB, then a txn of 127 ranges over all of them plus a
/// delete: 12.7 GB of answer, each range within the per-range limit. It
/// used to abort every member in apply, and again at every restart. Now the
/// txn is refused whole as too large; the same read-only txn is too; so
/// are three sorted ranges with a limit, and a deletion of 100 small keys
/// ahead of 126 ranges limited to 100 keys (weighed by the small keys, they
/// would answer the large ones: the deletion lets them in). Then every
/// member is killed and restarted and must come back with every key.
fn txn_response_limit(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    Box::pin(async move {
        let mut c = t.client(0).await?;
        let value = vec![b'v'; 1 << 20];
        for i in 0..100 {
            c.put(format!("/big/{i:03}"), value.clone(), None).await?;
        }
        let ranges =
            || (0..127).map(|_| TxnOp::get("/big/", Some(GetOptions::new().with_prefix()))).collect::<Vec<_>>();
        let mut poison = ranges();
        poison.push(TxnOp::delete("/big/000", None));
        let written = c.txn(Txn::new().and_then(poison)).await;
        let code = tonic::Code::ResourceExhausted;
        let mut seen = vec![expect_refusal("127 ranges and a delete", written, code, "range response is too large")?];
        let read = c.txn(Txn::new().and_then(ranges())).await;
        seen.push(expect_refusal("127 ranges alone", read, code, "range response is too large")?);
        // A sorted range with a limit is weighed by what it can return.
        let sorted = GetOptions::new()
            .with_prefix()
            .with_sort(etcd_client::SortTarget::Value, etcd_client::SortOrder::Descend)
            .with_limit(300);
        let sorted = (0..3).map(|_| TxnOp::get("/big/", Some(sorted.clone()))).collect::<Vec<_>>();
        let read = c.txn(Txn::new().and_then(sorted)).await;
        seen.push(expect_refusal("three sorted ranges", read, code, "range response is too large")?);
        // Small keys that sort first under /big/ ('!' < '0').
        let small = (0..100).map(|i| TxnOp::put(format!("/big/!{i:03}"), "s", None)).collect::<Vec<_>>();
        c.txn(Txn::new().and_then(small)).await?;
        let mut ahead = vec![TxnOp::delete("/big/!", Some(etcd_client::DeleteOptions::new().with_prefix()))];
        let first_100 = GetOptions::new().with_prefix().with_limit(100);
        ahead.extend((0..126).map(|_| TxnOp::get("/big/", Some(first_100.clone()))));
        let written = c.txn(Txn::new().and_then(ahead)).await;
        let what = "a deletion ahead of 126 limited ranges";
        seen.push(expect_refusal(what, written, code, "range response is too large")?);
        t.restart_all().await?;
        let kept = t.count(1, "/big/").await?;
        anyhow::ensure!(kept == 200, "{kept} keys under /big/ after the restart, expected 200");
        Ok(format!("{}; every member restarted and serves, 200 keys kept", seen.join("; ")))
    })
}

/// Txns nested deeper than anything a client library makes, and wider than
/// etcd's 128 operations.
fn nested_and_wide_txns(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    Box::pin(async move {
        let mut c = t.client(1).await?;
        let mut txn = Txn::new().and_then([TxnOp::put("/nested", "x", None)]);
        for _ in 0..200 {
            txn = Txn::new().and_then([TxnOp::txn(txn)]);
        }
        let deep = match c.txn(txn).await {
            Ok(_) => anyhow::bail!("a txn nested 200 deep was served"),
            Err(e) => format!("200 deep: {:?}", status(&e).0),
        };
        let wide =
            Txn::new().and_then((0..129).map(|i| TxnOp::put(format!("/wide/{i}"), "x", None)).collect::<Vec<_>>());
        let wide = c.txn(wide).await;
        let wide = expect_refusal("129 ops", wide, tonic::Code::InvalidArgument, "too many operations in txn request")?;
        Ok(format!("{deep}; {wide}"))
    })
}

/// The largest of everything: values at and past the request limit, an
/// empty key, the largest TTL, a future revision, a huge limit.
fn maximal_requests(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    Box::pin(async move {
        let mut c = t.client(2).await?;
        c.put("/max/at-limit", vec![b'x'; (3 << 19) - 64], None).await?;
        let mut seen = vec!["a put at the limit: served".to_string()];
        let over = c.put("/max/over", vec![b'x'; (3 << 19) + 1], None).await;
        seen.push(expect_refusal("a put over 1.5 MiB", over, tonic::Code::InvalidArgument, "request is too large")?);
        let huge = c.put("/max/huge", vec![b'x'; 3 << 20], None).await;
        let huge =
            expect_refusal("a 3 MiB put", huge, tonic::Code::ResourceExhausted, "received message larger than max");
        seen.push(huge?);
        let empty = c.put("", "x", None).await;
        seen.push(expect_refusal("an empty key", empty, tonic::Code::InvalidArgument, "key is not provided")?);
        let ttl = c.lease_grant(i64::MAX, None).await;
        seen.push(expect_refusal("TTL i64::MAX", ttl, tonic::Code::OutOfRange, "too large lease TTL")?);
        let future = c.get("/max/", Some(GetOptions::new().with_revision(i64::MAX))).await;
        seen.push(expect_refusal("revision i64::MAX", future, tonic::Code::OutOfRange, "future revision")?);
        let limit = c.get("/max/", Some(GetOptions::new().with_prefix().with_limit(i64::MAX))).await?;
        anyhow::ensure!(limit.kvs().len() == 1, "limit i64::MAX: {} keys", limit.kvs().len());
        seen.push("limit i64::MAX: served".into());
        Ok(seen.join("; "))
    })
}

/// The native lock API asked for what it must refuse or bound: oversized
/// and malformed multi-locks, Validate of a key that names no lock, Observe
/// from absurd revisions, and a thousand Observe streams on one lock opened
/// and dropped; the lock still works after.
fn lock_api_abuse(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    use raftlock::proto::raftlock::v1 as pb;
    Box::pin(async move {
        let mut locks = t.locks_client(1).await?;
        let mut c = t.client(1).await?;
        let lease = c.lease_grant(30, None).await?.id();
        let spec = |name: String| pb::LockSpec { name: name.into_bytes(), ..Default::default() };
        let acquire = |specs: Vec<pb::LockSpec>| pb::AcquireRequest { lease, locks: specs, ..Default::default() };
        let refused = |what: &str, r: Result<tonic::Response<pb::AcquireResponse>, tonic::Status>, words: &str| match r
        {
            Err(s) if s.code() == tonic::Code::InvalidArgument && s.message().contains(words) => {
                Ok(format!("{what}: InvalidArgument {:?}", s.message()))
            }
            other => Err(anyhow::anyhow!("{what}: expected InvalidArgument ({words}), got {other:?}")),
        };
        let mut seen = Vec::new();
        let many = (0..65).map(|i| spec(format!("abuse/{i}"))).collect();
        seen.push(refused("65 locks", locks.acquire(acquire(many)).await, "at most 64")?);
        let nested = vec![spec("abuse/a".into()), spec("abuse/a/b".into())];
        seen.push(refused("nested locks", locks.acquire(acquire(nested)).await, "nested")?);
        let twice = vec![spec("abuse/a".into()), spec("abuse/a".into())];
        seen.push(refused("a lock named twice", locks.acquire(acquire(twice)).await, "named twice")?);
        // 64 locks with names of 20 KiB: more than the grants handed back
        // to release them could carry.
        let wide = |bytes: usize| (0..64).map(|i| spec(format!("abuse/{i:02}/{}", "n".repeat(bytes)))).collect();
        seen.push(refused("64 names of 20 KiB", locks.acquire(acquire(wide(20 << 10))).await, "at most 524288 bytes")?);
        // 64 names of 8000 bytes: one txn of 64 puts and 192 reads, granted
        // at once, and released with the grants handed back whole.
        let granted = locks.acquire(acquire(wide(8000))).await?.into_inner();
        anyhow::ensure!(granted.acquired && granted.grants.len() == 64, "64 wide locks: {}", granted.grants.len());
        let release = pb::ReleaseRequest { grants: granted.grants, ..Default::default() };
        anyhow::ensure!(locks.release(release).await?.into_inner().released, "64 wide locks not released");
        seen.push("64 locks with 8000-byte names: granted, and released with the grants handed back".into());
        let bad = locks.validate(pb::ValidateRequest { key: vec![b'k'; 1 << 20], token: 1, permits: 1 }).await;
        match bad {
            // The answer names the key, cut short: a message travels in a header.
            Err(s) if s.code() == tonic::Code::InvalidArgument && s.message().len() < 256 => {
                seen.push(format!("Validate of a 1 MiB key with no '/': InvalidArgument {:?}", s.message()))
            }
            other => anyhow::bail!("Validate of a key with no '/': {other:?}"),
        }
        let observe = |start_revision| pb::ObserveRequest { name: b"abuse/o".to_vec(), permits: 1, start_revision };
        match locks.observe(observe(-1)).await {
            Err(s) if s.code() == tonic::Code::InvalidArgument => {}
            other => anyhow::bail!("Observe from revision -1: {:?}", other.map(|_| ())),
        }
        let mut far = locks.observe(observe(i64::MAX)).await?.into_inner();
        far.message().await?;
        seen.push("Observe from -1: InvalidArgument; from i64::MAX: served from now".into());
        // A thousand observers of one lock, then a grant they all see, then gone.
        let mut streams = Vec::new();
        for _ in 0..1000 {
            let mut s = locks.observe(observe(0)).await?.into_inner();
            s.message().await?;
            streams.push(s);
        }
        let one = pb::AcquireRequest { name: b"abuse/o".to_vec(), lease, ..Default::default() };
        anyhow::ensure!(locks.acquire(one).await?.into_inner().acquired, "the observed lock was not granted");
        let told = tokio::time::timeout(Duration::from_secs(30), async {
            for s in &mut streams {
                s.message().await?;
            }
            Ok::<_, tonic::Status>(())
        })
        .await;
        anyhow::ensure!(matches!(told, Ok(Ok(()))), "not every observer was told of the grant: {told:?}");
        drop(streams);
        c.lease_revoke(lease).await?;
        t.still_serving().await?;
        seen.push(format!("1000 observers of one lock all told of its grant; peak RSS {} MiB", t.peak_rss_mib()));
        Ok(seen.join("; "))
    })
}

/// Lock-delays asked for wrongly, and lock-delay keys written by hand in
/// bulk: out-of-range and non-exclusive delays are refused; 2,000 delay
/// settings ended by one lease revoke put 2,000 markers in one revision,
/// which the keeper ends over its ticks while the member keeps serving;
/// markers and settings with values that are no delay start nothing or are
/// cleared at once.
fn lock_delay_abuse(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    use etcd_client::{GetOptions, Txn, TxnOp};
    use raftlock::proto::raftlock::v1 as pb;
    Box::pin(async move {
        let mut locks = t.locks_client(1).await?;
        let mut c = t.client(1).await?;
        let lease = c.lease_grant(60, None).await?.id();
        let mut seen = Vec::new();
        for (what, req, words) in [
            (
                "lock_delay_ms u32::MAX",
                pb::AcquireRequest { lock_delay_ms: u32::MAX, ..Default::default() },
                "at most 60000",
            ),
            (
                "a lock-delay on a semaphore",
                pb::AcquireRequest { permits: 3, lock_delay_ms: 10, ..Default::default() },
                "exclusive",
            ),
            (
                "a lock-delay on a read lock",
                pb::AcquireRequest { mode: pb::Mode::Read.into(), lock_delay_ms: 10, ..Default::default() },
                "exclusive",
            ),
        ] {
            let req = pb::AcquireRequest { name: b"ld/x".to_vec(), lease, ..req };
            match locks.acquire(req).await {
                Err(s) if s.code() == tonic::Code::InvalidArgument && s.message().contains(words) => {
                    seen.push(format!("{what}: InvalidArgument"))
                }
                other => anyhow::bail!("{what}: expected InvalidArgument, got {other:?}"),
            }
        }
        // 2,000 owner keys with delay settings of 60 s on one lease, 100 per txn.
        const LOCKS: usize = 2000;
        for chunk in (0..LOCKS).collect::<Vec<_>>().chunks(50) {
            let puts = chunk.iter().flat_map(|i| {
                let put = |k: String, v: &str| TxnOp::put(k, v, Some(etcd_client::PutOptions::new().with_lease(lease)));
                [put(format!("ld/{i}/owner"), ""), put(format!("ld/{i}/owner.delay"), "60000")]
            });
            c.txn(Txn::new().and_then(puts.collect::<Vec<_>>())).await?;
        }
        // A setting that is no delay, and a marker written by hand with garbage.
        c.put("ld/odd/owner", "", None).await?;
        c.put("ld/odd/owner.delay", "99999999999", None).await?;
        c.delete("ld/odd/owner", None).await?;
        c.put("ld/garbage/.lock-delay", "not a delay", None).await?;
        let started = std::time::Instant::now();
        c.lease_revoke(lease).await?;
        let markers = |c: &mut etcd_client::Client| {
            let mut c = c.clone();
            async move {
                let r = c.get("ld/", Some(GetOptions::new().with_prefix().with_keys_only())).await?;
                Ok::<_, anyhow::Error>(
                    r.kvs()
                        .iter()
                        .filter(|kv| kv.key().ends_with(b"/.lock-delay"))
                        .map(|kv| kv.key().to_vec())
                        .collect::<Vec<_>>(),
                )
            }
        };
        // The garbage marker goes at the leader's next tick.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let now = loop {
            let now = markers(&mut c).await?;
            if !now.iter().any(|k| k.starts_with(b"ld/garbage/")) {
                break now;
            }
            anyhow::ensure!(std::time::Instant::now() < deadline, "a marker with garbage was not cleared within 5 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        anyhow::ensure!(now.len() == LOCKS, "{} markers after the revoke, expected {LOCKS}", now.len());
        anyhow::ensure!(!now.iter().any(|k| k.starts_with(b"ld/odd/")), "a setting of 99999999999 ms started a delay");
        t.still_serving().await?;
        seen.push(format!(
            "{LOCKS} delayed grants ended by one revoke: {LOCKS} markers in {} ms, member serving; a setting of \
             99999999999 ms started nothing; a hand-written garbage marker was cleared",
            started.elapsed().as_millis()
        ));
        // Deleting the markers by hand ends the delays.
        c.delete("ld/", Some(etcd_client::DeleteOptions::new().with_prefix())).await?;
        anyhow::ensure!(markers(&mut c).await?.is_empty(), "markers left after a delete");
        Ok(seen.join("; "))
    })
}

/// Bytes that are not HTTP/2, HTTP/2 that is not gRPC, and gRPC frames
/// that are not protobuf or lie about their length.
fn garbage_on_client_port(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    Box::pin(async move {
        let addr = t.client_addr(0);
        let within = Duration::from_secs(5);
        let noise = noise(2_654_435_761);
        raw::send_raw(&addr, &noise, within).await?;
        let mut frames = raw::H2_PREFACE.to_vec();
        frames.extend(&noise[..4096]);
        raw::send_raw(&addr, &frames, within).await?;
        let mut seen = Vec::new();
        let calls = [
            ("garbage protobuf", raw::grpc_frame(&noise[..512])),
            ("a frame that claims 1 GiB", {
                let mut f = vec![0u8];
                f.extend((1u32 << 30).to_be_bytes());
                f.extend(&noise[..64]);
                f
            }),
            ("a cut frame", raw::grpc_frame(&noise[..100])[..40].to_vec()),
            ("a compressed frame without an encoding", {
                let mut f = raw::grpc_frame(b"\x0a\x01k");
                f[0] = 1;
                f
            }),
        ];
        for (what, body) in calls {
            let end = raw::grpc_call(&addr, "/etcdserverpb.KV/Range", &[], body, within).await?;
            match &end {
                GrpcEnd::Status { code, .. } if *code != 0 => {}
                other => anyhow::bail!("{what}: {other}, expected an error status"),
            }
            seen.push(format!("{what}: {end}"));
        }
        // The gateway: JSON that is cut, that is not JSON, and whose fields
        // have the wrong types, each answered 400 with gRPC's code 3.
        for (what, body) in [
            ("cut JSON", &br#"{"key": "YQ==", "range_end": "#[..]),
            ("not JSON", &noise[..1024]),
            ("wrong types", &br#"{"key": 5, "limit": "many", "sort_order": [1]}"#[..]),
        ] {
            let (status, answer) = raw::http_post(&addr, "/v3/kv/range", body, within).await?;
            anyhow::ensure!(
                status.contains(" 400 ") && answer.contains("\"code\":3"),
                "gateway, {what}: {status} {answer}"
            );
            seen.push(format!("gateway, {what}: {status}"));
        }
        Ok(seen.join("; "))
    })
}

/// Streaming gateway requests sent a byte per HTTP chunk, each byte a `}`
/// inside a string: a parser that parses its buffer again at every `}`
/// spent quadratic time. The member must spend little CPU on it.
fn gateway_bytewise(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    Box::pin(async move {
        let addr = t.client_addr(1);
        let pid = t.pid(1);
        let mut seen = Vec::new();
        for path in ["/v3/watch", "/v3/lease/keepalive"] {
            // A request the gateway takes (an unknown field is ignored), so
            // that it answers once it has parsed it.
            let (open, close) = match path {
                "/v3/watch" => (r#"{"create_request": {"key": "a2V5", "junk": ""#, r#""}}"#),
                _ => (r#"{"ID": "1", "junk": ""#, r#""}"#),
            };
            let mut body = open.as_bytes().to_vec();
            body.extend(std::iter::repeat_n(b'}', 512 << 10));
            body.extend(close.as_bytes());
            let before = raw::cpu_seconds(pid).unwrap_or(0.0);
            let started = Instant::now();
            let answer = raw::post_bytewise(&addr, path, &body, Duration::from_secs(120)).await?;
            let cpu = raw::cpu_seconds(pid).unwrap_or(0.0) - before;
            let Some(answer) = answer else { anyhow::bail!("{path}: no answer to the request within 120 s") };
            anyhow::ensure!(cpu < 10.0, "{path}: the member spent {cpu:.1} s of CPU on a 512 KiB body");
            seen.push(format!(
                "{path}, 512 KiB a byte per chunk: {cpu:.2} s of the member's CPU, answered in {:.1} s with {}",
                started.elapsed().as_secs_f64(),
                answer.chars().take(60).collect::<String>()
            ));
        }
        Ok(seen.join("; "))
    })
}

/// Thousands of streams opened on one HTTP/2 connection, each a watch, and
/// left open: the member must hold them within its memory and go on
/// serving.
fn stream_flood(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    Box::pin(async move {
        let addr = t.client_addr(2);
        let mut client = raw::h2_connect(&addr, 65_535).await?;
        let mut open = Vec::new();
        let mut stopped = "all opened".to_string();
        for i in 0..5000 {
            let ready = tokio::time::timeout(Duration::from_secs(2), client.clone().ready()).await;
            let mut ready = match ready {
                Ok(Ok(ready)) => ready,
                Ok(Err(e)) => {
                    stopped = format!("after {i} streams the connection failed: {e}");
                    break;
                }
                Err(_) => {
                    stopped = format!("after {i} streams the member let no more be opened for 2 s");
                    break;
                }
            };
            let req = raw::grpc_request(&addr, "/etcdserverpb.Watch/Watch", &[]);
            let (answer, mut send) = match ready.send_request(req, false) {
                Ok(opened) => opened,
                Err(e) => {
                    stopped = format!("after {i} streams: {e}");
                    break;
                }
            };
            let create = raw::proto_bytes(1, format!("/flood/{i}").as_bytes());
            let _ = send.send_data(raw::grpc_frame(&raw::proto_bytes(1, &create)).into(), false);
            open.push((answer, send));
            client = ready;
            if i % 100 == 99 {
                // Let the member catch up now and then, as a client would.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let opened = open.len();
        // Each stream's answer begins once the member has set its watch up.
        let (answers, senders): (Vec<_>, Vec<_>) = open.into_iter().unzip();
        let set_up = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(answers)).await;
        let set_up = set_up.map_err(|_| anyhow::anyhow!("the member did not answer {opened} streams within 60 s"))?;
        let answered = set_up.iter().filter(|a| a.is_ok()).count();
        let first_error = set_up.iter().find_map(|a| a.as_ref().err()).map(|e| e.to_string());
        t.still_serving().await?;
        drop((set_up, senders));
        anyhow::ensure!(opened >= 1000, "only {opened} streams could be opened: {stopped}");
        Ok(format!(
            "{opened} watch streams opened on one connection, {answered} answered and held open ({}); peak RSS \
             of any member {} MiB",
            first_error.map_or("no stream refused".to_string(), |e| format!("the others: {e}")),
            t.peak_rss_mib()
        ))
    })
}

/// Hundreds of connections to both ports and to the gateway that send a
/// byte now and then and never finish a request.
fn slowloris(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    Box::pin(async move {
        use tokio::io::AsyncWriteExt;
        let mut trickles = Vec::new();
        let gateway_head = format!(
            "POST /v3/kv/put HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n",
            t.client_addr(0)
        );
        for i in 0..600 {
            let (addr, start): (String, Vec<u8>) = match i % 3 {
                0 => (t.client_addr(0), raw::H2_PREFACE.to_vec()),
                1 => (t.peer_addr(0), raw::H2_PREFACE.to_vec()),
                _ => (t.client_addr(0), gateway_head.clone().into_bytes()),
            };
            trickles.push(tokio::spawn(async move {
                let Ok(mut tcp) = tokio::net::TcpStream::connect(&addr).await else { return };
                for b in start.iter().chain(std::iter::repeat(&b' ')).take(60) {
                    if tcp.write_all(&[*b]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let during = t.still_serving().await;
        for trickle in &trickles {
            trickle.abort();
        }
        during?;
        Ok("600 connections trickling a byte every 500 ms (client, peer, gateway): members served meanwhile".into())
    })
}

/// A watcher whose HTTP/2 window is 1 KiB and who never reads, while
/// 64 MiB are written under its prefix: what the member holds for it must
/// stay bounded.
fn slow_watcher(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    Box::pin(async move {
        let addr = t.client_addr(0);
        let client = raw::h2_connect(&addr, 1024).await?;
        let mut client = client.ready().await?;
        let (_answer, mut send) =
            client.send_request(raw::grpc_request(&addr, "/etcdserverpb.Watch/Watch", &[]), false)?;
        // WatchRequest { create_request (1): WatchCreateRequest { key (1), range_end (2) } }
        let mut create = raw::proto_bytes(1, b"/slow/");
        create.extend(raw::proto_bytes(2, b"/slow0"));
        send.send_data(raw::grpc_frame(&raw::proto_bytes(1, &create)).into(), false)?;
        let mut c = t.client(0).await?;
        let value = vec![b's'; 1 << 20];
        for i in 0..64 {
            c.put(format!("/slow/{}", i % 8), value.clone(), None).await?;
        }
        t.still_serving().await?;
        drop(send);
        let mut cleanup = t.client(0).await?;
        cleanup.delete("/slow/", Some(etcd_client::DeleteOptions::new().with_prefix())).await?;
        Ok(format!("64 MiB written past a watcher that never reads; peak RSS of any member {} MiB", t.peak_rss_mib()))
    })
}

/// More distinct watched ranges that are neither keys nor prefixes than a
/// member routes, over as many streams as that takes: the ones past the cap
/// are refused with a reason, the others are routed. Each stream keeps at
/// most [`PIPELINE`] creates unanswered, as a careful client does: a client
/// that sends thousands of small messages faster than the member reads them
/// is `watch_create_pipeline`'s attack, not this one's.
fn range_watch_flood(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    Box::pin(async move {
        let mut c = t.client(1).await?;
        let range = |i: usize| (format!("/w/{i:06}"), format!("/w/{i:06}z"));
        let total = raftlock::MAX_WATCHED_RANGES + 200;
        let per_stream = raftlock::MAX_WATCHERS_PER_STREAM;
        let (mut created, mut refused, mut reason) = (0, 0, String::new());
        // The streams stay open (their watchers routed) to the end.
        let mut streams = Vec::new();
        for first in (0..total).step_by(per_stream) {
            let last = total.min(first + per_stream);
            let (key, end) = range(first);
            let mut stream = c.watch(key, Some(WatchOptions::new().with_range(end))).await?;
            let (mut next, mut answered) = (first + 1, 0);
            while answered < last - first {
                while next < last && next - first - answered < PIPELINE {
                    let (key, end) = range(next);
                    stream.watch(key, Some(WatchOptions::new().with_range(end))).await?;
                    next += 1;
                }
                let message = tokio::time::timeout(Duration::from_secs(20), stream.message()).await;
                let resp = match message {
                    Ok(Ok(Some(resp))) => resp,
                    Ok(Ok(None)) => {
                        anyhow::bail!("stream {}: the member ended it after {answered} answers", streams.len())
                    }
                    Ok(Err(e)) => anyhow::bail!("stream {}: failed after {answered} answers: {e}", streams.len()),
                    Err(_) => anyhow::bail!("stream {}: no answer in 20 s after {answered} answers", streams.len()),
                };
                if resp.created() && resp.canceled() {
                    refused += 1;
                    reason = resp.cancel_reason().to_string();
                } else if resp.created() {
                    created += 1;
                }
                answered += usize::from(resp.created());
            }
            streams.push(stream);
        }
        anyhow::ensure!(refused > 0, "all {total} distinct ranges were routed");
        anyhow::ensure!(created == raftlock::MAX_WATCHED_RANGES, "{created} ranges were routed");
        anyhow::ensure!(reason.contains("too many key ranges watched"), "refused with \"{reason}\"");
        Ok(format!("{created} ranges watched, {refused} refused: \"{reason}\""))
    })
}

/// How many watch creates a careful client leaves unanswered on a stream.
const PIPELINE: usize = 1000;

/// Small messages sent while their member is stopped (SIGSTOP), so that
/// it finds them all waiting at once. HTTP/2 bounds what buffered small
/// frames may cost a member (h2's budget: half the connection window of
/// framing overhead; `raftlock::api`'s `CLIENT_CONNECTION_WINDOW`); past it
/// the member ends the connection with GOAWAY ENHANCE_YOUR_CALM. A whole
/// stream's worth of watch creates (10,000, a DATA frame each) must all be
/// answered; of 30,000 progress requests (7 bytes each) either all are
/// answered or the connection ends so. Nobody else may notice: a watcher on
/// another connection to the same member still gets its event.
fn watch_create_pipeline(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    Box::pin(async move {
        let mut bystander = t.client(2).await?;
        let mut watched = bystander.watch("/pipelined/bystander", None).await?;
        let first = tokio::time::timeout(Duration::from_secs(10), watched.message()).await;
        anyhow::ensure!(matches!(first, Ok(Ok(Some(ref r))) if r.created()), "the bystander's watch: {first:?}");
        let creates: Vec<Vec<u8>> = (0..raftlock::MAX_WATCHERS_PER_STREAM)
            .map(|i| raw::proto_bytes(1, &raw::proto_bytes(1, format!("/pipelined/{i:05}").as_bytes())))
            .collect();
        let (answered, ended) = burst_to_stopped(t, 2, &creates).await?;
        anyhow::ensure!(
            answered == creates.len(),
            "{answered} of {} creates answered, then the connection: {ended}",
            creates.len()
        );
        let progress = vec![raw::proto_bytes(3, &[]); 30_000];
        let (answered, ended) = burst_to_stopped(t, 2, &progress).await?;
        let flood = if answered == progress.len() {
            format!("all {answered} answered")
        } else if ended.contains("ENHANCE_YOUR_CALM") {
            format!("the member ended that connection with GOAWAY ENHANCE_YOUR_CALM after {answered} answers")
        } else {
            anyhow::bail!("{answered} of {} progress requests answered, then the connection: {ended}", progress.len())
        };
        let mut writer = t.client(0).await?;
        writer.put("/pipelined/bystander", "after", None).await?;
        let event = tokio::time::timeout(Duration::from_secs(10), watched.message()).await;
        anyhow::ensure!(
            matches!(event, Ok(Ok(Some(ref r))) if r.events().len() == 1),
            "the bystander's watch, after: {event:?}"
        );
        Ok(format!(
            "10,000 watch creates sent to a stopped member: all answered; 30,000 progress requests: {flood}; a \
             watcher on another connection got its event; peak RSS of any member {} MiB",
            t.peak_rss_mib()
        ))
    })
}

/// Open a Watch stream on a connection of its own to member `i`, stop the
/// member, send each of `messages` (encoded `WatchRequest`s) in a DATA
/// frame of its own, let the member go on, and read the answers: how many
/// came before they all did or the stream ended, and how the connection
/// ended if it did.
async fn burst_to_stopped(t: &Target, i: usize, messages: &[Vec<u8>]) -> anyhow::Result<(usize, String)> {
    let addr = t.client_addr(i);
    let (client, connection) = raw::h2_connect_owned(&addr, 1 << 24).await?;
    let mut client = client.ready().await?;
    let (answer, mut send) = client.send_request(raw::grpc_request(&addr, "/etcdserverpb.Watch/Watch", &[]), false)?;
    // The stream served (its answer's headers) and the member's windows
    // open to every frame before it stops: h2 would hold back what the
    // windows do not allow, and the member would never find it waiting.
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .map_err(|_| anyhow::anyhow!("the Watch stream was not answered within 10 s"))??;
    let total: usize = messages.iter().map(|m| m.len() + 5).sum();
    send.reserve_capacity(total);
    let room = async {
        while send.capacity() < total {
            match futures::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(anyhow::anyhow!("waiting for the member's window: {e}")),
                None => return Err(anyhow::anyhow!("the stream closed before its window opened")),
            }
        }
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(10), room)
        .await
        .map_err(|_| anyhow::anyhow!("the member's window did not open to {total} bytes within 10 s"))??;
    t.cluster.pause(i);
    let sent = messages.iter().try_for_each(|m| send.send_data(raw::grpc_frame(m).into(), false));
    // The frames reach the member's socket while it cannot read them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    t.cluster.resume(i);
    sent?;
    let answers = async {
        let mut body = answer.into_body();
        let mut answered = raw::GrpcMessages::default();
        while answered.count() < messages.len() {
            match body.data().await {
                Some(Ok(chunk)) => {
                    let _ = body.flow_control().release_capacity(chunk.len());
                    answered.push(&chunk);
                }
                Some(Err(_)) | None => break,
            }
        }
        answered.count()
    };
    let answered = tokio::time::timeout(Duration::from_secs(60), answers)
        .await
        .map_err(|_| anyhow::anyhow!("no end to the answers within 60 s"))?;
    if answered == messages.len() {
        return Ok((answered, "open".into()));
    }
    let ended = match tokio::time::timeout(Duration::from_secs(10), connection).await {
        Ok(Ok(Err(e))) if e.is_go_away() => format!("GOAWAY {:?}", e.reason()),
        other => format!("{other:?}"),
    };
    Ok((answered, ended))
}

/// Proclaim with a forged leader key: a key the caller never campaigned
/// for (rev 0), tied to a victim's lease; and the victim's own key with
/// another lease. Both must be refused, and the victim's lease left with
/// only its own key.
fn proclaim_hijack(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    Box::pin(async move {
        let mut victim = t.client(0).await?;
        let lease = victim.lease_grant(60, None).await?.id();
        let won = victim.campaign("/el", "victim", lease).await?;
        let leader = won.leader().ok_or_else(|| anyhow::anyhow!("no leader key"))?.clone();
        let mut attacker = t.client(1).await?;
        let other_lease = attacker.lease_grant(60, None).await?.id();
        let forged = [
            (
                "a key never campaigned for, on the victim's lease",
                LeaderKey::new().with_name("/el").with_key("/el/x").with_rev(0).with_lease(lease),
            ),
            (
                "the victim's key with another lease",
                LeaderKey::new()
                    .with_name("/el")
                    .with_key(leader.key().to_vec())
                    .with_rev(leader.rev())
                    .with_lease(other_lease),
            ),
            (
                "a key outside the election",
                LeaderKey::new().with_name("/el").with_key("/elsewhere").with_rev(leader.rev()).with_lease(lease),
            ),
        ];
        let mut seen = Vec::new();
        for (what, key) in forged {
            let answer = attacker.proclaim("hijacked", Some(ProclaimOptions::new().with_leader(key))).await;
            seen.push(expect_refusal(what, answer, tonic::Code::Unknown, "election: not leader")?);
        }
        let keys =
            victim.lease_time_to_live(lease, Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys())).await?;
        anyhow::ensure!(keys.keys().len() == 1, "the victim's lease holds {} keys", keys.keys().len());
        let now = victim.get(leader.key(), None).await?;
        anyhow::ensure!(now.kvs().first().map(|kv| kv.value()) == Some(b"victim".as_slice()), "the value changed");
        victim.lease_revoke(lease).await?;
        attacker.lease_revoke(other_lease).await?;
        Ok(seen.join("; "))
    })
}

/// Garbage on the peer port: bytes, payloads that do not decode, a
/// message over the peers' size limit, a forwarded txn nested 100,000 deep,
/// and a forwarded bare auth change — sent with a member's identity, which
/// anyone can learn.
fn peer_garbage(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    Box::pin(async move {
        let addr = t.peer_addr(0);
        let within = Duration::from_secs(10);
        let noise = noise(2_246_822_519);
        raw::send_raw(&addr, &noise, Duration::from_secs(3)).await?;
        let identity = [
            ("raftlock-cluster-id", format!("{:x}", raftlock::ids::cluster_id("raftlock-cluster"))),
            ("raftlock-member-id", format!("{:x}", t.cluster.member_id(1))),
        ];
        let mut seen = Vec::new();
        let payload = |data: &[u8]| raw::grpc_frame(&raw::proto_bytes(1, data));
        for (what, path, body, want) in [
            ("a vote that does not decode", "/raftlock.peer.Peer/Vote", payload(&noise[..300]), 3),
            ("entries that do not decode", "/raftlock.peer.Peer/AppendEntries", payload(&noise[..3000]), 3),
            // Refused by the gRPC layer before the gate or a decoder runs.
            ("a 20 MiB message", "/raftlock.peer.Peer/Vote", payload(&vec![1u8; 20 << 20]), 11),
            (
                "a forwarded txn nested 100,000 deep",
                "/raftlock.peer.Peer/Forward",
                payload(&nested_forward(100_000)),
                3,
            ),
            ("a forwarded bare auth change", "/raftlock.peer.Peer/Forward", payload(&bare_auth_disable()), 3),
        ] {
            let end = raw::grpc_call(&addr, path, &identity, body, within).await?;
            match &end {
                GrpcEnd::Status { code, .. } if *code == want => {}
                other => anyhow::bail!("{what}: {other}, expected grpc-status {want}"),
            }
            seen.push(format!("{what}: {end}"));
        }
        Ok(seen.join("; "))
    })
}

/// A forwarded batch (format byte 1, bincode) of one `Command::Txn` whose
/// success branch holds a txn, `depth` times over.
fn nested_forward(depth: usize) -> Vec<u8> {
    let mut out = vec![1u8];
    out.extend(9u64.to_le_bytes()); // the batch's ID
    out.extend(1u64.to_le_bytes()); // one command
    out.extend(2u32.to_le_bytes()); // Command::Txn
    for _ in 0..depth {
        out.extend(0u64.to_le_bytes()); // no compares
        out.extend(1u64.to_le_bytes()); // one op on success
        out.extend(3u32.to_le_bytes()); // RequestOp::Txn
    }
    // The innermost txn's compares, success and failure (all empty), then
    // each outer one's failure branch (empty).
    for _ in 0..depth + 3 {
        out.extend(0u64.to_le_bytes());
    }
    out.extend(1u64.to_le_bytes()); // the first tag
    out
}

/// A forwarded batch of one `Command::Auth(AuthCommand::Disable)`, not
/// wrapped in a caller's `AsUser`.
fn bare_auth_disable() -> Vec<u8> {
    let mut out = vec![1u8];
    out.extend(10u64.to_le_bytes());
    out.extend(1u64.to_le_bytes());
    out.extend(9u32.to_le_bytes()); // Command::Auth
    out.extend(1u32.to_le_bytes()); // AuthCommand::Disable
    out.extend(1u64.to_le_bytes());
    out
}

/// Auth on, then 300 concurrent password guesses for root and an
/// anonymous lease grant. bcrypt must run in bounded slots, the guesser be
/// locked out (etcd's "too many requests"), an authenticated client keep
/// being served meanwhile, and the anonymous grant be refused.
fn auth_flood(t: &mut Target) -> BoxFuture<'_, anyhow::Result<String>> {
    Box::pin(async move {
        let mut c = t.client(0).await?;
        c.user_add("root", "hostile-root", None).await?;
        c.user_grant_role("root", "root").await?;
        c.auth_enable().await?;
        t.check_as(("root", "hostile-root")).await?;
        let pid = t.pid(0);
        let before = raw::cpu_seconds(pid).unwrap_or(0.0);
        let endpoint = t.cluster.members[0].endpoint();
        let guesses: Vec<_> = (0..300)
            .map(|i| {
                let endpoint = endpoint.clone();
                tokio::spawn(async move {
                    let options = etcd_client::ConnectOptions::new().with_user("root", format!("guess-{i}"));
                    match etcd_client::Client::connect([endpoint], Some(options)).await {
                        Ok(_) => (tonic::Code::Ok, String::new()),
                        Err(e) => status(&e),
                    }
                })
            })
            .collect();
        let served_meanwhile = t.still_serving().await;
        let (mut failed, mut throttled, mut other) = (0, 0, Vec::new());
        for g in guesses {
            match g.await? {
                (tonic::Code::InvalidArgument, m) if m.contains("authentication failed") => failed += 1,
                (tonic::Code::ResourceExhausted, m) if m.contains("too many requests") => throttled += 1,
                (code, m) => other.push(format!("{code:?} {m}")),
            }
        }
        let cpu = raw::cpu_seconds(pid).unwrap_or(0.0) - before;
        served_meanwhile?;
        anyhow::ensure!(other.is_empty(), "unexpected answers to guesses: {:?}", &other[..other.len().min(3)]);
        anyhow::ensure!(throttled > 0, "no guess was throttled ({failed} failed)");
        let mut anonymous = t.client(1).await?;
        let grant = anonymous.lease_grant(60, None).await;
        let grant =
            expect_refusal("an anonymous lease grant", grant, tonic::Code::InvalidArgument, "user name is empty")?;
        Ok(format!(
            "300 guesses: {failed} checked and wrong, {throttled} refused as too many requests, {cpu:.1} s of CPU; \
             an authenticated client served meanwhile; {grant}"
        ))
    })
}
