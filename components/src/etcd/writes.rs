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

#[cfg(test)]
mod tests {
    use super::{delete_all, put_all, request_op, MAX_TXN_OPS};

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
}
