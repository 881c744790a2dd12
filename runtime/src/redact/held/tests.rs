//! Values held by guards, let go of, and forgotten after the grace.

use std::time::Duration;

use super::super::{limits, Redactor};

/// A PEM-like value of about 3 KiB, distinct for each `i`, with the
/// blanks and quotes that give it several forms.
fn pem(i: usize) -> String {
    let body = format!("{i:08}").repeat(380);
    format!("-----BEGIN KEY-----\n\"{body}\"\n-----END KEY-----\n")
}

#[test]
fn a_value_let_go_is_forgotten_after_the_grace_and_frees_its_room() {
    let redactor = Redactor::forgetting_after(Duration::ZERO);
    let first = redactor.try_remember_all(["hunter2-first"]).expect("fits");
    assert_eq!(redactor.scrub("auth hunter2-first"), "auth [redacted]");
    drop(first);
    // Still scrubbed until the next value is remembered.
    assert_eq!(redactor.scrub("auth hunter2-first"), "auth [redacted]");
    let _second = redactor.try_remember_all(["hunter2-second"]).expect("fits");
    assert_eq!(
        redactor.scrub("hunter2-first then hunter2-second"),
        "hunter2-first then [redacted]"
    );
    assert_eq!(redactor.forms_remembered(), (1, 1));

    // Room: two values of three quarters of the limit each fit one after
    // the other once the first is let go.
    let huge = |c: &str| c.repeat(limits::MAX_BYTES / 4 * 3);
    let (a, b) = (huge("a"), huge("b"));
    let held = redactor.try_remember_all([a.as_str()]).expect("fits");
    assert!(redactor.try_remember_all([b.as_str()]).is_err(), "both fit");
    drop(held);
    let _held = redactor.try_remember_all([b.as_str()]).expect("room again");
    assert_eq!(redactor.scrub(&a), a, "forgotten");
}

#[test]
fn a_value_let_go_is_scrubbed_through_the_grace() {
    let redactor = Redactor::default();
    let first = redactor.try_remember_all(["hunter2-first"]).expect("fits");
    drop(first);
    let _second = redactor.try_remember_all(["hunter2-second"]).expect("fits");
    assert_eq!(
        redactor.scrub("hunter2-first then hunter2-second"),
        "[redacted] then [redacted]"
    );
    assert_eq!(redactor.forms_remembered(), (2, 1));
}

#[test]
fn a_value_held_twice_stays_until_both_let_go() {
    let redactor = Redactor::forgetting_after(Duration::ZERO);
    let one = redactor.try_remember_all(["hunter2-shared"]).expect("fits");
    let two = redactor.try_remember_all(["hunter2-shared"]).expect("fits");
    // A clone is the same hold: letting go of it lets go of nothing.
    let clone = one.clone();
    drop(one);
    drop(clone);
    let _x = redactor.try_remember_all(["other-value-x"]).expect("fits");
    assert_eq!(redactor.scrub("hunter2-shared"), "[redacted]");
    drop(two);
    let _y = redactor.try_remember_all(["other-value-y"]).expect("fits");
    assert_eq!(redactor.scrub("hunter2-shared"), "hunter2-shared");
}

#[test]
fn a_value_held_again_within_the_grace_is_not_forgotten() {
    let redactor = Redactor::forgetting_after(Duration::from_millis(50));
    let first = redactor.try_remember_all(["hunter2-again"]).expect("fits");
    drop(first);
    let _again = redactor.try_remember_all(["hunter2-again"]).expect("fits");
    std::thread::sleep(Duration::from_millis(60));
    let _other = redactor.try_remember_all(["other-value"]).expect("fits");
    assert_eq!(redactor.scrub("hunter2-again"), "[redacted]");
}

#[test]
fn rotating_values_never_fills_the_room() {
    // An hourly rotated certificate key, 1,000 times over: before, each
    // value's forms stayed for good and the limit was reached at about a
    // hundred.
    let redactor = Redactor::forgetting_after(Duration::ZERO);
    let mut previous = None;
    let mut most = 0;
    for i in 0..1_000 {
        let value = pem(i);
        let held = redactor.try_remember_all([value.as_str()]);
        let held = held.unwrap_or_else(|full| panic!("rotation {i}: {full}"));
        drop(previous.replace(held));
        most = most.max(redactor.forms_remembered().0);
    }
    // Those of the value in force and of the one let go of last
    // (forgotten at the next remember).
    let forms_of_one = super::super::forms_to_scrub(&pem(0)).len();
    assert!(most <= 2 * forms_of_one, "{most} forms remembered");
    assert_eq!(redactor.scrub(&pem(999)), "[redacted]");
    assert_eq!(redactor.scrub(&pem(10)), pem(10));
}

#[test]
fn forms_past_their_grace_are_forgotten_once_a_while_or_when_their_room_is_needed() {
    let redactor = Redactor::forgetting_every(Duration::ZERO, Duration::from_secs(3600));
    let huge = |c: &str| c.repeat(limits::MAX_BYTES / 4 * 3);
    let (a, b) = (huge("a"), huge("b"));
    drop(redactor.try_remember_all(["hunter2-first"]).expect("fits"));
    // Forgotten now; the next forgetting waits an hour...
    let _x = redactor.try_remember_all(["other-value-x"]).expect("fits");
    assert_eq!(redactor.scrub("hunter2-first"), "hunter2-first");
    drop(redactor.try_remember_all([a.as_str()]).expect("fits"));
    let _y = redactor.try_remember_all(["other-value-y"]).expect("fits");
    assert_eq!(
        redactor.scrub(&a),
        "[redacted]",
        "kept until the next forgetting"
    );
    // ...unless the room is needed.
    let _b = redactor.try_remember_all([b.as_str()]).expect("room made");
    assert_eq!(redactor.scrub(&a), a, "forgotten");
    assert_eq!(redactor.scrub(&b), "[redacted]");
}

#[test]
fn a_guard_let_go_while_a_finder_is_built_does_not_wait_for_it() {
    let redactor = Redactor::forgetting_after(Duration::ZERO);
    let held = redactor
        .try_remember_all(["hunter2-dropped"])
        .expect("fits");
    // Held as while a finder is built.
    let building = redactor.shared.forms.lock();
    let (dropped, done) = std::sync::mpsc::channel();
    let dropping = std::thread::spawn(move || {
        drop(held);
        let _ = dropped.send(());
    });
    let waited = done.recv_timeout(Duration::from_secs(2));
    drop(building);
    let _ = dropping.join();
    assert!(waited.is_ok(), "the guard's drop waited for the build");
    // Counted by the next writer: past its grace (zero), forgotten.
    let _other = redactor.try_remember_all(["other-value"]).expect("fits");
    assert_eq!(redactor.scrub("hunter2-dropped"), "hunter2-dropped");
    assert_eq!(redactor.forms_remembered(), (1, 1));
}

#[test]
fn a_form_let_go_by_one_guard_while_another_holds_it_is_not_forgotten_when_counted() {
    let redactor = Redactor::forgetting_after(Duration::ZERO);
    let one = redactor.try_remember_all(["hunter2-both"]).expect("fits");
    let two = redactor.try_remember_all(["hunter2-both"]).expect("fits");
    drop(one);
    let _other = redactor.try_remember_all(["other-value"]).expect("fits");
    assert_eq!(redactor.scrub("hunter2-both"), "[redacted]");
    drop(two);
    let _another = redactor.try_remember_all(["another-value"]).expect("fits");
    assert_eq!(redactor.scrub("hunter2-both"), "hunter2-both");
}
