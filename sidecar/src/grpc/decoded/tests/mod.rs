use std::mem::size_of;

use prost::Message;

use super::estimate::decoded_bytes;
use super::schema::{MessageId, Schemas};
use crate::grpc::proto::dapr::proto::common::v1 as common;
use crate::grpc::proto::dapr::proto::runtime::v1 as dapr;
use crate::grpc::proto::rewire::lifecycle::v1 as lifecycle;
use crate::grpc::proto::spec::proto::runtime::v1 as layotto;

fn id(name: &str) -> MessageId {
    Schemas::embedded().named(name).expect(name)
}

/// The estimate of `message`, a `name`.
fn estimate(name: &str, message: &impl Message) -> u64 {
    decoded_bytes(Schemas::embedded(), id(name), &message.encode_to_vec()).expect("measured")
}

fn struct_at_least<T>(name: &str) {
    let estimated = Schemas::embedded().message(id(name)).struct_bytes;
    assert!(
        estimated >= size_of::<T>() as u64,
        "{name}: estimated {estimated}, prost's struct is {}",
        size_of::<T>()
    );
}

#[test]
fn struct_estimates_are_at_least_what_prost_builds() {
    struct_at_least::<common::StateItem>(".dapr.proto.common.v1.StateItem");
    struct_at_least::<dapr::SaveStateRequest>(".dapr.proto.runtime.v1.SaveStateRequest");
    struct_at_least::<dapr::TransactionalStateOperation>(
        ".dapr.proto.runtime.v1.TransactionalStateOperation",
    );
    struct_at_least::<dapr::BulkPublishRequestEntry>(
        ".dapr.proto.runtime.v1.BulkPublishRequestEntry",
    );
    struct_at_least::<dapr::SubscribeTopicEventsRequestAlpha1>(
        ".dapr.proto.runtime.v1.SubscribeTopicEventsRequestAlpha1",
    );
    struct_at_least::<layotto::PutFileRequest>(".spec.proto.runtime.v1.PutFileRequest");
    struct_at_least::<layotto::StateItem>(".spec.proto.runtime.v1.StateItem");
    struct_at_least::<lifecycle::ComponentConfig>(".rewire.lifecycle.v1.ComponentConfig");
    struct_at_least::<lifecycle::DynamicConfiguration>(".rewire.lifecycle.v1.DynamicConfiguration");
}

#[test]
fn every_served_method_has_its_request_message() {
    let schemas = Schemas::embedded();
    for path in [
        "/dapr.proto.runtime.v1.Dapr/SaveState",
        "/dapr.proto.runtime.v1.Dapr/SubscribeTopicEventsAlpha1",
        "/spec.proto.runtime.v1.Runtime/PutFile",
        "/rewire.lifecycle.v1.Lifecycle/ApplyConfiguration",
        "/spec.proto.runtime.v1.Lifecycle/ApplyConfiguration",
    ] {
        assert!(schemas.request_of(path).is_some(), "{path}");
    }
    assert_eq!(
        schemas.request_of("/dapr.proto.runtime.v1.Dapr/SaveState"),
        schemas.named(".dapr.proto.runtime.v1.SaveStateRequest")
    );
    assert!(schemas
        .request_of("/dapr.proto.runtime.v1.Dapr/Nope")
        .is_none());
}

#[test]
fn empty_elements_count_at_their_struct_size_not_their_two_bytes() {
    let items = 10_000;
    let save = dapr::SaveStateRequest {
        store_name: "s".into(),
        states: vec![common::StateItem::default(); items],
    };
    let wire = save.encoded_len() as u64;
    let estimated = estimate(".dapr.proto.runtime.v1.SaveStateRequest", &save);
    let structs = (items * size_of::<common::StateItem>()) as u64;
    assert!(wire < 3 * items as u64, "{wire}");
    // The array grows to 16,384 slots, and half again while it grows.
    assert!(estimated >= structs, "{estimated} < {structs}");
    assert!(
        estimated <= 3 * structs,
        "{estimated} is far above {structs}"
    );
}

#[test]
fn values_count_at_their_length() {
    let value = 1 << 20;
    let save = dapr::SaveStateRequest {
        store_name: "orders".into(),
        states: vec![common::StateItem {
            key: "k".into(),
            value: vec![7; value],
            ..Default::default()
        }],
    };
    let estimated = estimate(".dapr.proto.runtime.v1.SaveStateRequest", &save);
    assert!(estimated >= value as u64);
    assert!(estimated < value as u64 + 4096, "{estimated}");
}

