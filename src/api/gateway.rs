//! etcd's HTTP/JSON gateway, on the client port beside gRPC: `POST
//! /v3/kv/range` and the rest of etcd 3.5's paths, plus raftlock's native
//! lock API under `/v1/locks/`.
//!
//! Every call goes to the gRPC services themselves, in process: the gateway
//! is a gRPC client whose channel is the server's own router, so a JSON
//! request meets exactly the checks, limits, auth and errors a gRPC one does.
//! The JSON is protobuf's JSON mapping as etcd's gateway writes it (generated
//! by pbjson): proto field names, default values left out, unknown fields
//! ignored, bytes in base64, 64-bit integers as strings (numbers accepted).
//!
//! - A unary call answers its response message, or `{"error", "code",
//!   "message"}` with gRPC's numeric code and the HTTP status etcd's gateway
//!   gives it (a body that is not the request's JSON: code 3, 400).
//! - Streams (`/v3/watch`, `/v3/lease/keepalive`, `/v3/election/observe`,
//!   `/v3/maintenance/snapshot`, `/v1/locks/observe`) answer one `{"result": message}` per line,
//!   and a failure as `{"error": {"grpc_code", "http_code", "message",
//!   "http_status"}}`. The request body of `/v3/watch` and
//!   `/v3/lease/keepalive` is a sequence of request objects; the stream stays
//!   open after the body ends, until the client goes away, as etcd's does;
//!   then the call ends too. A request object larger than the body limit
//!   ([`MAX_GATEWAY_BODY_BYTES`]) ends the requests.
//! - `Authorization: <token>` carries an auth token. raftlock also takes
//!   `Bearer <token>`, as it does in gRPC metadata; etcd 3.5.1 refuses that
//!   form as an invalid token.
//! - Other paths under `/v3/` and `/v1/locks/` answer 404 `Not Found`, other
//!   methods 405 `Method Not Allowed`, as etcd's gateway does.
//!
//! Caveat: a request through the gateway carries no TLS client certificate
//! into the gRPC call, so with `--client-cert-auth` and auth on, the
//! certificate's CommonName does not name the user here; send a token.

use std::future::Future;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Code, Status};

use crate::base::limits::MAX_GATEWAY_BODY_BYTES;
use crate::proto::etcdserverpb::auth_client::AuthClient;
use crate::proto::etcdserverpb::cluster_client::ClusterClient;
use crate::proto::etcdserverpb::kv_client::KvClient;
use crate::proto::etcdserverpb::lease_client::LeaseClient;
use crate::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::proto::etcdserverpb::watch_client::WatchClient;
use crate::proto::raftlock::v1::locks_client::LocksClient;
use crate::proto::v3electionpb::election_client::ElectionClient;
use crate::proto::v3lockpb::lock_client::LockClient;

/// The gRPC services, as the gateway's clients call them: the server's
/// router behind one concrete service type that handlers can share.
type Services = tower::util::BoxCloneSyncService<
    axum::http::Request<tonic::body::Body>,
    axum::http::Response<Body>,
    std::convert::Infallible,
>;

