//! The message a publish stores: immutable, shared by every queue it was routed
//! to (fan-out copies share one allocation), across shards.

use std::sync::Arc;

use crate::dedup::{DedupHasher, DedupKey};

/// One published message: its id, its exact JSON body, who sent it, and
/// where it was published (kept for the metadata mirror, which reads it back
/// from the log).
#[derive(Debug)]
pub struct Message {
    /// `message_id`, exchange, routing key and body, in one allocation.
    data: Box<str>,
    /// Length of the id prefix of `data`.
    id_len: u16,
    /// Length of the exchange after the id.
    exchange_len: u16,
    /// Length of the routing key after the exchange.
    key_len: u16,
    /// When the broker accepted it, in Unix milliseconds.
    sent_at_ms: u64,
    /// The publisher's CN: dedup is per sender.
    sender: Arc<str>,
}

/// Where a message was published, and when.
#[derive(Debug, Clone, Copy, Default)]
pub struct Route<'a> {
    /// The exchange it was published to.
    pub exchange: &'a str,
    /// Its routing key.
    pub routing_key: &'a str,
    /// When the broker accepted it, in Unix milliseconds.
    pub sent_at_ms: u64,
}

impl Message {
    /// Builds a message from its (validated) id and its JSON body, with no
    /// route (tests, and logs written before routes were recorded).
    pub fn new(message_id: &str, body: &str, sender: Arc<str>) -> Arc<Message> {
        Message::published(message_id, body, sender, Route::default())
    }

    /// Builds a message published through `route`. Ids, exchange names and
    /// routing keys are at most 255 bytes (the name rule), far below `u16`.
    pub fn published(
        message_id: &str,
        body: &str,
        sender: Arc<str>,
        route: Route<'_>,
    ) -> Arc<Message> {
        let len16 = |s: &str| u16::try_from(s.len()).unwrap_or(u16::MAX);
        let (id_len, exchange_len, key_len) = (
            len16(message_id),
            len16(route.exchange),
            len16(route.routing_key),
        );
        let mut data = String::with_capacity(
            usize::from(id_len) + usize::from(exchange_len) + usize::from(key_len) + body.len(),
        );
        data.push_str(&message_id[..usize::from(id_len)]);
        data.push_str(&route.exchange[..usize::from(exchange_len)]);
        data.push_str(&route.routing_key[..usize::from(key_len)]);
        data.push_str(body);
        Arc::new(Message {
            data: data.into_boxed_str(),
            id_len,
            exchange_len,
            key_len,
            sent_at_ms: route.sent_at_ms,
            sender,
        })
    }

    #[inline]
    fn body_start(&self) -> usize {
        usize::from(self.id_len) + usize::from(self.exchange_len) + usize::from(self.key_len)
    }

    /// The message id.
    #[inline]
    pub fn message_id(&self) -> &str {
        &self.data[..usize::from(self.id_len)]
    }

    /// The JSON body, byte-identical to what was published.
    #[inline]
    pub fn body(&self) -> &str {
        &self.data[self.body_start()..]
    }

    /// Where and when it was published.
    pub fn route(&self) -> Route<'_> {
        let id = usize::from(self.id_len);
        let exchange_end = id + usize::from(self.exchange_len);
        Route {
            exchange: &self.data[id..exchange_end],
            routing_key: &self.data[exchange_end..self.body_start()],
            sent_at_ms: self.sent_at_ms,
        }
    }

    /// The publisher's CN.
    #[inline]
    pub fn sender(&self) -> &Arc<str> {
        &self.sender
    }

    /// The dedup key of this message under `hasher`.
    pub fn dedup_key(&self, hasher: &DedupHasher) -> DedupKey {
        hasher.key(&self.sender, self.message_id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_id_and_body_apart() {
        let m = Message::new("m1", "{\"a\":1}", Arc::from("sender_1"));
        assert_eq!(m.message_id(), "m1");
        assert_eq!(m.body(), "{\"a\":1}");
        assert_eq!(&**m.sender(), "sender_1");
    }

    #[test]
    fn keeps_the_route_apart_from_id_and_body() {
        let route = Route {
            exchange: "ex",
            routing_key: "a.b",
            sent_at_ms: 42,
        };
        let m = Message::published("m1", "{}", Arc::from("s"), route);
        assert_eq!((m.message_id(), m.body()), ("m1", "{}"));
        let r = m.route();
        assert_eq!((r.exchange, r.routing_key, r.sent_at_ms), ("ex", "a.b", 42));
    }
}
