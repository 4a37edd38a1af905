//! `raftlock.v1.Locks/Observe`'s messages, encoded once: a lock's hub
//! (`crate::locks::event_hub`) encodes each change's `ObserveResponse` one
//! time ([`EncodedObserve`]), and every stream observing the lock sends
//! those bytes as they are through [`ObserveCodec`], so a thousand
//! observers cost a change one encoding, not a thousand. A stream that
//! finds several messages waiting sends them as one: the bytes of encoded
//! messages, one after another, are the encoding of one message holding
//! every event in order (the `events` field repeats), whose header is the
//! last one's (a message field given twice is merged, each scalar taking
//! its later value). The route that uses the codec is
//! `super::native_lock::LocksRoutes`.
//!
//! Invariant: what the codec sends is byte for byte a valid
//! `ObserveResponse`; requests are decoded as the generated server does.
//!
//! Caveats: each stream still copies the bytes into its own send buffer
//! (tonic frames every message itself). A joined message holds several
//! revisions, and so does a gateway line made from it.

use std::pin::Pin;

use bytes::{BufMut, Bytes};
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::Status;

use crate::locks::event_hub::{LockHubs, Message};
use crate::proto::raftlock::v1 as pb;

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

/// Requests decoded by the generated server's decoder; answers sent as
/// they were encoded.
pub struct ObserveCodec;

impl Codec for ObserveCodec {
    type Encode = EncodedObserve;
    type Decode = pb::ObserveRequest;
    type Encoder = AsEncoded;
    type Decoder = tonic_prost::ProstDecoder<pb::ObserveRequest>;

    fn encoder(&mut self) -> AsEncoded {
        AsEncoded
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

pub struct AsEncoded;

impl Encoder for AsEncoded {
    type Item = EncodedObserve;
    type Error = Status;

    fn encode(&mut self, item: EncodedObserve, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item.0);
        Ok(())
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