/// The gateway's routes, calling the gRPC services of `grpc`.
pub fn routes(grpc: Router) -> Router {
    let grpc: Services = tower::util::BoxCloneSyncService::new(grpc);
    let mut routes = Router::new();
    // Calls with one request object in the body: `path` to `$client::$method`,
    // answered by `$answer` (`unary`, or `server_stream`: a line per response).
    macro_rules! calls {
        ($answer:ident: $($path:literal => $client:ident :: $method:ident),* $(,)?) => {$(
            let inner = grpc.clone();
            routes = routes.route($path, post(move |headers: HeaderMap, body: Bytes| {
                let client = $client::new(inner.clone()).max_decoding_message_size(usize::MAX);
                $answer(headers, body, move |req| async move { client.clone().$method(req).await })
            }));
        )*};
    }
    calls! { unary:
        "/v3/kv/range" => KvClient::range,
        "/v3/kv/put" => KvClient::put,
        "/v3/kv/deleterange" => KvClient::delete_range,
        "/v3/kv/txn" => KvClient::txn,
        "/v3/kv/compaction" => KvClient::compact,
        "/v3/lease/grant" => LeaseClient::lease_grant,
        "/v3/lease/revoke" => LeaseClient::lease_revoke,
        "/v3/kv/lease/revoke" => LeaseClient::lease_revoke,
        "/v3/lease/timetolive" => LeaseClient::lease_time_to_live,
        "/v3/kv/lease/timetolive" => LeaseClient::lease_time_to_live,
        "/v3/lease/leases" => LeaseClient::lease_leases,
        "/v3/kv/lease/leases" => LeaseClient::lease_leases,
        "/v3/cluster/member/add" => ClusterClient::member_add,
        "/v3/cluster/member/remove" => ClusterClient::member_remove,
        "/v3/cluster/member/update" => ClusterClient::member_update,
        "/v3/cluster/member/list" => ClusterClient::member_list,
        "/v3/cluster/member/promote" => ClusterClient::member_promote,
        "/v3/maintenance/alarm" => MaintenanceClient::alarm,
        "/v3/maintenance/status" => MaintenanceClient::status,
        "/v3/maintenance/defragment" => MaintenanceClient::defragment,
        "/v3/maintenance/hash" => MaintenanceClient::hash,
        "/v3/maintenance/hashkv" => MaintenanceClient::hash_kv,
        "/v3/maintenance/transfer-leadership" => MaintenanceClient::move_leader,
        "/v3/auth/enable" => AuthClient::auth_enable,
        "/v3/auth/disable" => AuthClient::auth_disable,
        "/v3/auth/status" => AuthClient::auth_status,
        "/v3/auth/authenticate" => AuthClient::authenticate,
        "/v3/auth/user/add" => AuthClient::user_add,
        "/v3/auth/user/get" => AuthClient::user_get,
        "/v3/auth/user/list" => AuthClient::user_list,
        "/v3/auth/user/delete" => AuthClient::user_delete,
        "/v3/auth/user/changepw" => AuthClient::user_change_password,
        "/v3/auth/user/grant" => AuthClient::user_grant_role,
        "/v3/auth/user/revoke" => AuthClient::user_revoke_role,
        "/v3/auth/role/add" => AuthClient::role_add,
        "/v3/auth/role/get" => AuthClient::role_get,
        "/v3/auth/role/list" => AuthClient::role_list,
        "/v3/auth/role/delete" => AuthClient::role_delete,
        "/v3/auth/role/grant" => AuthClient::role_grant_permission,
        "/v3/auth/role/revoke" => AuthClient::role_revoke_permission,
        "/v3/lock/lock" => LockClient::lock,
        "/v3/lock/unlock" => LockClient::unlock,
        "/v3/election/campaign" => ElectionClient::campaign,
        "/v3/election/proclaim" => ElectionClient::proclaim,
        "/v3/election/leader" => ElectionClient::leader,
        "/v3/election/resign" => ElectionClient::resign,
        "/v1/locks/acquire" => LocksClient::acquire,
        "/v1/locks/release" => LocksClient::release,
        "/v1/locks/describe" => LocksClient::describe,
        "/v1/locks/list" => LocksClient::list,
        "/v1/locks/validate" => LocksClient::validate,
    }
    calls! { server_stream:
        "/v3/election/observe" => ElectionClient::observe,
        "/v3/maintenance/snapshot" => MaintenanceClient::snapshot,
        "/v1/locks/observe" => LocksClient::observe,
    }
    // A bidirectional stream: request objects in as the body arrives.
    let inner = grpc.clone();
    routes = routes.route("/v3/watch", post(move |headers: HeaderMap, body: Body| watch(inner.clone(), headers, body)));
    let inner = grpc.clone();
    routes = routes.route(
        "/v3/lease/keepalive",
        post(move |headers: HeaderMap, body: Body| keep_alive(inner.clone(), headers, body)),
    );
    // Other paths under the gateway's, and other methods, answer as etcd's do.
    let not_found = || async { (StatusCode::NOT_FOUND, "Not Found\n") };
    routes
        .route("/v3/{*path}", axum::routing::any(not_found))
        .route("/v1/locks/{*path}", axum::routing::any(not_found))
        .method_not_allowed_fallback(|| async { (StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n") })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_GATEWAY_BODY_BYTES))
}

/// `req` as a gRPC request, carrying the caller's auth token.
fn request<T>(headers: &HeaderMap, req: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(req);
    if let Some(token) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        if let Ok(token) = token.parse() {
            req.metadata_mut().insert("authorization", token);
        }
    }
    req
}

/// The request message in `body`; an empty body is the default message.
fn parse<T: DeserializeOwned + Default>(body: &[u8]) -> Result<T, Status> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| Status::invalid_argument(e.to_string()))
}