#[test]
fn map_entries_count_each() {
    let entries = 1_000;
    let put = layotto::PutFileRequest {
        store_name: "files".into(),
        metadata: (0..entries)
            .map(|i| (format!("k{i}"), String::new()))
            .collect(),
        ..Default::default()
    };
    let estimated = estimate(".spec.proto.runtime.v1.PutFileRequest", &put);
    let entry = size_of::<(String, String)>() as u64;
    assert!(estimated >= entries as u64 * entry, "{estimated}");
}

#[test]
fn unknown_fields_count_nothing_as_prost_drops_them() {
    // Field 99 (unknown), 1 MiB long; then the store's name.
    let mut bytes = vec![0x9a, 0x06, 0x80, 0x80, 0x40];
    bytes.extend(std::iter::repeat_n(0, 1 << 20));
    bytes.extend([0x0a, 0x01, b's']);
    let estimated = decoded_bytes(
        Schemas::embedded(),
        id(".dapr.proto.runtime.v1.SaveStateRequest"),
        &bytes,
    )
    .expect("measured");
    assert!(estimated < 1024, "{estimated}");
    assert!(dapr::SaveStateRequest::decode(&bytes[..]).is_ok());
}

/// A small, seeded generator of mutations.
struct Mutations(u64);

impl Mutations {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Whatever the estimate calls malformed, prost refuses: a message the
/// estimate cannot measure is never one prost decodes unmeasured.
fn malformed_only_where_prost_refuses<T: Message + Default>(name: &str, valid: &T) {
    let schemas = Schemas::embedded();
    let message = id(name);
    let valid = valid.encode_to_vec();
    let mut mutations = Mutations(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let mut bytes = valid.clone();
        for _ in 0..=mutations.below(3) {
            match mutations.below(3) {
                0 => {
                    let at = mutations.below(bytes.len());
                    bytes[at] = mutations.next() as u8;
                }
                1 => {
                    let at = mutations.below(bytes.len() + 1);
                    bytes.truncate(at);
                }
                _ => {
                    let at = mutations.below(bytes.len() + 1);
                    bytes.insert(at, mutations.next() as u8);
                }
            }
            if bytes.is_empty() {
                bytes.push(0);
            }
        }
        if decoded_bytes(schemas, message, &bytes).is_err() {
            assert!(
                T::decode(&bytes[..]).is_err(),
                "{name}: prost decodes {bytes:02x?}, which the estimate called malformed"
            );
        }
    }
}

#[test]
fn what_the_estimate_calls_malformed_prost_refuses() {
    let save = dapr::SaveStateRequest {
        store_name: "orders".into(),
        states: vec![
            common::StateItem {
                key: "a".into(),
                value: b"1".to_vec(),
                etag: Some(common::Etag { value: "3".into() }),
                metadata: [("ttl".to_string(), "5".to_string())].into(),
                options: Some(common::StateOptions {
                    concurrency: 1,
                    consistency: 2,
                }),
            };
            3
        ],
    };
    malformed_only_where_prost_refuses(".dapr.proto.runtime.v1.SaveStateRequest", &save);
    let put = layotto::PutFileRequest {
        store_name: "files".into(),
        name: "a/b".into(),
        data: vec![1, 2, 3],
        metadata: [("k".to_string(), "v".to_string())].into(),
    };
    malformed_only_where_prost_refuses(".spec.proto.runtime.v1.PutFileRequest", &put);
}

#[test]
fn arrays_and_tables_count_at_the_capacity_they_grow_to() {
    // 300,000 one-byte keys: 2^19 slots of 24 bytes, half again while the
    // array grows, and a 32-byte chunk per key.
    let keys = 300_000_u64;
    let bulk = dapr::GetBulkStateRequest {
        store_name: "orders".into(),
        keys: vec!["a".into(); keys as usize],
        ..Default::default()
    };
    let estimated = estimate(".dapr.proto.runtime.v1.GetBulkStateRequest", &bulk);
    let array = (1_u64 << 19) * 24;
    assert!(estimated >= array + array / 2 + keys * 32, "{estimated}");
    // 100,000 distinct keys: hashbrown's 2^17 buckets of an entry and a
    // control byte, half again while the table grows.
    let put = layotto::PutFileRequest {
        store_name: "files".into(),
        metadata: (0..100_000)
            .map(|i| (format!("{i}"), String::new()))
            .collect(),
        ..Default::default()
    };
    let estimated = estimate(".spec.proto.runtime.v1.PutFileRequest", &put);
    let entry = size_of::<(String, String)>() as u64;
    let table = (1_u64 << 17) * (entry + 1);
    assert!(estimated >= table + table / 2, "{estimated}");
}
