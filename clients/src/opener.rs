//! The receiver's decryption stage: deliveries are opened in chunks on blocking
//! threads, several chunks at once, and handed back in delivery order.
//!
//! Opening a message costs an X25519 scalar multiplication (~0.1 ms), so one core
//! caps a receiver at a few thousand messages per second; chunks spread that over
//! every core while the connection task keeps reading. Only pure work happens on
//! the blocking threads: the output file is written by the receiver's own task, so
//! a receiver that is cancelled leaves no thread behind that could still write.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::crypto::{self, EncryptedInputData, SecretKey};
use crate::task_guard::AbortOnDrop;

/// Deliveries per decryption job: enough to amortise a thread hand-off (~6 ms of
/// work), few enough that a short burst still spreads over the cores.
const CHUNK: usize = 64;

/// A delivery copied out of its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Received {
    /// The delivery's message id.
    pub(crate) message_id: String,
    /// The sender its body names (`sender_client_id`), if it names one.
    pub(crate) sender_client_id: Option<String>,
    /// The queue it came from (named in `ack`/`nack`).
    pub(crate) queue: String,
    /// 1 on first delivery.
    pub(crate) delivery_count: u32,
    /// The `EncryptedInputData` JSON.
    pub(crate) body: String,
}

/// A delivery after decryption: the plaintext, or why it could not be opened.
#[derive(Debug)]
pub(crate) struct Opened {
    /// The delivery (its body dropped).
    pub(crate) delivery: Received,
    /// The plaintext, or a reason fit for the log (never key material).
    pub(crate) result: Result<Vec<u8>, String>,
}

/// Ordered parallel decryption.
pub(crate) struct Opener {
    /// Our private key.
    secret: Arc<SecretKey>,
    /// Our CN: a body addressed to anyone else is refused.
    cn: Arc<str>,
    /// Deliveries not yet handed to a job.
    collecting: Vec<Received>,
    /// Running jobs, oldest first.
    jobs: VecDeque<AbortOnDrop<Vec<Opened>>>,
    /// The senders of each id collecting or in a job (`None`: no sender
    /// named): a handful at most, nearly always one.
    ids: HashMap<String, Vec<Option<String>>>,
    /// Jobs running at once, at most (unless flushed).
    workers: usize,
}

impl Opener {
    /// A stage opening messages for `cn` with `secret` on up to `workers` threads.
    pub(crate) fn new(secret: Arc<SecretKey>, cn: &str, workers: usize) -> Opener {
        Opener {
            secret,
            cn: Arc::from(cn),
            collecting: Vec::with_capacity(CHUNK),
            jobs: VecDeque::new(),
            ids: HashMap::new(),
            workers: workers.max(1),
        }
    }

    /// Whether a delivery of `sender`'s `message_id` is being opened.
    pub(crate) fn contains(&self, sender: Option<&str>, message_id: &str) -> bool {
        self.ids
            .get(message_id)
            .is_some_and(|senders| senders.iter().any(|s| s.as_deref() == sender))
    }

    /// Whether a delivery of `message_id`, from any sender, is being opened:
    /// an `ack <id> <queue>` would settle it too.
    pub(crate) fn holds_id(&self, message_id: &str) -> bool {
        self.ids.contains_key(message_id)
    }

    /// Nothing collected, nothing running.
    pub(crate) fn is_idle(&self) -> bool {
        self.collecting.is_empty() && self.jobs.is_empty()
    }

    /// Whether a job is running (so [`Opener::next`] will complete).
    pub(crate) fn has_jobs(&self) -> bool {
        !self.jobs.is_empty()
    }

    /// Queues a delivery; a full chunk starts a job when a worker is free.
    pub(crate) fn push(&mut self, delivery: Received) {
        self.ids
            .entry(delivery.message_id.clone())
            .or_default()
            .push(delivery.sender_client_id.clone());
        self.collecting.push(delivery);
        if self.collecting.len() >= CHUNK && self.jobs.len() < self.workers {
            self.dispatch();
        }
    }

    /// Starts jobs for whatever is collected, however little.
    pub(crate) fn flush(&mut self) {
        while !self.collecting.is_empty() {
            self.dispatch();
        }
    }

    /// The results of the oldest job, in delivery order; `None` if none runs.
    /// Cancel safe: a job is removed only once its results are returned.
    pub(crate) async fn next(&mut self) -> Option<Vec<Opened>> {
        let job = self.jobs.front_mut()?;
        let result = (&mut job.0).await;
        self.jobs.pop_front();
        while self.collecting.len() >= CHUNK && self.jobs.len() < self.workers {
            self.dispatch();
        }
        let opened = match result {
            Ok(opened) => opened,
            Err(e) => {
                // A panic in a decryption job is a bug; its deliveries stay
                // unacknowledged and come back after the next reconnect.
                tracing::error!(error = %e, "a decryption job failed");
                Vec::new()
            }
        };
        for o in &opened {
            let d = &o.delivery;
            if let Some(senders) = self.ids.get_mut(&d.message_id) {
                if let Some(i) = senders.iter().position(|s| *s == d.sender_client_id) {
                    senders.swap_remove(i);
                }
                if senders.is_empty() {
                    self.ids.remove(&d.message_id);
                }
            }
        }
        Some(opened)
    }

