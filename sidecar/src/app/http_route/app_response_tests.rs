use super::*;

use DeliveryOutcome::{Drop, Retry, Success};

/// The outcome of `answer` fed at once, and a byte at a time: both must
/// agree.
fn read(answer: &[u8]) -> DeliveryOutcome {
    let mut whole = AppResponseScanner::default();
    let at_once = whole.feed(answer).unwrap_or_else(|| whole.end());
    let mut bytes = AppResponseScanner::default();
    let by_byte = answer
        .iter()
        .find_map(|byte| bytes.feed(&[*byte]))
        .unwrap_or_else(|| bytes.end());
    assert_eq!(at_once, by_byte, "{}", String::from_utf8_lossy(answer));
    at_once
}

fn assert_reads(cases: &[(&[u8], DeliveryOutcome)]) {
    for (answer, expected) in cases {
        assert_eq!(
            read(answer),
            *expected,
            "{}",
            String::from_utf8_lossy(answer)
        );
    }
}

#[test]
fn the_first_values_syntax_is_checked_whole_as_gos_scanner_checks_it() {
    assert_reads(&[
        (
            br#" {"a":[1,-0.5e+3,2E7,0,true,false,null,"\"\\\/\b\f\n\r\t\u00e9",{}],"b":{"c":[]},"status" : "RETRY"} "#,
            Retry,
        ),
        // Not JSON somewhere in the value: Go's decode fails.
        (br#"{"status":"RETRY","a":01}"#, Success),
        (br#"{"status":"RETRY","a":1.}"#, Success),
        (br#"{"status":"RETRY","a":.5}"#, Success),
        (br#"{"status":"RETRY","a":-}"#, Success),
        (br#"{"status":"RETRY","a":1e}"#, Success),
        (br#"{"status":"RETRY","a":+1}"#, Success),
        (br#"{"status":"RETRY","a":tru}"#, Success),
        (br#"{"status":"RETRY","a":truex}"#, Success),
        (br#"{"status":"RETRY","a":[1}"#, Success),
        (br#"{"status":"RETRY","a":{"b":1]}"#, Success),
        (br#"{"status":"RETRY","a":[1,]}"#, Success),
        (br#"{"status":"RETRY",}"#, Success),
        (br#"{"status":"RETRY" "a":1}"#, Success),
        (br#"{"status":"RETRY","a":"\x"}"#, Success),
        (br#"{"status":"RETRY","a":"\u12g4"}"#, Success),
        (b"{\"status\":\"RETRY\",\"a\":\"\x01\"}", Success),
        (b"{\"status\":\"RETRY\"\x0b}", Success),
        // Bytes Go takes as they are in strings (replacing invalid UTF-8
        // and lone surrogates).
        (b"{\"status\":\"DROP\",\"a\":\"\xff\x7f\",\"\xfe\":1}", Drop),
        (br#"{"status":"DROP","a":"\ud800"}"#, Drop),
    ]);
}

#[test]
fn the_status_is_decoded_and_matched_as_go_matches_it() {
    assert_reads(&[
        (br#"{"st\u0061tus":"DR\u004fP"}"#, Drop),
        (br#"{"\u017ftatu\u017F":"DROP"}"#, Drop),
        ("{\"ſTATUS\":\"DROP\"}".as_bytes(), Drop),
        (br#"{"status":"DROP\u0000"}"#, Retry),
        // Go replaces the invalid byte: a value Dapr does not know.
        (b"{\"status\":\"DROP\xff\"}", Retry),
        (br#"{"status":"\ud83d\ude00"}"#, Retry),
        (br#"{"status":null}"#, Success),
        (br#"{"status":"RETRY","status":null}"#, Retry),
        // Only the top-level object's keys.
        (
            br#"{"a":{"status":"RETRY"},"b":[{"status":"DROP"}]}"#,
            Success,
        ),
        // Not an object: not Dapr's `AppResponse`.
        (b"null", Success),
        (br#"[{"status":"RETRY"}]"#, Success),
        (br#""RETRY""#, Success),
        (b"  \n\t", Success),
        // A status neither a string nor null fails Go's decode.
        (br#"{"status":true,"status":"RETRY"}"#, Success),
        (br#"{"status":{"a":1},"status":"RETRY"}"#, Success),
        (br#"{"status":["RETRY"]}"#, Success),
    ]);
}

#[test]
fn reading_stops_where_the_outcome_is_decided() {
    let mut scanner = AppResponseScanner::default();
    assert_eq!(scanner.feed(br#"{"status":"DROP""#), None);
    assert_eq!(scanner.feed(b"} not JSON, not read"), Some(Drop));
    // Once the status is no string, nothing after can make Go's decode
    // succeed.
    let mut scanner = AppResponseScanner::default();
    assert_eq!(scanner.feed(br#"{"a":"b","status":1"#), Some(Success));
    let mut scanner = AppResponseScanner::default();
    assert_eq!(scanner.feed(b"  [ {"), Some(Success));
}

/// `{"a":` opening `depth - 1` arrays, closed, then `"status":"RETRY"}`.
fn nested(depth: usize) -> Vec<u8> {
    let mut answer = br#"{"a":"#.to_vec();
    answer.extend(std::iter::repeat_n(b'[', depth - 1));
    answer.extend(std::iter::repeat_n(b']', depth - 1));
    answer.extend_from_slice(br#","status":"RETRY"}"#);
    answer
}

#[test]
fn nesting_is_bounded_as_gos_decoder_bounds_it() {
    assert_eq!(read(&nested(MAX_DEPTH)), Retry);
    assert_eq!(read(&nested(MAX_DEPTH + 1)), Success);
    let mut scanner = AppResponseScanner::default();
    let deepest = nested(MAX_DEPTH);
    assert_eq!(scanner.feed(&deepest[..MAX_DEPTH + 4]), None);
    assert!(scanner.held_bytes() <= MAX_HELD_BYTES);
}

/// Feeds `open`, `total` bytes of `filler` in 64 KiB pieces, then
/// `close`: the outcome, checking what is held after every piece.
fn fed_huge(open: &[u8], filler: u8, total: usize, close: &[u8]) -> DeliveryOutcome {
    let mut scanner = AppResponseScanner::default();
    assert_eq!(scanner.feed(open), None);
    let piece = vec![filler; 64 * 1024];
    for _ in 0..total / piece.len() {
        assert_eq!(scanner.feed(&piece), None);
        let held = scanner.held_bytes();
        assert!(held <= MAX_HELD_BYTES, "{held} bytes held");
    }
    scanner.feed(close).unwrap_or_else(|| scanner.end())
}

#[test]
fn what_is_held_stays_bounded_whatever_is_fed() {
    let fifty_mib = 50 * 1024 * 1024;
    // A 50 MiB key: not `status`.
    let outcome = fed_huge(br#"{""#, b'k', fifty_mib, br#"":1,"status":"RETRY"}"#);
    assert_eq!(outcome, Retry);
    let outcome = fed_huge(br#"{"status":"DROP",""#, b'k', fifty_mib, br#"":1}"#);
    assert_eq!(outcome, Drop);
    // A 50 MiB status: none of Dapr's values.
    let outcome = fed_huge(br#"{"status":"SUCCESS"#, b's', fifty_mib, br#""}"#);
    assert_eq!(outcome, Retry);
}
