//! `request`: one line from a client, as `Request::parse` gets it.
//!
//! The input is a line of arbitrary bytes (made UTF-8 lossily, as no line
//! reaches the parser without being UTF-8). Besides not panicking, what the
//! parser accepts must keep its promises: names follow the name rule, counts
//! are positive, a publish body is not empty and is then inspected the way
//! the broker does.

#![no_main]

use ciphermq_proto::{inspect_batch, inspect_message, is_valid_name, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // The broker hands the parser one line at a time; the whole input is
    // tried too, since the parser must not trust that.
    check(&text);
    for line in text.split('\n') {
        check(line);
    }
});

/// Parses `line` and checks what a successful parse promises.
fn check(line: &str) {
    let Ok(request) = Request::parse(line) else {
        return;
    };
    assert!(!request.command().is_empty());
    match request {
        Request::DeclareQueue { queue } => assert!(is_valid_name(queue)),
        Request::DeclareExchange { exchange, .. } => assert!(is_valid_name(exchange)),
        Request::Bind {
            queue,
            exchange,
            routing_key,
        }
        | Request::Unbind {
            queue,
            exchange,
            routing_key,
        } => {
            assert!(is_valid_name(queue) && is_valid_name(exchange));
            assert!(!routing_key.is_empty());
        }
        Request::PurgeQueue { queue } | Request::DeleteQueue { queue } => {
            assert!(is_valid_name(queue))
        }
        Request::DeleteExchange { exchange } => assert!(is_valid_name(exchange)),
        Request::CloseConnection { client_id } => assert!(is_valid_name(client_id)),
        Request::Publish { body, .. } => {
            assert!(!body.is_empty());
            let _ = inspect_message(body);
        }
        Request::PublishBatch { body, .. } => {
            assert!(!body.is_empty());
            for element in inspect_batch(body).unwrap_or_default() {
                let _ = inspect_message(element.get());
            }
        }
        Request::Consume { queue, prefetch } => {
            assert!(is_valid_name(queue));
            assert!(prefetch.is_none_or(|n| n > 0));
        }
        Request::Fetch { queue, max } => {
            assert!(is_valid_name(queue));
            assert!(max.is_none_or(|n| n > 0));
        }
        Request::Ack { message_id, queue } | Request::Nack { message_id, queue } => {
            assert!(is_valid_name(message_id));
            assert!(queue.is_none_or(is_valid_name));
        }
        Request::AckBatch { queue, ids } => {
            assert!(is_valid_name(queue));
            assert!(Request::batch_ids(ids).count() > 0);
            assert!(Request::batch_ids(ids).all(is_valid_name));
        }
        Request::RegisterPublicKey { key_b64 } => assert!(!key_b64.is_empty()),
        Request::GetPublicKey { client_id } => assert!(is_valid_name(client_id)),
        Request::Locate { owner } => assert!(is_valid_name(owner)),
        Request::Move { owner, node } => assert!(is_valid_name(owner) && is_valid_name(node)),
        Request::PublishFor { owner, body, .. } => {
            assert!(is_valid_name(owner));
            assert!(!body.is_empty());
            let _ = inspect_message(body);
        }
        Request::Resend | Request::Heartbeat | Request::Quit | Request::Nodes => {}
    }
}
