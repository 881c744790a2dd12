//! The codec of the generated servers and clients: prost's, with each
//! request message of a call measured and charged before it is decoded
//! (`decoded`).

use std::marker::PhantomData;

use prost::bytes::Buf as _;
use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use super::decoded;

/// prost's codec, measuring what a request holds decoded first.
#[derive(Debug, Clone)]
pub struct CheckedCodec<T, U> {
    prost: ProstCodec<T, U>,
}

impl<T, U> Default for CheckedCodec<T, U> {
    fn default() -> Self {
        Self {
            prost: ProstCodec::default(),
        }
    }
}

impl<T, U> Codec for CheckedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = CheckedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.prost.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        CheckedDecoder {
            prost: self.prost.decoder(),
            _decodes: PhantomData,
        }
    }
}

/// prost's decoder, after [`decoded::admit`].
#[derive(Debug, Clone)]
pub struct CheckedDecoder<U> {
    prost: ProstDecoder<U>,
    _decodes: PhantomData<U>,
}

impl<U: Message + Default + 'static> Decoder for CheckedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // tonic holds a message in one buffer: its first chunk is all of it.
        if buf.chunk().len() == buf.remaining() {
            decoded::admit::<U>(buf.chunk(), true)?;
            return self.prost.decode(buf);
        }
        // Never so in tonic 0.14, but measured all the same.
        let message = buf.copy_to_bytes(buf.remaining());
        decoded::admit::<U>(&message, true)?;
        U::decode(message)
            .map(Some)
            .map_err(|error| Status::internal(error.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.prost.buffer_settings()
    }
}
