"""Drives a running rewire sidecar with the official Dapr Python SDK.

Run by tests/api/dapr_python_sdk.rs, which starts `rewire run` (with memory,
then redis, state and lock stores) and sets
DAPR_GRPC_PORT / DAPR_HTTP_PORT and REWIRE_SDK_CONFIG_FILE (the file config
store's JSON file, rewritten here to trigger a configuration change).
Exits non-zero with a message on the first broken expectation.
"""

import json
import os
import sys
import threading
import traceback

import grpc
from dapr.clients import DaprClient
from dapr.clients.exceptions import DaprGrpcError
from dapr.clients.grpc._response import TopicEventResponse, UnlockResponseStatus
from dapr.clients.grpc._request import TransactionalStateOperation, TransactionOperationType
from dapr.clients.grpc._state import Concurrency, StateOptions


def leave(code):
    """Ends the process now: the interpreter's own exit can hang in the
    finalizer of a gRPC stream whose lock a daemon thread held."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def check(condition, message):
    if not condition:
        print(f"FAILED: {message}", file=sys.stderr)
        leave(1)


def state(d):
    d.save_state("statestore", "order-1", "v1")
    got = d.get_state("statestore", "order-1")
    check(got.data == b"v1", f"get_state returned {got.data!r}")
    check(got.etag, "get_state returned no etag")
    d.save_state("statestore", "order-1", "v2", etag=got.etag)
    try:
        d.save_state("statestore", "order-1", "v3", etag=got.etag)
        check(False, "a stale etag was accepted")
    except grpc.RpcError as err:
        check(err.code() == grpc.StatusCode.ABORTED, f"stale etag gave {err.code()}")
    first = StateOptions(concurrency=Concurrency.first_write)
    try:
        d.save_state("statestore", "order-1", "v4", options=first)
        check(False, "first-write overwrote an existing key")
    except grpc.RpcError as err:
        check(err.code() == grpc.StatusCode.ABORTED, f"first-write gave {err.code()}")
    current = d.get_state("statestore", "order-1")
    check(current.data == b"v2", f"after the rejected writes: {current.data!r}")
    d.delete_state("statestore", "order-1", etag=current.etag)
    gone = d.get_state("statestore", "order-1")
    check(gone.data == b"", f"deleted key still has {gone.data!r}")
    # Dapr's rich error details, as the SDK reads them.
    try:
        d.save_state("statestore", "a||b", "v")
        check(False, "a key with `||` was accepted")
    except DaprGrpcError as err:
        check(err.code() == grpc.StatusCode.INVALID_ARGUMENT, f"illegal key gave {err.code()}")
        check(err.error_code() == "DAPR_STATE_ILLEGAL_KEY", f"illegal key error_code {err.error_code()}")
        resource = err.status_details().resource_info or {}
        check(resource.get("resource_name") == "statestore", f"illegal key resource {resource}")


def transaction(d):
    d.execute_state_transaction(
        "statestore",
        [
            TransactionalStateOperation(key="tx-a", data="1"),
            TransactionalStateOperation(key="tx-b", data="2"),
        ],
    )
    a = d.get_state("statestore", "tx-a")
    b = d.get_state("statestore", "tx-b")
    check((a.data, b.data) == (b"1", b"2"), f"after a transaction: {a.data!r} {b.data!r}")
    try:
        d.execute_state_transaction(
            "statestore",
            [
                TransactionalStateOperation(key="tx-a", data="10", etag=a.etag),
                TransactionalStateOperation(key="tx-b", data="20", etag="999999"),
            ],
        )
        check(False, "a transaction with a stale etag was accepted")
    except grpc.RpcError as err:
        check(err.code() == grpc.StatusCode.INTERNAL, f"stale etag in a transaction gave {err.code()}")
    kept = d.get_bulk_state("statestore", ["tx-a", "tx-b"]).items
    check([i.data for i in kept] == [b"1", b"2"], f"a refused transaction changed {[i.data for i in kept]}")
    d.execute_state_transaction(
        "statestore",
        [
            TransactionalStateOperation(key="tx-a", data="10", etag=a.etag),
            TransactionalStateOperation(
                key="tx-b", etag=b.etag, operation_type=TransactionOperationType.delete
            ),
        ],
        transactional_metadata={"partitionKey": "p"},
    )
    a = d.get_state("statestore", "tx-a")
    b = d.get_state("statestore", "tx-b")
    check((a.data, b.data) == (b"10", b""), f"after a transfer: {a.data!r} {b.data!r}")
    components = {c.name: c for c in d.get_metadata().registered_components}
    store = components.get("statestore")
    check(store is not None and "TRANSACTIONAL" in store.capabilities, f"metadata: {components}")


def secrets(d):
    secret = d.get_secret("secretstore", "db")
    check(secret.secret == {"password": "pw-123456", "user": "app"}, f"get_secret: {secret.secret}")
    bulk = d.get_bulk_secret("secretstore")
    check(bulk.secrets.get("db", {}).get("user") == "app", f"get_bulk_secret: {bulk.secrets}")


def configuration(d, config_file):
    got = d.get_configuration("configstore", ["greeting"])
    check(got.items["greeting"].value == "hello", f"get_configuration: {got.items}")
    changed = threading.Event()
    seen = []

    def handler(_id, response):
        for key, item in response.items.items():
            seen.append((key, item.value))
            if key == "greeting" and item.value == "bonjour":
                changed.set()

    subscription = d.subscribe_configuration("configstore", ["greeting"], handler)
    check(bool(subscription), "subscribe_configuration returned no id")
    # Let the stream open before changing the value.
    threading.Event().wait(1.0)
    with open(config_file + ".tmp", "w") as out:
        json.dump({"greeting": "bonjour"}, out)
    os.replace(config_file + ".tmp", config_file)
    check(changed.wait(15), f"no configuration update received; seen {seen}")
    check(d.unsubscribe_configuration("configstore", subscription), "unsubscribe_configuration failed")


def lock(d):
    taken = d.try_lock("lockstore", "inventory", "owner-a", 60)
    check(taken.success, "owner-a could not take a free lock")
    contended = d.try_lock("lockstore", "inventory", "owner-b", 60)
    check(not contended.success, "owner-b took a held lock")
    others = d.unlock("lockstore", "inventory", "owner-b")
    check(others.status == UnlockResponseStatus.lock_belongs_to_others, f"unlock by non-owner: {others.status}")
    released = d.unlock("lockstore", "inventory", "owner-a")
    check(released.status == UnlockResponseStatus.success, f"unlock by owner: {released.status}")
    missing = d.unlock("lockstore", "inventory", "owner-a")
    check(missing.status == UnlockResponseStatus.lock_does_not_exist, f"unlock of a free lock: {missing.status}")


def pubsub(d, name):
    """publish_event / publish_events, subscribe (streaming) and subscribe_with_handler on `name`."""
    sub = d.subscribe(name, "orders")
    d.publish_event(name, "orders", json.dumps({"n": 1}), data_content_type="application/json")
    msg = sub.next_message()
    check(msg.data() == {"n": 1}, f"{name}: subscribe got {msg.raw_data()!r}")
    check(msg.source() == "sdk-test" and msg.topic() == "orders" and msg.pubsub_name() == name,
          f"{name}: cloud event fields {msg.source()}, {msg.topic()}, {msg.pubsub_name()}")
    sub.respond_success(msg)
    answer = d.publish_events(name, "orders", ["a", "b", "c"], data_content_type="text/plain")
    check(not answer.failed_entries, f"{name}: publish_events failed {answer.failed_entries}")
    got = set()
    for _ in range(3):
        msg = sub.next_message()
        got.add(msg.data())
        sub.respond_success(msg)
    check(got == {"a", "b", "c"}, f"{name}: publish_events delivered {got}")
    sub.close()

    handled = []
    done = threading.Event()

    def handler(message):
        handled.append(message.data())
        if len(handled) >= 2:
            done.set()
        return TopicEventResponse("success")

    close = d.subscribe_with_handler(name, "handled", handler)
    d.publish_event(name, "handled", "first", data_content_type="text/plain")
    d.publish_event(name, "handled", "second", data_content_type="text/plain")
    check(done.wait(20), f"{name}: subscribe_with_handler got {handled}")
    close()
    check(sorted(handled) == ["first", "second"], f"{name}: handler got {handled}")


def main():
    config_file = os.environ["REWIRE_SDK_CONFIG_FILE"]
    with DaprClient() as d:
        state(d)
        transaction(d)
        secrets(d)
        configuration(d, config_file)
        lock(d)
        for name in os.environ.get("REWIRE_SDK_PUBSUBS", "").split(","):
            if name:
                pubsub(d, name)
    print("dapr python sdk: all checks passed")


if __name__ == "__main__":
    # A subscription that never gets its message must not hang the suite.
    watchdog = threading.Timer(120, lambda: (print("FAILED: timed out", file=sys.stderr), os._exit(2)))
    watchdog.daemon = True
    watchdog.start()
    try:
        main()
    except Exception:  # an unexpected error fails the run, without hanging at exit
        traceback.print_exc()
        leave(1)
    leave(0)
