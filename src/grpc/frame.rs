//! One `SubscribeResponse` on the wire, as the server writes it (encode each event once
//! for all subscribers).
//!
//! A live log entry goes to every subscriber of its session. Converting it to protobuf and
//! encoding it per stream cost most of the fan-out's CPU, so the first stream to send an entry
//! encodes its `entry` field once into [`SharedEntry::wire`] and every stream after it writes
//! those bytes behind its own `offset` field. The bytes are exactly what prost would write for
//! the same `SubscribeResponse`, so clients see no difference. Every other event is converted and
//! encoded per stream as before.
//!
//! The Subscribe servers are generated a second time with this type in place of
//! `SubscribeResponse` (see `build.rs`); clients still decode into `pb::SubscribeResponse`.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::{
    DecodeError, Message,
    encoding::{DecodeContext, WireType, encoded_len_varint, key_len},
};

use super::convert;
use crate::{
    pb::v1 as pb,
    session::{SharedEntry, subscribe::StreamEvent},
};

/// The tag of `SubscribeResponse.offset`.
const OFFSET_TAG: u32 = 1;
/// The tag of `SubscribeResponse.entry`.
const ENTRY_TAG: u32 = 2;

/// A `SubscribeResponse` whose event may be a shared, already encoded log entry.
#[derive(Debug, Clone, PartialEq)]
pub struct SubscribeFrame {
    body: Body,
}

#[derive(Debug, Clone, PartialEq)]
enum Body {
    /// `offset`, then the `entry` field (key, length and message) shared between streams.
    Shared { offset: u64, entry_field: Bytes },
    /// A response encoded as prost encodes it.
    Owned(pb::SubscribeResponse),
}

impl Default for SubscribeFrame {
    fn default() -> Self {
        Self::from(pb::SubscribeResponse::default())
    }
}

impl From<pb::SubscribeResponse> for SubscribeFrame {
    fn from(response: pb::SubscribeResponse) -> Self {
        Self {
            body: Body::Owned(response),
        }
    }
}

impl SubscribeFrame {
    /// The frame of one stream event: a log entry's encoding is made by the first stream that
    /// sends it and shared by the rest.
    pub(crate) fn of(offset: u64, event: &StreamEvent) -> Self {
        match event {
            StreamEvent::Entry(entry) => Self {
                body: Body::Shared {
                    offset,
                    entry_field: entry_field(entry),
                },
            },
            other => Self::from(convert::stream_event_to_pb(offset, other)),
        }
    }

    /// The response this frame encodes (what a client decodes).
    #[cfg(test)]
    pub(crate) fn to_response(&self) -> pb::SubscribeResponse {
        match &self.body {
            Body::Owned(response) => response.clone(),
            Body::Shared { .. } => pb::SubscribeResponse::decode(self.encode_to_vec().as_slice())
                .expect("a shared frame decodes"),
        }
    }
}

/// The `entry` field (key, length, message) of a shared entry, encoded on first use.
fn entry_field(entry: &SharedEntry) -> Bytes {
    entry
        .wire
        .get_or_init(|| {
            let message = pb::LogEntry::from(&**entry);
            let len = message.encoded_len();
            let mut field =
                BytesMut::with_capacity(key_len(ENTRY_TAG) + encoded_len_varint(len as u64) + len);
            prost::encoding::message::encode(ENTRY_TAG, &message, &mut field);
            field.freeze()
        })
        .clone()
}

impl Message for SubscribeFrame {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match &self.body {
            Body::Owned(response) => response.encode_raw(buf),
            Body::Shared {
                offset,
                entry_field,
            } => {
                // Field order and the default-value rule as prost writes them: `offset` (omitted
                // when zero), then `entry`.
                if *offset != 0 {
                    prost::encoding::uint64::encode(OFFSET_TAG, offset, buf);
                }
                buf.put_slice(entry_field);
            }
        }
    }

    fn encoded_len(&self) -> usize {
        match &self.body {
            Body::Owned(response) => response.encoded_len(),
            Body::Shared {
                offset,
                entry_field,
            } => {
                let offset_len = if *offset != 0 {
                    prost::encoding::uint64::encoded_len(OFFSET_TAG, offset)
                } else {
                    0
                };
                offset_len + entry_field.len()
            }
        }
    }

    // The server never decodes a frame; decoding still works, into an owned response.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if let Body::Shared { .. } = self.body {
            let owned = pb::SubscribeResponse::decode(self.encode_to_vec().as_slice())?;
            self.body = Body::Owned(owned);
        }
        match &mut self.body {
            Body::Owned(response) => response.merge_field(tag, wire_type, buf, ctx),
            Body::Shared { .. } => unreachable!("made owned above"),
        }
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::Arc,
        time::{Duration, UNIX_EPOCH},
    };

    use super::*;
    use crate::domain::log::{Direction, LogEntry};

    fn entry(offset: u64) -> Arc<SharedEntry> {
        Arc::new(SharedEntry::from(LogEntry {
            offset,
            direction: Direction::FromRuntime,
            json: r#"{"jsonrpc":"2.0","method":"session/update","params":{}}"#.to_owned(),
            actor: "runtime".to_owned(),
            action_id: None,
            epoch: 3,
            created_at: UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456),
        }))
    }

    #[test]
    fn a_shared_entry_frame_is_byte_for_byte_what_prost_writes_for_the_same_response() {
        let shared = entry(42);
        for offset in [0, 1, 41, 42, u64::MAX] {
            let event = StreamEvent::Entry(shared.clone());
            let frame = SubscribeFrame::of(offset, &event);
            let expected = convert::stream_event_to_pb(offset, &event);
            assert_eq!(
                frame.encode_to_vec(),
                expected.encode_to_vec(),
                "offset {offset}"
            );
            assert_eq!(frame.encoded_len(), expected.encoded_len());
            assert_eq!(frame.to_response(), expected);
        }
    }

    #[test]
    fn an_entry_is_encoded_once_however_many_streams_send_it() {
        let shared = entry(7);
        let event = StreamEvent::Entry(shared.clone());
        let first = SubscribeFrame::of(7, &event);
        let second = SubscribeFrame::of(7, &event);
        let (Body::Shared { entry_field: a, .. }, Body::Shared { entry_field: b, .. }) =
            (&first.body, &second.body)
        else {
            panic!("entries travel shared");
        };
        assert_eq!(a.as_ptr(), b.as_ptr(), "both frames write the one encoding");
    }

    #[test]
    fn other_events_are_encoded_as_prost_encodes_them() {
        let event = StreamEvent::CaughtUp { head: 9 };
        let frame = SubscribeFrame::of(9, &event);
        assert_eq!(
            frame.encode_to_vec(),
            convert::stream_event_to_pb(9, &event).encode_to_vec()
        );
    }

    #[test]
    fn a_shared_frame_decodes_back_into_the_response_it_encodes() {
        let event = StreamEvent::Entry(entry(5));
        let bytes = SubscribeFrame::of(5, &event).encode_to_vec();
        let decoded = SubscribeFrame::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(
            decoded.to_response(),
            convert::stream_event_to_pb(5, &event)
        );
    }
}
