//! `raftlock.v1.Locks/Observe` served from messages encoded once: a lock's
//! hub (`crate::locks::event_hub`) encodes each change's `ObserveResponse`
//! one time, and every stream observing the lock sends those bytes as they
//! are, so a thousand observers cost a change one encoding, not a thousand.
//! A stream that finds several messages waiting sends them as one: the
//! bytes of encoded messages, one after another, are the encoding of one
//! message holding every event in order (the `events` field repeats), whose
//! header is the last one's (a message field given twice is merged, each
//! scalar taking its later value).
//!
//! [`LocksRoutes`] is the `Locks` service with this one route taken out of
//! the generated server's hands: the generated server's `Observe` (the
//! trait method) still works, decoding each message again, but is not what
//! a client reaches.
//!
//! Invariant: what the route sends is byte for byte a valid
//! `ObserveResponse`; requests are decoded as the generated server does,
//! with the same size limit.
//!
//! Caveats: each stream still copies the bytes into its own send buffer
//! (tonic frames every message itself). A joined message holds several
//! revisions, and so does a gateway line made from it. The generated
//! server's `Observe`, which decodes what the hub encoded, serves only a
//! caller that uses `LocksServer` without this route (none in raftlock).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes};
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{http, BoxFuture};
use tonic::server::{Grpc, NamedService, ServerStreamingService};
use tonic::{Request, Response, Status};

use super::native_lock::LocksService;
use crate::locks::event_hub::{LockHubs, Message};
use crate::proto::raftlock::v1 as pb;
use crate::proto::raftlock::v1::locks_server::LocksServer;

/// One or more `ObserveResponse`s, encoded.
#[derive(Clone, Debug)]
pub struct EncodedObserve(pub Bytes);

impl Message for EncodedObserve {
    fn size(&self) -> usize {
        self.0.len()
    }

    fn join(parts: Vec<Self>) -> Self {
        if parts.len() == 1 {
            return parts.into_iter().next().expect("one part");
        }
        let mut joined = Vec::with_capacity(parts.iter().map(|p| p.0.len()).sum());
        for part in parts {
            joined.extend_from_slice(&part.0);
        }
        EncodedObserve(joined.into())
    }
}

impl EncodedObserve {
    pub fn encode(message: &pb::ObserveResponse) -> Self {
        EncodedObserve(prost::Message::encode_to_vec(message).into())
    }

    pub fn decode(&self) -> Result<pb::ObserveResponse, Status> {
        prost::Message::decode(self.0.as_ref()).map_err(|e| Status::internal(e.to_string()))
    }
}

/// This member's lock-event hubs, with each change's message encoded.
pub type ObserveHubs = LockHubs<EncodedObserve>;

pub type EncodedStream = Pin<Box<dyn futures::Stream<Item = Result<EncodedObserve, Status>> + Send>>;

/// The `Locks` service, its `Observe` answered from encoded messages.
#[derive(Clone)]
pub struct LocksRoutes {
    locks: Arc<LocksService>,
    generated: LocksServer<LocksService>,
}

impl LocksRoutes {
    pub fn new(locks: Arc<LocksService>) -> LocksRoutes {
        let generated =
            LocksServer::from_arc(locks.clone()).max_decoding_message_size(crate::base::limits::MAX_GRPC_MESSAGE_BYTES);
        LocksRoutes { locks, generated }
    }
}

impl NamedService for LocksRoutes {
    const NAME: &'static str = <LocksServer<LocksService> as NamedService>::NAME;
}

const OBSERVE_PATH: &str = "/raftlock.v1.Locks/Observe";

impl tower::Service<http::Request<Body>> for LocksRoutes {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path() != OBSERVE_PATH {
            return self.generated.call(req);
        }
        let locks = self.locks.clone();
        Box::pin(async move {
            let mut grpc = Grpc::new(ObserveCodec)
                .apply_max_message_size_config(Some(crate::base::limits::MAX_GRPC_MESSAGE_BYTES), None);
            Ok(grpc.server_streaming(Observe(locks), req).await)
        })
    }
}

struct Observe(Arc<LocksService>);

impl ServerStreamingService<pb::ObserveRequest> for Observe {
    type Response = EncodedObserve;
    type ResponseStream = EncodedStream;
    type Future = BoxFuture<Response<EncodedStream>, Status>;

    fn call(&mut self, req: Request<pb::ObserveRequest>) -> Self::Future {
        let locks = self.0.clone();
        Box::pin(async move { locks.observe_encoded(req).await })
    }
}

/// Requests decoded as the generated server does; answers sent as encoded.
struct ObserveCodec;

impl Codec for ObserveCodec {
    type Encode = EncodedObserve;
    type Decode = pb::ObserveRequest;
    type Encoder = AsEncoded;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> AsEncoded {
        AsEncoded
    }

    fn decoder(&mut self) -> RequestDecoder {
        RequestDecoder
    }
}

struct AsEncoded;

impl Encoder for AsEncoded {
    type Item = EncodedObserve;
    type Error = Status;

    fn encode(&mut self, item: EncodedObserve, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item.0);
        Ok(())
    }
}

struct RequestDecoder;

impl Decoder for RequestDecoder {
    type Item = pb::ObserveRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<pb::ObserveRequest>, Status> {
        prost::Message::decode(src).map(Some).map_err(|e| Status::internal(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(revision: i64, positions: &[i64]) -> pb::ObserveResponse {
        pb::ObserveResponse {
            header: Some(crate::proto::etcdserverpb::ResponseHeader { revision, ..Default::default() }),
            events: positions
                .iter()
                .map(|&position| pb::LockEvent { revision, position, ..Default::default() })
                .collect(),
        }
    }

    #[test]
    fn joined_messages_decode_as_one_with_every_event_and_the_last_header() {
        let parts = vec![
            EncodedObserve::encode(&response(5, &[1, 2])),
            EncodedObserve::encode(&response(7, &[3])),
            EncodedObserve::encode(&response(9, &[4, 5])),
        ];
        let joined = EncodedObserve::join(parts).decode().unwrap();
        assert_eq!(joined.header.unwrap().revision, 9);
        let told: Vec<_> = joined.events.iter().map(|e| (e.revision, e.position)).collect();
        assert_eq!(told, [(5, 1), (5, 2), (7, 3), (9, 4), (9, 5)]);
    }
}
