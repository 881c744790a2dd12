//! The store's writes: the puts of one `set`, or the deletes of one
//! `delete`, as one etcd transaction — all made or none. Puts one by one
//! would leave the first ones written, and published to subscribers,
//! when etcd refuses a later one (a value over its request size limit),
//! while the caller gets an error.

use std::collections::BTreeMap;

use rewire_etcd::pb::{request_op, DeleteRangeRequest, PutRequest, RequestOp, TxnRequest};

use super::reads::MAX_TXN_OPS;

/// The transaction that writes `values` at their paths (a path given
/// twice: the last value, as writes one after the other would leave it;
/// etcd refuses a transaction that changes a key twice); `None` when
/// there is nothing to write. `Err` names the limit when there are more
/// than [`MAX_TXN_OPS`] paths.
pub(crate) fn put_all(values: Vec<(String, String)>) -> Result<Option<TxnRequest>, String> {
    let values: BTreeMap<String, String> = values.into_iter().collect();
    let ops = values.into_iter().map(|(path, value)| {
        request_op::Request::RequestPut(PutRequest {
            key: path.into_bytes(),
            value: value.into_bytes(),
            ..PutRequest::default()
        })
    });
    transaction("set", ops.collect())
}

/// The transaction that deletes `paths` (each once); `None` when there is
/// nothing to delete. `Err` names the limit when there are more than
/// [`MAX_TXN_OPS`] paths.
pub(crate) fn delete_all(paths: Vec<String>) -> Result<Option<TxnRequest>, String> {
    let paths: std::collections::BTreeSet<String> = paths.into_iter().collect();
    let ops = paths.into_iter().map(|path| {
        request_op::Request::RequestDeleteRange(DeleteRangeRequest {
            key: path.into_bytes(),
            ..DeleteRangeRequest::default()
        })
    });
    transaction("delete", ops.collect())
}

/// One transaction of `ops` (unconditional), at most [`MAX_TXN_OPS`] of
/// them: more would take several transactions, and the call would no
/// longer be all or nothing.
fn transaction(what: &str, ops: Vec<request_op::Request>) -> Result<Option<TxnRequest>, String> {
    if ops.len() > MAX_TXN_OPS {
        return Err(format!(
            "a {what} of {} distinct keys is more than the {MAX_TXN_OPS} that etcd makes in one transaction (its `--max-txn-ops` default); split it into calls of at most {MAX_TXN_OPS} keys (each call is all or nothing)",
            ops.len()
        ));
    }
    if ops.is_empty() {
        return Ok(None);
    }
    let success = ops
        .into_iter()
        .map(|request| RequestOp {
            request: Some(request),
        })
        .collect();
    Ok(Some(TxnRequest {
        success,
        ..TxnRequest::default()
    }))
}

/// gRPC's status code `INVALID_ARGUMENT`: etcd's answer to a request over
/// `--max-request-bytes` or `--max-txn-ops`.
const INVALID_ARGUMENT: i32 = 3;
/// gRPC's status code `RESOURCE_EXHAUSTED`: gRPC's answer to a message over
/// the server's receive limit (etcd's `--max-request-bytes` and 512 KiB).
const RESOURCE_EXHAUSTED: i32 = 8;

/// What one write transaction carries: what its refusal for its size
/// says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriteSize {
    /// `set` or `delete`.
    what: &'static str,
    /// Its operations: one a distinct key.
    ops: usize,
    /// Bytes of its keys and values.
    bytes: usize,
}

impl WriteSize {
    /// The size of `transaction`.
    pub(crate) fn of(transaction: &TxnRequest) -> Self {
        let mut size = Self {
            what: "delete",
            ops: transaction.success.len(),
            bytes: 0,
        };
        for op in &transaction.success {
            match &op.request {
                Some(request_op::Request::RequestPut(put)) => {
                    size.what = "set";
                    size.bytes += put.key.len() + put.value.len();
                }
                Some(request_op::Request::RequestDeleteRange(delete)) => {
                    size.bytes += delete.key.len();
                }
                _ => {}
            }
        }
        size
    }