async fn unary<Req, Resp, Call, Fut>(headers: HeaderMap, body: Bytes, call: Call) -> Response
where
    Req: DeserializeOwned + Default,
    Resp: Serialize,
    Call: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let req = match parse(&body) {
        Ok(req) => req,
        Err(status) => return error(&status),
    };
    match call(request(&headers, req)).await {
        Ok(resp) => json(StatusCode::OK, &resp.into_inner()),
        Err(status) => error(&status),
    }
}

async fn server_stream<Req, Resp, Call, Fut>(headers: HeaderMap, body: Bytes, call: Call) -> Response
where
    Req: DeserializeOwned + Default,
    Resp: Serialize + Send + 'static,
    Call: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<tonic::Streaming<Resp>>, Status>>,
{
    let req = match parse(&body) {
        Ok(req) => req,
        Err(status) => return error(&status),
    };
    streamed(call(request(&headers, req)).await, ())
}

async fn watch(grpc: Services, headers: HeaderMap, body: Body) -> Response {
    let (requests, reader) = requests(body);
    let mut client = WatchClient::new(grpc).max_decoding_message_size(usize::MAX);
    streamed(client.watch(request(&headers, requests)).await, reader)
}

async fn keep_alive(grpc: Services, headers: HeaderMap, body: Body) -> Response {
    let (requests, reader) = requests(body);
    let mut client = LeaseClient::new(grpc).max_decoding_message_size(usize::MAX);
    streamed(client.lease_keep_alive(request(&headers, requests)).await, reader)
}

/// A streaming call's answer: its lines ([`lines`], keeping `keep` as long),
/// or its error.
fn streamed<Resp: Serialize + Send + 'static>(
    answer: Result<tonic::Response<tonic::Streaming<Resp>>, Status>,
    keep: impl Send + Sync + 'static,
) -> Response {
    match answer {
        Ok(resp) => lines(resp.into_inner(), keep),
        Err(status) => error(&status),
    }
}

/// The requests of a bidirectional stream as they arrive, then silence: the
/// body's end does not end the call. A task reads the body; it stops, and so
/// ends the requests and with them the call, when the [`BodyReader`] is
/// dropped — with the response, when the client goes away.
fn requests<T: DeserializeOwned + Send + 'static>(
    body: Body,
) -> (tokio_stream::wrappers::ReceiverStream<T>, BodyReader) {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let (reader, mut gone) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut objects = std::pin::pin!(json_objects::<T>(body.into_data_stream()));
        loop {
            let object = tokio::select! {
                object = objects.next() => object,
                _ = &mut gone => return,
            };
            let Some(object) = object else { break };
            if tx.send(object).await.is_err() {
                return;
            }
        }
        tokio::select! {
            _ = tx.closed() => {}
            _ = gone => {}
        }
    });
    (tokio_stream::wrappers::ReceiverStream::new(rx), BodyReader(reader))
}

