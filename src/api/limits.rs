//! etcd's request limits on every client service.
//!
//! Two bounds, as etcd's: a request larger than [`MAX_CLIENT_REQUEST_BYTES`]
//! (1.5 MiB, `--max-request-bytes`' default) is refused by the handler with
//! `etcdserver: request is too large` (InvalidArgument); a gRPC message larger
//! than [`MAX_GRPC_MESSAGE_BYTES`] (that plus 512 KiB) is refused before it is
//! decoded, with gRPC's `ResourceExhausted` and Go gRPC's wording,
//! `grpc: received message larger than max (N vs. 2097152)` — the one etcd
//! clients see. tonic refuses such a message itself, but as `OutOfRange` with
//! its own words: [`as_etcd_answers_too_large`] rewrites that answer (every
//! client service is wrapped, see `api::served`).
//!
//! Caveat: on streams (Watch, LeaseKeepAlive) a message over the limit ends
//! the stream with tonic's status, which travels in the trailers and is not
//! rewritten.

use prost::Message;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::Status;

use super::error;
use crate::base::limits::{MAX_CLIENT_REQUEST_BYTES, MAX_GRPC_MESSAGE_BYTES};

/// Refuse a request larger than [`MAX_CLIENT_REQUEST_BYTES`], as etcd does.
pub fn check_request_size(req: &impl Message) -> Result<(), Status> {
    if req.encoded_len() > MAX_CLIENT_REQUEST_BYTES {
        return Err(error::request_too_large());
    }
    Ok(())
}

type Answer = http::Response<Body>;

/// tonic's refusal of a message over the decoding limit, as it words it.
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large: found ";

/// Rewrite tonic's refusal of an oversized message (a trailers-only answer:
/// the status is in the headers) into gRPC-Go's, which etcd clients know.
pub(super) fn as_etcd_answers_too_large(mut answer: Answer) -> Answer {
    let headers = answer.headers_mut();
    let is_out_of_range = headers.get("grpc-status").is_some_and(|s| s == "11");
    if !is_out_of_range {
        return answer;
    }
    // tonic percent-encodes the message's spaces (as "%20").
    let found = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .map(|m| m.replace("%20", " "))
        .and_then(|m| m.strip_prefix(TONIC_TOO_LARGE)?.split(' ').next()?.parse::<usize>().ok());
    if let Some(found) = found {
        let message = format!("grpc: received message larger than max ({found} vs. {MAX_GRPC_MESSAGE_BYTES})");
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
        headers.insert("grpc-message", http::HeaderValue::from_str(&message).expect("an ASCII message"));
    }
    answer
}