    /// Waits for every job, flushing what is collected first.
    pub(crate) async fn finish(&mut self) -> Vec<Opened> {
        self.flush();
        let mut all = Vec::new();
        while let Some(opened) = self.next().await {
            all.extend(opened);
        }
        self.ids.clear();
        all
    }

    /// Moves up to [`CHUNK`] of the oldest collected deliveries into a new job.
    fn dispatch(&mut self) {
        let take = self.collecting.len().min(CHUNK);
        let chunk: Vec<Received> = self.collecting.drain(..take).collect();
        let (secret, cn) = (self.secret.clone(), self.cn.clone());
        self.jobs
            .push_back(AbortOnDrop(tokio::task::spawn_blocking(move || {
                chunk
                    .into_iter()
                    .map(|mut delivery| {
                        let result = open(&secret, &cn, &delivery);
                        delivery.body = String::new();
                        Opened { delivery, result }
                    })
                    .collect()
            })));
    }
}

/// Parses, checks and decrypts one delivery's body.
pub(crate) fn open(secret: &SecretKey, cn: &str, d: &Received) -> Result<Vec<u8>, String> {
    let body: EncryptedInputData = serde_json::from_str(&d.body)
        .map_err(|e| format!("not an EncryptedInputData body: {e}"))?;
    if body.message_id != d.message_id {
        return Err(format!(
            "the body's message_id {:?} differs from the delivery's",
            body.message_id
        ));
    }
    if body.receiver_client_id != cn {
        return Err(format!(
            "addressed to {:?}, not to us",
            body.receiver_client_id
        ));
    }
    // It was read from this body before; a body read two ways is refused.
    if body.sender_client_id != d.sender_client_id {
        return Err(format!(
            "the body's sender_client_id {:?} differs from the one read on delivery",
            body.sender_client_id
        ));
    }
    crypto::decrypt(secret, &body).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(secret: &SecretKey, i: usize) -> Received {
        let id = format!("m{i}");
        let msg = crypto::encrypt(
            &secret.public_key(),
            &id,
            "r",
            format!("text {i}").as_bytes(),
        )
        .unwrap();
        Received {
            message_id: id,
            sender_client_id: None,
            queue: "r_queue".into(),
            delivery_count: 1,
            body: serde_json::to_string(&msg).unwrap(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn opens_in_order_across_jobs() {
        let secret = Arc::new(crypto::generate_secret_key());
        let mut opener = Opener::new(secret.clone(), "r", 3);
        for i in 0..(CHUNK * 4 + 5) {
            opener.push(delivery(&secret, i));
        }
        let mut bad = delivery(&secret, 999);
        bad.message_id = "relabelled".into();
        opener.push(bad);
        assert!(opener.contains(None, "m0") && opener.contains(None, "relabelled"));
        assert!(!opener.contains(Some("s"), "m0") && opener.holds_id("m0"));
        let all = opener.finish().await;
        assert_eq!(all.len(), CHUNK * 4 + 6);
        for (i, o) in all.iter().take(CHUNK * 4 + 5).enumerate() {
            assert_eq!(o.delivery.message_id, format!("m{i}"));
            assert_eq!(o.result.as_deref().unwrap(), format!("text {i}").as_bytes());
        }
        assert!(all.last().unwrap().result.is_err());
        assert!(opener.is_idle() && !opener.contains(None, "m0") && !opener.holds_id("m0"));
    }

    #[test]
    fn refuses_bodies_for_someone_else() {
        let secret = crypto::generate_secret_key();
        let d = delivery(&secret, 1);
        assert!(open(&secret, "r", &d).is_ok());
        assert!(open(&secret, "other", &d)
            .unwrap_err()
            .contains("not to us"));
        let mut junk = d.clone();
        junk.body = "{}".into();
        assert!(open(&secret, "r", &junk)
            .unwrap_err()
            .contains("EncryptedInputData"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tells_senders_of_one_id_apart() {
        let secret = Arc::new(crypto::generate_secret_key());
        let mut opener = Opener::new(secret.clone(), "r", 1);
        let mut a = delivery(&secret, 1);
        let mut b = delivery(&secret, 1);
        for (d, sender) in [(&mut a, "s1"), (&mut b, "s2")] {
            let mut body: EncryptedInputData = serde_json::from_str(&d.body).unwrap();
            body.sender_client_id = Some(sender.into());
            d.body = serde_json::to_string(&body).unwrap();
            d.sender_client_id = Some(sender.into());
        }
        opener.push(a);
        assert!(opener.contains(Some("s1"), "m1") && !opener.contains(Some("s2"), "m1"));
        opener.push(b);
        assert!(opener.contains(Some("s2"), "m1") && !opener.contains(None, "m1"));
        let all = opener.finish().await;
        assert_eq!(all.len(), 2);
        assert!(all.iter().all(|o| o.result.is_ok()));
        assert!(!opener.holds_id("m1"));
    }

    #[test]
    fn refuses_a_body_whose_sender_differs_from_the_deliverys() {
        let secret = crypto::generate_secret_key();
        let mut d = delivery(&secret, 1);
        d.sender_client_id = Some("s1".into());
        assert!(open(&secret, "r", &d)
            .unwrap_err()
            .contains("sender_client_id"));
    }
}