/// Keeps a bidirectional stream's body reader going while it lives.
struct BodyReader(#[allow(dead_code)] tokio::sync::oneshot::Sender<()>);

/// The JSON objects in a body as it arrives, one after another (whitespace
/// between them, or none); ends at the body's end, at the first object that
/// is not a request, or at one larger than [`MAX_GATEWAY_BODY_BYTES`].
///
/// Each byte is looked at once ([`ObjectEnd`]) and each object parsed once,
/// when its last byte has arrived: a body sent a byte at a time costs what
/// the same body sent whole does (parsing the buffer again at each chunk
/// cost a client sending one-byte frames megabytes of parsing per byte).
fn json_objects<T: DeserializeOwned + Send + 'static>(
    body: impl Stream<Item = Result<Bytes, axum::Error>> + Send + 'static,
) -> impl Stream<Item = T> + Send + 'static {
    // (body, what has arrived and is not parsed yet, where the first object
    // in it ends so far)
    let state = (Box::pin(body), Vec::<u8>::new(), ObjectEnd::default());
    futures::stream::unfold(state, |(mut body, mut buffer, mut scan)| async move {
        loop {
            match scan.find(&buffer) {
                Scanned::Object(end) => {
                    let parsed = serde_json::from_slice::<T>(&buffer[..end]);
                    buffer.drain(..end);
                    scan = ObjectEnd::default();
                    match parsed {
                        Ok(object) => return Some((object, (body, buffer, scan))),
                        Err(e) => {
                            tracing::debug!(error = %e, "gateway stream: a request that is not one ends the requests");
                            return None;
                        }
                    }
                }
                Scanned::NotAnObject => {
                    tracing::debug!("gateway stream: a request that is not a JSON object ends the requests");
                    return None;
                }
                Scanned::Incomplete => {}
            }
            if buffer.len() > MAX_GATEWAY_BODY_BYTES {
                tracing::debug!("gateway stream: a request larger than the limit ends the requests");
                return None;
            }
            match body.next().await {
                Some(Ok(chunk)) => buffer.extend_from_slice(&chunk),
                _ => return None,
            }
        }
    })
}

/// Find and parse the objects of `bytes` as the streamed calls' requests,
/// and check the scan against serde's parse (the fuzz targets' entry).
#[cfg(fuzzing)]
pub(super) fn fuzz_objects(bytes: &[u8]) {
    use crate::proto::etcdserverpb as pb;
    let mut rest = bytes;
    loop {
        let mut scan = ObjectEnd::default();
        let found = scan.find(rest);
        // Where serde finds a whole object first, the scan ends there too.
        let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<serde_json::Value>();
        if let Some(Ok(serde_json::Value::Object(_))) = values.next() {
            assert_eq!(found, Scanned::Object(values.byte_offset()), "the scan and serde disagree");
        }
        match found {
            Scanned::Object(end) => {
                assert!(end <= rest.len() && matches!(rest[end - 1], b'}' | b']'));
                let _ = serde_json::from_slice::<pb::WatchRequest>(&rest[..end]);
                let _ = serde_json::from_slice::<pb::LeaseKeepAliveRequest>(&rest[..end]);
                let _ = serde_json::from_slice::<pb::TxnRequest>(&rest[..end]);
                rest = &rest[end..];
            }
            Scanned::NotAnObject | Scanned::Incomplete => return,
        }
    }
}

/// What [`ObjectEnd::find`] has found at the front of a buffer.
#[derive(Debug, PartialEq, Eq)]
enum Scanned {
    /// A whole object (by its brackets: whether it parses is the parser's
    /// to say) ends before this offset.
    Object(usize),
    /// Something other than whitespace or an object comes first.
    NotAnObject,
    /// Not yet: more bytes are needed.
    Incomplete,
}

/// Where the first JSON object in a growing buffer ends, found by looking
/// at each byte once, however the buffer grows between calls: it follows
/// only the nesting of brackets and whether it is inside a string.
#[derive(Default)]
struct ObjectEnd {
    scanned: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl ObjectEnd {
    fn find(&mut self, buffer: &[u8]) -> Scanned {
        while let Some(&b) = buffer.get(self.scanned) {
            self.scanned += 1;
            if self.in_string {
                match b {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b' ' | b'\t' | b'\n' | b'\r' => {}
                b'{' => self.depth += 1,
                _ if self.depth == 0 => return Scanned::NotAnObject,
                b'"' => self.in_string = true,
                b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return Scanned::Object(self.scanned);
                    }
                }
                _ => {}
            }
        }
        Scanned::Incomplete
    }
}

