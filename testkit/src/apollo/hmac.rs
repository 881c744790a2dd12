//! HMAC-SHA1 (RFC 2104) written out over the `sha1` digest, so the server
//! checks signatures without sharing the client's HMAC code.

use sha1::{Digest, Sha1};

const BLOCK: usize = 64;

/// HMAC-SHA1 of `message` under `key`.
pub fn hmac_sha1(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        let digest = Sha1::digest(key);
        block[..digest.len()].copy_from_slice(&digest);
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let mut inner = Sha1::new();
    inner.update(pad(0x36));
    inner.update(message);
    let mut outer = Sha1::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    outer.finalize().to_vec()
}
