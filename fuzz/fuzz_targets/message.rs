//! `message`: a publish body, as `inspect_message` and `inspect_batch` get it.
//!
//! The input is the body's bytes (made UTF-8 lossily). Besides not panicking:
//! an accepted id follows the name rule, a body refused as incomplete still
//! had a valid id, every element of an accepted batch is JSON text that
//! is itself inspected, and the check's fast path answers as the JSON
//! parser does.

#![no_main]

use ciphermq_proto::{
    inspect_batch, inspect_message, inspect_message_by_parser, is_valid_name, MessageError,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let body = String::from_utf8_lossy(data);
    check_one(&body);
    if let Some(elements) = inspect_batch(&body) {
        for element in elements {
            let text = element.get();
            assert!(!text.is_empty());
            // Each element is an exact slice of the body.
            assert!(body.contains(text));
            check_one(text);
        }
    }
});

/// Inspects one body and checks the id the result carries.
fn check_one(body: &str) {
    assert_eq!(inspect_message(body), inspect_message_by_parser(body));
    match inspect_message(body) {
        Ok(info) => assert!(is_valid_name(&info.message_id)),
        Err(MessageError::Invalid { message_id }) => assert!(is_valid_name(&message_id)),
        Err(MessageError::Unreadable) => {}
    }
}