    /// When etcd refused the transaction for its size (over its request
    /// limit, `--max-request-bytes`, 1.5 MiB by default, or gRPC's a
    /// little above it; more operations than `--max-txn-ops`), what the
    /// caller is told: an invalid request naming the size and the limit,
    /// to split — not a backend failure, since sending it again fails
    /// again. `None` for any other failure (etcd's `too many requests`
    /// and `database space exceeded` are ResourceExhausted too: they
    /// pass, or are the cluster's, not the call's).
    pub(crate) fn refusal(&self, err: &rewire_etcd::Error) -> Option<String> {
        let rewire_etcd::Error::Status(status) = err else {
            return None;
        };
        let said = status.message();
        let too_large = match i32::from(status.code()) {
            INVALID_ARGUMENT if said.contains("request is too large") => true,
            RESOURCE_EXHAUSTED if said.contains("larger than max") => true,
            INVALID_ARGUMENT if said.contains("too many operations in txn") => false,
            _ => return None,
        };
        let Self { what, ops, bytes } = *self;
        Some(if too_large {
            format!(
                "a {what} of {ops} keys totalling {bytes} bytes of keys and values is larger than etcd takes in one request (its `--max-request-bytes`, 1.5 MiB by default): split it into smaller calls (each call is all or nothing); etcd said: {said}"
            )
        } else {
            format!(
                "a {what} of {ops} keys is more than etcd takes in one transaction (its `--max-txn-ops`, {MAX_TXN_OPS} by default, is set lower): split it into calls of fewer keys (each call is all or nothing); etcd said: {said}"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{delete_all, put_all, request_op, WriteSize, MAX_TXN_OPS};

    fn paths(request: &rewire_etcd::pb::TxnRequest) -> Vec<(String, Option<String>)> {
        request
            .success
            .iter()
            .map(|op| match &op.request {
                Some(request_op::Request::RequestPut(put)) => (
                    String::from_utf8_lossy(&put.key).into_owned(),
                    Some(String::from_utf8_lossy(&put.value).into_owned()),
                ),
                Some(request_op::Request::RequestDeleteRange(delete)) => {
                    (String::from_utf8_lossy(&delete.key).into_owned(), None)
                }
                other => panic!("unexpected op {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_path_given_twice_is_written_once_with_its_last_value() {
        let put = put_all(vec![
            ("/a".into(), "1".into()),
            ("/b".into(), "2".into()),
            ("/a".into(), "3".into()),
        ])
        .expect("within the limit")
        .expect("something to write");
        assert_eq!(
            paths(&put),
            [
                ("/a".into(), Some("3".into())),
                ("/b".into(), Some("2".into()))
            ]
        );
        let delete = delete_all(vec!["/a".into(), "/a".into()])
            .expect("within the limit")
            .expect("something to delete");
        assert_eq!(paths(&delete), [("/a".into(), None)]);
    }

    #[test]
    fn nothing_to_write_makes_no_transaction() {
        assert!(put_all(Vec::new()).expect("within the limit").is_none());
        assert!(delete_all(Vec::new()).expect("within the limit").is_none());
    }

    #[test]
    fn more_paths_than_one_transaction_takes_are_refused_naming_the_limit() {
        let many = |n: usize| (0..n).map(|i| format!("/k{i}")).collect::<Vec<_>>();
        let values = |n: usize| many(n).into_iter().map(|p| (p, "v".into())).collect();
        assert!(put_all(values(MAX_TXN_OPS)).is_ok());
        assert!(delete_all(many(MAX_TXN_OPS)).is_ok());
        let refused = put_all(values(MAX_TXN_OPS + 1)).expect_err("over the limit");
        assert!(refused.contains("set of 129 distinct keys"), "{refused}");
        assert!(refused.contains("128"), "{refused}");
        let refused = delete_all(many(MAX_TXN_OPS + 1)).expect_err("over the limit");
        assert!(refused.contains("delete of 129"), "{refused}");
    }

    #[test]
    fn a_refusal_for_size_is_an_invalid_request_naming_the_size_and_the_limit() {
        let set = put_all(vec![
            ("/a".into(), "x".repeat(1000)),
            ("/b".into(), "y".repeat(1000)),
        ])
        .expect("within the limit")
        .expect("something to write");
        let size = WriteSize::of(&set);
        let status =
            |code, message: &str| rewire_etcd::Error::Status(tonic::Status::new(code, message));
        for too_large in [
            status(
                tonic::Code::InvalidArgument,
                "etcdserver: request is too large",
            ),
            status(
                tonic::Code::ResourceExhausted,
                "grpc: received message larger than max (2097231 vs. 2097152)",
            ),
        ] {
            let message = size.refusal(&too_large).expect("a refusal for size");
            for part in [
                "a set of 2 keys",
                "2004 bytes",
                "`--max-request-bytes`",
                "1.5 MiB",
                "split it",
            ] {
                assert!(message.contains(part), "{part}: {message}");
            }
        }
        let too_many = status(
            tonic::Code::InvalidArgument,
            "etcdserver: too many operations in txn request",
        );
        let message = size.refusal(&too_many).expect("a refusal for size");
        assert!(
            message.contains("`--max-txn-ops`") && message.contains("split it"),
            "{message}"
        );
        let delete = delete_all(vec!["/a".into()])
            .expect("within the limit")
            .expect("a delete");
        let message = WriteSize::of(&delete)
            .refusal(&too_many)
            .expect("a refusal");
        assert!(message.contains("a delete of 1 keys"), "{message}");
        // Load and a full cluster are not the call's size.
        for other in [
            status(
                tonic::Code::ResourceExhausted,
                "etcdserver: too many requests",
            ),
            status(
                tonic::Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            status(
                tonic::Code::InvalidArgument,
                "etcdserver: key is not provided",
            ),
            rewire_etcd::Error::NoEndpoint,
        ] {
            assert_eq!(size.refusal(&other), None, "{other}");
        }
    }
}