/// A response of one `{"result": ...}` line per message; a failure ends it
/// with an `{"error": ...}` line. `keep` lives as long as the response does.
fn lines<Resp: Serialize + Send + 'static>(
    messages: tonic::Streaming<Resp>,
    keep: impl Send + Sync + 'static,
) -> Response {
    let body = messages.map(move |message| {
        let _ = &keep;
        let mut line = match message {
            Ok(message) => [&b"{\"result\":"[..], &to_json(&message), b"}"].concat(),
            Err(status) => error_line(&status),
        };
        line.push(b'\n');
        Ok::<_, std::convert::Infallible>(Bytes::from(line))
    });
    ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(body)).into_response()
}

/// The `{"error": ...}` line that ends a streamed response with `status`
/// (without its newline).
pub(super) fn error_line(status: &Status) -> Vec<u8> {
    let http = http_status(status.code());
    let error = StreamError {
        grpc_code: status.code() as i32,
        http_code: http.as_u16(),
        message: status.message(),
        http_status: http.canonical_reason().unwrap_or(""),
    };
    [&b"{\"error\":"[..], &to_json(&error), b"}"].concat()
}

/// A stream's failure, as etcd's gateway words it.
#[derive(Serialize)]
struct StreamError<'a> {
    grpc_code: i32,
    http_code: u16,
    message: &'a str,
    http_status: &'a str,
}

/// A unary call's failure, as etcd's gateway words it.
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    code: i32,
    message: &'a str,
}

fn to_json<T: Serialize>(message: &T) -> Vec<u8> {
    serde_json::to_vec(message).expect("a message has a JSON form")
}

fn json<T: Serialize>(status: StatusCode, message: &T) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], to_json(message)).into_response()
}

/// etcd's gateway's error body, with the HTTP status it gives `status`'s code.
pub(super) fn error(status: &Status) -> Response {
    let body = ErrorBody { error: status.message(), code: status.code() as i32, message: status.message() };
    json(http_status(status.code()), &body)
}

/// The HTTP status for a gRPC code, as etcd's gateway (grpc-gateway v1) maps it.
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brackets inside strings (escaped quotes too) do not end an object;
    /// fed a byte at a time, the scan finds the same end as fed whole, and
    /// looks at each byte once.
    #[test]
    fn an_object_ends_at_its_closing_bracket() {
        let body = br#"  {"key": "a}\"{b", "list": [{"x": 1}], "n": {"m": "]"}} {"next": 1}"#;
        let first_end = 2 + 54;
        let mut whole = ObjectEnd::default();
        assert_eq!(whole.find(body), Scanned::Object(first_end));
        let mut bytewise = ObjectEnd::default();
        for n in 1..first_end {
            assert_eq!(bytewise.find(&body[..n]), Scanned::Incomplete, "at {n}");
            assert_eq!(bytewise.scanned, n, "each byte looked at once");
        }
        assert_eq!(bytewise.find(&body[..first_end]), Scanned::Object(first_end));
        assert!(serde_json::from_slice::<serde_json::Value>(&body[..first_end]).is_ok());
        assert_eq!(ObjectEnd::default().find(b"  [1]"), Scanned::NotAnObject);
        assert_eq!(ObjectEnd::default().find(b"x{}"), Scanned::NotAnObject);
    }

    /// A stream of one-byte chunks gives each object once, in order, and a
    /// garbage object ends it.
    #[tokio::test]
    async fn objects_arrive_whole_from_one_byte_chunks() {
        let body: &'static [u8] = br#"{"a": 1}{"a": "}"}  {"a": 3} nonsense {"a": 4}"#;
        let chunks = futures::stream::iter(body.iter().map(|b| Ok(Bytes::copy_from_slice(&[*b]))));
        let objects: Vec<serde_json::Value> = json_objects(chunks).collect().await;
        let a: Vec<String> = objects.iter().map(|o| o["a"].to_string()).collect();
        assert_eq!(a, ["1", "\"}\"", "3"]);
    }
}
