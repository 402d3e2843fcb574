//! The typed client against a real broker in this process, over real mutual TLS:
//! pipelined publishes bounded by the window, typed NACK reasons, a retried
//! `queue_full`, consumers as streams with ack, nack and redelivery counts,
//! decryption, `ack_batch`, receiver key pinning (a change refused, then
//! accepted), typed refusals, and pushed deliveries arriving between the replies
//! of pending commands without being taken for them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ciphermq_clients::crypto::{self, PublicKey};
use ciphermq_clients::{
    Client, ClientConfig, ConnectError, Consumer, ConsumerError, DecryptError, Delivery,
    Disconnected, ExchangeKind, FilePins, KeyPins, MemoryPins, NackReason, PinStoreError,
    PublishError, Publisher, ReceiverKey, RequestError, RetryPolicy, Role, TlsClientOptions,
};
use ciphermq_testkit::broker::init_logging;
use ciphermq_testkit::pki::TempPki;
use ciphermq_testkit::{BrokerConfig, RunningBroker};
use futures_util::future::join_all;
use futures_util::StreamExt;

/// Longest any test may take.
const LIMIT: Duration = Duration::from_secs(90);

/// Longest wait for one delivery.
const WAIT: Duration = Duration::from_secs(10);

/// The certificates, made once per test binary.
fn certs() -> &'static PathBuf {
    static PKI: OnceLock<TempPki> = OnceLock::new();
    &PKI.get_or_init(|| {
        TempPki::new(&[
            "admin",
            "sender_1",
            "sender_2",
            "receiver_1",
            "receiver_2",
            "stranger",
        ])
    })
    .certs
}

/// A broker on its own threads, stopped on drop.
type Broker = RunningBroker;

/// Starts a broker (in-memory storage, 2 shards) with `performance` keys added.
fn broker(performance: &str) -> Broker {
    init_logging();
    let data = tempfile::tempdir().expect("tempdir");
    let text = BrokerConfig::new(certs(), data.path())
        .admins(&["admin"])
        .senders(&["sender_1", "sender_2"])
        .receivers(&["receiver_1", "receiver_2"])
        .extra(&format!("\n[performance]\n{performance}"))
        .text();
    RunningBroker::start_text(&text, data.path()).keeping(data)
}

/// A client configuration for `cn`, retrying quickly.
fn config(b: &Broker, cn: &str) -> ClientConfig {
    ClientConfig::new(b.addr.clone(), TlsClientOptions::for_cn(certs(), cn)).retry(
        RetryPolicy::new(5, Duration::from_millis(20), Duration::from_millis(100)),
    )
}

async fn connect(b: &Broker, cn: &str) -> Client {
    Client::connect(config(b, cn))
        .await
        .unwrap_or_else(|e| panic!("connect as {cn}: {e}"))
}

/// Declares `ex` (direct), `{cn}_queue` bound with key `{cn}`, registers a new
/// key; returns the client and the key.
async fn receiver(b: &Broker, cn: &str) -> (Client, ReceiverKey) {
    let client = connect(b, cn).await;
    assert_eq!(client.role(), &Role::Receiver);
    let queue = format!("{cn}_queue");
    client
        .declare_exchange("ex", ExchangeKind::Direct)
        .await
        .expect("declare ex");
    client.declare_queue(&queue).await.expect("declare queue");
    client.bind(&queue, "ex", cn).await.expect("bind");
    let key = ReceiverKey::generate(cn);
    client
        .register_public_key(&key.public_key())
        .await
        .expect("register key");
    (client, key)
}

/// The next delivery, bounded.
async fn next(consumer: &mut Consumer) -> Delivery {
    tokio::time::timeout(WAIT, consumer.next())
        .await
        .expect("a delivery in time")
        .expect("the stream goes on")
        .expect("a delivery, not an error")
}

/// Asserts nothing is delivered within half a second.
async fn assert_silent(consumer: &mut Consumer) {
    if let Ok(got) = tokio::time::timeout(Duration::from_millis(500), consumer.next()).await {
        panic!("expected no delivery, got {got:?}");
    }
}

/// In-memory pins that count how often a key is pinned.
#[derive(Debug, Default)]
struct CountingPins {
    inner: MemoryPins,
    lookups: AtomicUsize,
    pins: AtomicUsize,
}

impl KeyPins for CountingPins {
    fn pinned(&self, receiver: &str) -> Result<Option<PublicKey>, PinStoreError> {
        self.lookups.fetch_add(1, Relaxed);
        self.inner.pinned(receiver)
    }

    fn pin(&self, receiver: &str, key: &PublicKey) -> Result<(), PinStoreError> {
        self.pins.fetch_add(1, Relaxed);
        self.inner.pin(receiver, key)
    }
}

/// Runs a test body within [`LIMIT`].
async fn bounded<F: std::future::Future<Output = ()>>(f: F) {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("test finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_are_pipelined_within_the_window_and_all_acknowledged() {
    bounded(async {
        const N: usize = 300;
        const WINDOW: usize = 8;
        let b = broker("");
        let (recv, key) = receiver(&b, "receiver_1").await;
        let pins = Arc::new(CountingPins::default());
        let sender = Client::connect(
            config(&b, "sender_1")
                .publish_window(WINDOW)
                .key_pins(pins.clone()),
        )
        .await
        .expect("connect");
        assert_eq!(sender.role(), &Role::Sender);
        assert_eq!(sender.client_id(), "sender_1");
        let publisher = sender.publisher();
        assert_eq!(publisher.window(), WINDOW);

        let done = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicUsize::new(0));
        let sampler = {
            let (p, done, peak) = (publisher.clone(), done.clone(), peak.clone());
            tokio::spawn(async move {
                while !done.load(Relaxed) {
                    let now = p.in_flight();
                    assert!(now <= WINDOW, "{now} publishes in flight, window {WINDOW}");
                    peak.fetch_max(now, Relaxed);
                    tokio::task::yield_now().await;
                }
            })
        };
        let acks = join_all((0..N).map(|i| {
            let p = publisher.clone();
            async move {
                p.publish_to("receiver_1", "ex", "receiver_1", format!("m{i}").as_bytes())
                    .await
            }
        }))
        .await;
        done.store(true, Relaxed);
        sampler.await.expect("sampler");
        let mut ids = Vec::new();
        for ack in acks {
            let ack = ack.expect("acknowledged");
            assert_eq!(ack.attempts, 1);
            ids.push(ack.message_id);
        }
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), N, "distinct generated ids");
        assert_eq!(peak.load(Relaxed), WINDOW, "the window filled up");
        assert_eq!(publisher.in_flight(), 0);
        // The 300 first publishes to receiver_1 asked the broker for its key and
        // checked and pinned it once: the others waited for that answer.
        assert_eq!(pins.lookups.load(Relaxed), 1);
        assert_eq!(pins.pins.load(Relaxed), 1);
        assert_eq!(
            sender.receiver_key("receiver_1").await.expect("cached key"),
            key.public_key()
        );

        let mut consumer = recv
            .consume("receiver_1_queue", 1000)
            .await
            .expect("consume");
        let mut texts = Vec::new();
        let mut got = Vec::new();
        for _ in 0..N {
            let d = next(&mut consumer).await;
            assert_eq!(d.queue(), "receiver_1_queue");
            assert_eq!(d.delivery_count(), 1);
            assert_eq!(d.sender_id().as_deref(), Some("sender_1"));
            texts.push(String::from_utf8(d.decrypt(&key).expect("decrypt")).expect("utf-8"));
            got.push(d);
        }
        assert_eq!(consumer.ack_many(&got).await.expect("ack_batch"), N as u64);
        texts.sort();
        let mut want: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
        want.sort();
        assert_eq!(texts, want);
        assert_silent(&mut consumer).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_reasons_are_typed_and_permanent_ones_are_not_retried() {
    bounded(async {
        let b = broker("");
        let (recv, _key) = receiver(&b, "receiver_1").await;
        let sender = connect(&b, "sender_1").await;
        let publisher = sender.publisher();
        match publisher
            .publish_to("receiver_1", "nowhere", "receiver_1", b"x")
            .await
        {
            Err(e @ PublishError::Nack { .. }) => {
                assert_eq!(e.nack_reason(), Some(NackReason::NoRoute));
                let PublishError::Nack { attempts, .. } = e else {
                    unreachable!()
                };
                assert_eq!(attempts, 1, "no_route is not retried");
            }
            other => panic!("expected NACK no_route, got {other:?}"),
        }
        assert_eq!(publisher.retries(), 0);

        // A receiver may not publish: NACK access_denied, typed too.
        let body = crypto::encrypt(
            &crypto::generate_secret_key().public_key(),
            "r-1",
            "receiver_1",
            b"x",
        )
        .expect("encrypt");
        let err = recv
            .publisher()
            .publish("ex", "receiver_1", &body)
            .await
            .expect_err("receivers may not publish");
        assert_eq!(err.nack_reason(), Some(NackReason::AccessDenied), "{err}");

        // Names that would break the line are refused before anything is sent.
        let err = publisher
            .publish_to("receiver_1", "ex", "receiver_1 extra", b"x")
            .await
            .expect_err("a space in a key");
        assert!(
            matches!(
                err,
                PublishError::Request(RequestError::InvalidName {
                    what: "routing key",
                    ..
                })
            ),
            "{err:?}"
        );
        let err = publisher
            .publish_to_with_id("bad id", "receiver_1", "ex", "receiver_1", b"x")
            .await
            .expect_err("a space in an id");
        assert!(matches!(err, PublishError::InvalidMessageId(_)), "{err:?}");
        // The connection is still in step.
        sender.heartbeat().await.expect("heartbeat");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_retried_until_a_consumer_makes_room() {
    bounded(async {
        let b = broker("max_queue_size = 2");
        let (recv, key) = receiver(&b, "receiver_1").await;
        let patient = Client::connect(config(&b, "sender_1").retry(RetryPolicy::new(
            200,
            Duration::from_millis(10),
            Duration::from_millis(50),
        )))
        .await
        .expect("connect");
        let publisher = patient.publisher();
        for text in ["one", "two"] {
            publisher
                .publish_to("receiver_1", "ex", "receiver_1", text.as_bytes())
                .await
                .expect("room for two");
        }

        // Without retries the third is refused at once, typed.
        let hasty = Client::connect(config(&b, "sender_2").retry(RetryPolicy::never()))
            .await
            .expect("connect");
        match hasty
            .publisher()
            .publish_to("receiver_1", "ex", "receiver_1", b"hasty")
            .await
        {
            Err(PublishError::Nack {
                reason: NackReason::QueueFull,
                attempts: 1,
                ..
            }) => {}
            other => panic!("expected NACK queue_full after one attempt, got {other:?}"),
        }

        // With retries it waits for room.
        let third = {
            let p = publisher.clone();
            tokio::spawn(async move {
                p.publish_to("receiver_1", "ex", "receiver_1", b"three")
                    .await
            })
        };
        while publisher.retries() < 2 {
            assert!(!third.is_finished(), "the third publish ended early");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut consumer = recv.consume("receiver_1_queue", 10).await.expect("consume");
        let first = next(&mut consumer).await;
        assert_eq!(first.decrypt(&key).expect("decrypt"), b"one");
        first.ack().await.expect("ack");
        let ack = third
            .await
            .expect("task")
            .expect("acknowledged once there was room");
        assert!(ack.attempts > 2, "{ack:?}");
        let mut rest = Vec::new();
        for _ in 0..2 {
            let d = next(&mut consumer).await;
            rest.push(d.decrypt(&key).expect("decrypt"));
            d.ack().await.expect("ack");
        }
        assert_eq!(rest, [b"two".to_vec(), b"three".to_vec()]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_streams_deliveries_with_ack_nack_and_redelivery_counts() {
    bounded(async {
        let b = broker("");
        let (recv, key) = receiver(&b, "receiver_1").await;
        let sender = connect(&b, "sender_1").await;
        let p = sender.publisher();
        for (id, text) in [("a-1", "first"), ("a-2", "second")] {
            let ack = p
                .publish_to_with_id(id, "receiver_1", "ex", "receiver_1", text.as_bytes())
                .await
                .expect("publish");
            assert_eq!(ack.message_id, id);
        }
        let mut consumer = recv.consume("receiver_1_queue", 10).await.expect("consume");
        assert_eq!(consumer.queue(), "receiver_1_queue");
        let d1 = next(&mut consumer).await;
        assert_eq!(
            (d1.id(), d1.delivery_count(), d1.redelivered()),
            ("a-1", 1, false)
        );
        assert_eq!(d1.decrypt(&key).expect("decrypt"), b"first");
        // Someone else's key: the body is not for them.
        let other = ReceiverKey::generate("receiver_2");
        assert!(matches!(
            d1.decrypt(&other),
            Err(DecryptError::NotForUs { .. })
        ));
        d1.nack().await.expect("nack");

        let d2 = next(&mut consumer).await;
        assert_eq!(d2.id(), "a-2");
        d2.ack().await.expect("ack");
        // Acking twice: the broker owes nothing more, typed with its words.
        match d2.ack().await {
            Err(RequestError::Broker(text)) => {
                assert_eq!(text, "no outstanding delivery a-2")
            }
            other => panic!("expected Error: no outstanding delivery, got {other:?}"),
        }

        let again = next(&mut consumer).await;
        assert_eq!(again.id(), "a-1");
        assert_eq!(again.delivery_count(), 2);
        assert!(again.redelivered());
        assert_eq!(again.decrypt(&key).expect("decrypt"), b"first");
        again.ack().await.expect("ack");
        assert_silent(&mut consumer).await;

        // A second consumer of the same queue on this connection is refused.
        match recv.consume("receiver_1_queue", 10).await {
            Err(RequestError::AlreadyConsuming(q)) => assert_eq!(q, "receiver_1_queue"),
            other => panic!("expected AlreadyConsuming, got {other:?}"),
        }
    })
    .await;
}

/// `delete_queue` through the library: the consumer's stream ends with
/// `QueueDeleted` (the broker's pushed line is no reply to a pending
/// command), the connection goes on, and the name can be declared again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_queue_ends_its_consumer_and_the_connection_goes_on() {
    bounded(async {
        let b = broker("");
        let (recv, _key) = receiver(&b, "receiver_1").await;
        let sender = connect(&b, "sender_1").await;
        let p = sender.publisher();
        p.publish_to_with_id("q-1", "receiver_1", "ex", "receiver_1", b"one")
            .await
            .expect("publish");
        let mut consumer = recv.consume("receiver_1_queue", 10).await.expect("consume");
        assert_eq!(next(&mut consumer).await.id(), "q-1");

        let admin = connect(&b, "admin").await;
        admin
            .delete_queue("receiver_1_queue")
            .await
            .expect("delete queue");
        match tokio::time::timeout(WAIT, consumer.next()).await {
            Ok(Some(Err(ConsumerError::QueueDeleted(q)))) => assert_eq!(q, "receiver_1_queue"),
            other => panic!("expected QueueDeleted, got {other:?}"),
        }
        assert!(
            tokio::time::timeout(WAIT, consumer.next())
                .await
                .expect("the stream ends in time")
                .is_none(),
            "the stream ends after it"
        );
        // The connection goes on; the queue is gone.
        recv.heartbeat().await.expect("heartbeat");
        match admin.delete_queue("receiver_1_queue").await {
            Err(RequestError::Broker(text)) => {
                assert_eq!(text, "unknown queue receiver_1_queue")
            }
            other => panic!("expected unknown queue, got {other:?}"),
        }
        // Declared again: empty, and consumable anew on the same connection.
        recv.declare_queue("receiver_1_queue")
            .await
            .expect("declare");
        recv.bind("receiver_1_queue", "ex", "receiver_1")
            .await
            .expect("bind");
        let mut consumer = recv.consume("receiver_1_queue", 10).await.expect("consume");
        p.publish_to_with_id("q-2", "receiver_1", "ex", "receiver_1", b"two")
            .await
            .expect("publish");
        assert_eq!(next(&mut consumer).await.id(), "q-2");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_many_settles_deliveries_with_ack_batch() {
    bounded(async {
        // 6,000 ids of 11 bytes: more than one 64 KiB `ack_batch` line.
        const N: usize = 6000;
        let b = broker("");
        let (recv, _key) = receiver(&b, "receiver_1").await;
        let sender = connect(&b, "sender_1").await;
        let p = sender.publisher();
        let acks = join_all((0..N).map(|i| {
            let p = p.clone();
            async move {
                p.publish_to_with_id(
                    &format!("batch-{i:05}"),
                    "receiver_1",
                    "ex",
                    "receiver_1",
                    b"x",
                )
                .await
            }
        }))
        .await;
        assert!(acks.iter().all(Result::is_ok));
        let mut consumer = recv
            .consume("receiver_1_queue", 10_000)
            .await
            .expect("consume");
        let mut got = Vec::new();
        for _ in 0..N {
            got.push(next(&mut consumer).await);
        }
        assert_eq!(consumer.ack_many(&got).await.expect("ack_batch"), N as u64);
        // Settled already: the broker skips them.
        assert_eq!(consumer.ack_many(&got[..10]).await.expect("ack_batch"), 0);
        recv.close().await.expect("close");

        // Nothing comes back to a new connection.
        let again = connect(&b, "receiver_1").await;
        let mut consumer = again
            .consume("receiver_1_queue", 10)
            .await
            .expect("consume");
        assert_silent(&mut consumer).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_pipeline_and_a_settler_keep_order_and_count_what_the_broker_settled() {
    bounded(async {
        const N: usize = 2500;
        let b = broker("");
        let (recv, key) = receiver(&b, "receiver_1").await;
        let sender = connect(&b, "sender_1").await;
        let public = sender.receiver_key("receiver_1").await.expect("key");
        let (mut pipeline, mut outcomes) = sender.publisher().pipeline();
        for i in 0..N {
            let id = format!("pipe-{i:05}");
            let mut envelope =
                crypto::encrypt(&public, &id, "receiver_1", format!("m{i}").as_bytes())
                    .expect("encrypt");
            envelope.sender_client_id = Some("sender_1".into());
            if i % 2 == 0 {
                pipeline
                    .push(&Publisher::prepare("ex", "receiver_1", &envelope).expect("prepare"))
                    .expect("push");
            } else {
                let json = serde_json::to_string(&envelope).expect("json");
                pipeline
                    .push_json("ex", "receiver_1", &id, &json)
                    .expect("push");
            }
            if pipeline.queued() == 300 {
                pipeline.flush().expect("flush");
            }
        }
        // One publish with no route: a NACK in its place, not retried.
        let envelope =
            crypto::encrypt(&public, "pipe-noroute", "receiver_1", b"x").expect("encrypt");
        pipeline
            .push(&Publisher::prepare("ex", "nobody", &envelope).expect("prepare"))
            .expect("push");
        // Refused before anything is queued.
        assert!(pipeline.push_json("ex", "receiver_1", "a b", "{}").is_err());
        assert!(pipeline
            .push_json("ex", "receiver_1", "ok", "{\n}")
            .is_err());
        pipeline.flush().expect("flush");
        assert_eq!(pipeline.pushed(), N as u64 + 1);
        for i in 0..N {
            let ack = tokio::time::timeout(WAIT, outcomes.next())
                .await
                .expect("in time")
                .expect("an outcome")
                .expect("acknowledged");
            assert_eq!(ack.message_id, format!("pipe-{i:05}"));
        }
        match outcomes.next().await {
            Some(Err(PublishError::Nack {
                message_id,
                reason: NackReason::NoRoute,
                attempts: 1,
            })) => assert_eq!(message_id, "pipe-noroute"),
            other => panic!("expected a no_route NACK, got {other:?}"),
        }
        drop(pipeline);
        assert!(outcomes.next().await.is_none(), "ends with the pipeline");

        let mut consumer = recv
            .consume("receiver_1_queue", 10_000)
            .await
            .expect("consume");
        let settler = consumer.settler();
        assert_eq!(settler.queue(), "receiver_1_queue");
        let mut got = Vec::new();
        for i in 0..N {
            let d = next(&mut consumer).await;
            assert_eq!(d.id(), format!("pipe-{i:05}"));
            assert_eq!(
                d.decrypt(&key).expect("decrypt"),
                format!("m{i}").as_bytes()
            );
            got.push(d);
        }
        assert!(consumer.next_ready().is_none(), "nothing more has come");
        // The first 10 given back, the next 10 acknowledged one line each,
        // the rest with ack_batch lines; all written before any reply is read.
        let ids: Vec<&str> = got.iter().map(Delivery::id).collect();
        let nacked = settler.nack_each(&ids[..10]).expect("nack");
        let single = settler.ack_each(&ids[10..20]).expect("ack");
        let batch = settler.ack_ids(&ids[20..]).expect("ack_batch");
        assert!(settler.ack_ids(["bad id"]).is_err());
        assert_eq!(nacked.await.expect("nacked"), 10);
        assert_eq!(single.await.expect("acked"), 10);
        assert_eq!(batch.await.expect("acked"), N as u64 - 20);
        // Settled already: nothing counted, no error.
        assert_eq!(
            settler
                .ack_each(&ids[10..12])
                .expect("ack")
                .await
                .expect("ack"),
            0
        );
        assert_eq!(
            settler
                .ack_ids(Vec::<String>::new())
                .expect("none")
                .await
                .expect("none"),
            0
        );
        // The nacked ones come back, counted once more.
        for _ in 0..10 {
            let d = next(&mut consumer).await;
            assert_eq!(d.delivery_count(), 2);
            assert!(ids[..10].contains(&d.id()));
            d.ack().await.expect("ack");
        }
        assert_silent(&mut consumer).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_receiver_key_is_refused_until_the_application_accepts_it() {
    bounded(async {
        let b = broker("");
        let pins_dir = tempfile::tempdir().expect("tempdir");
        let pin_file = pins_dir.path().join("known_receivers");
        let sender_config = || {
            config(&b, "sender_1")
                .known_receivers_file(&pin_file)
                .expect("pin file")
                .key_cache_ttl(Duration::ZERO)
        };
        let (recv, old_key) = receiver(&b, "receiver_1").await;
        let sender = Client::connect(sender_config()).await.expect("connect");
        sender
            .publisher()
            .publish_to("receiver_1", "ex", "receiver_1", b"before")
            .await
            .expect("first use pins the key");
        let pins = FilePins::open(&pin_file).expect("pin file");
        assert_eq!(
            pins.pinned("receiver_1").unwrap(),
            Some(old_key.public_key())
        );

        // The receiver (or a broker substituting keys) offers another key.
        let new_key = ReceiverKey::generate("receiver_1");
        recv.register_public_key(&new_key.public_key())
            .await
            .expect("register the new key");

        // A new process with the same pin file refuses it, and sends nothing.
        let fresh = Client::connect(sender_config()).await.expect("connect");
        for client in [&sender, &fresh] {
            match client
                .publisher()
                .publish_to("receiver_1", "ex", "receiver_1", b"refused")
                .await
            {
                Err(PublishError::KeyChanged {
                    receiver,
                    pinned,
                    offered,
                }) => {
                    assert_eq!(receiver, "receiver_1");
                    assert_eq!(pinned, old_key.public_key());
                    assert_eq!(offered, new_key.public_key());
                }
                other => panic!("expected KeyChanged, got {other:?}"),
            }
        }
        assert_eq!(
            pins.pinned("receiver_1").unwrap(),
            Some(old_key.public_key())
        );

        // Accepted explicitly: the new key is pinned (in the file too) and used.
        let accepted = fresh
            .accept_key_rotation("receiver_1")
            .await
            .expect("accept");
        assert_eq!(accepted, new_key.public_key());
        fresh
            .publisher()
            .publish_to("receiver_1", "ex", "receiver_1", b"after")
            .await
            .expect("publish after accepting");
        let reopened = FilePins::open(&pin_file).expect("pin file");
        assert_eq!(
            reopened.pinned("receiver_1").unwrap(),
            Some(new_key.public_key())
        );
        // The first client's store read the file before; its next pin re-reads it,
        // and accepting a key it was shown works the same way.
        sender
            .accept_key("receiver_1", &new_key.public_key())
            .expect("accept the offered key");

        let mut consumer = recv.consume("receiver_1_queue", 10).await.expect("consume");
        let d = next(&mut consumer).await;
        assert_eq!(d.decrypt(&old_key).expect("old key"), b"before");
        d.ack().await.expect("ack");
        let d = next(&mut consumer).await;
        assert!(d.decrypt(&old_key).is_err(), "sealed for the new key");
        assert_eq!(d.decrypt(&new_key).expect("new key"), b"after");
        d.ack().await.expect("ack");
        assert_silent(&mut consumer).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_deliveries_between_replies_never_answer_a_pending_command() {
    bounded(async {
        const ROUNDS: usize = 200;
        let b = broker("");
        // An admin may publish and consume on one connection: its deliveries
        // arrive between the replies to its own commands.
        let admin = connect(&b, "admin").await;
        assert_eq!(admin.role(), &Role::Admin);
        admin
            .declare_exchange("audit", ExchangeKind::Topic)
            .await
            .expect("exchange");
        admin.declare_queue("audit_q").await.expect("queue");
        admin
            .bind("audit_q", "audit", "audit.#")
            .await
            .expect("bind");
        let mut consumer = admin.consume("audit_q", 10_000).await.expect("consume");
        let publisher = admin.publisher();
        let pk = crypto::generate_secret_key().public_key();
        for round in 0..ROUNDS {
            let id = format!("audit-{round}");
            let mut body = crypto::encrypt(&pk, &id, "someone", b"x").expect("encrypt");
            body.sender_client_id = Some("admin".into());
            // Pipelined: a publish (whose delivery comes back on this
            // connection), then commands whose replies must not be that delivery.
            let (ack, hb, key, raw, declared) = tokio::join!(
                publisher.publish("audit", "audit.events", &body),
                admin.heartbeat(),
                admin.get_public_key("nobody"),
                admin.request("heartbeat"),
                admin.declare_queue("audit_q"),
            );
            assert_eq!(ack.expect("publish").message_id, id);
            hb.expect("heartbeat");
            assert!(key.expect("get_public_key").is_none());
            assert_eq!(raw.expect("raw request"), "OK heartbeat");
            declared.expect("declare_queue");
        }
        let mut ids = Vec::new();
        let mut got = Vec::new();
        for _ in 0..ROUNDS {
            let d = next(&mut consumer).await;
            ids.push(d.id().to_owned());
            got.push(d);
        }
        let want: Vec<String> = (0..ROUNDS).map(|r| format!("audit-{r}")).collect();
        assert_eq!(ids, want, "every delivery, in order, to the consumer");
        assert_eq!(consumer.ack_many(&got).await.expect("ack"), ROUNDS as u64);
        assert_eq!(admin.purge_queue("audit_q").await.expect("purge"), 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_typed_with_the_brokers_text() {
    bounded(async {
        let b = broker("");
        match Client::connect(config(&b, "stranger")).await {
            Err(ConnectError::Denied(text)) => {
                assert!(text.contains("unknown client"), "{text}")
            }
            other => panic!("expected Denied, got {other:?}"),
        }
        let sender = connect(&b, "sender_1").await;
        match sender.declare_queue("q").await {
            Err(RequestError::Denied(text)) => assert!(text.ends_with("(role=sender)"), "{text}"),
            other => panic!("expected Denied, got {other:?}"),
        }
        let recv = connect(&b, "receiver_1").await;
        match recv.bind("receiver_1_queue", "nope", "receiver_1").await {
            Err(RequestError::Broker(text)) => {
                assert!(text.starts_with("unknown "), "{text}")
            }
            other => panic!("expected Error: unknown …, got {other:?}"),
        }
        assert!(matches!(
            recv.request("consume receiver_1_queue").await,
            Err(RequestError::Unsupported(_))
        ));
        assert!(matches!(
            recv.request("heartbeat\nquit").await,
            Err(RequestError::Unsupported(_))
        ));

        // The topology helpers, each answered OK.
        recv.declare_exchange("receiver_1.topic", ExchangeKind::Topic)
            .await
            .expect("declare topic");
        match recv
            .declare_exchange("receiver_1.topic", ExchangeKind::Fanout)
            .await
        {
            Err(RequestError::Broker(text)) => assert!(text.contains("exists"), "{text}"),
            other => panic!("expected an exists error, got {other:?}"),
        }
        recv.declare_queue("receiver_1_events")
            .await
            .expect("queue");
        recv.bind("receiver_1_events", "receiver_1.topic", "receiver_1.#")
            .await
            .expect("bind");
        recv.unbind("receiver_1_events", "receiver_1.topic", "receiver_1.#")
            .await
            .expect("unbind");
        recv.unbind("receiver_1_events", "receiver_1.topic", "receiver_1.#")
            .await
            .expect("unbind is idempotent");
        recv.delete_exchange("receiver_1.topic")
            .await
            .expect("delete exchange");
        assert_eq!(
            recv.purge_queue("receiver_1_events").await.expect("purge"),
            0
        );

        // An admin closes the receiver's connections: its commands then fail,
        // typed, and its consumers end.
        let mut consumer = recv
            .consume("receiver_1_events", 10)
            .await
            .expect("consume");
        let admin = connect(&b, "admin").await;
        assert_eq!(
            admin.close_connection("receiver_1").await.expect("close"),
            1
        );
        match tokio::time::timeout(WAIT, consumer.next())
            .await
            .expect("in time")
        {
            Some(Err(ConsumerError::ConnectionLost(reason))) => {
                assert!(
                    matches!(*reason, Disconnected::ClosedByBroker),
                    "{reason:?}"
                )
            }
            other => panic!("expected the connection lost, got {other:?}"),
        }
        assert!(consumer.next().await.is_none(), "the stream ends");
        assert!(recv.is_closed());
        assert!(matches!(
            recv.heartbeat().await,
            Err(RequestError::ConnectionLost(_))
        ));

        // Closing by hand.
        sender.close().await.expect("close");
        match sender.heartbeat().await {
            Err(RequestError::ConnectionLost(reason)) => {
                assert!(
                    matches!(*reason, Disconnected::ClosedByClient),
                    "{reason:?}"
                )
            }
            other => panic!("expected ClosedByClient, got {other:?}"),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sender_tool_publishes_through_the_library_and_stops_on_a_changed_key() {
    use ciphermq_clients::message_source::Contents;
    use ciphermq_clients::sender::{run_sender, SendJob, SenderError, SenderStats};
    use ciphermq_clients::{SenderConfig, TlsConfig};

    bounded(async {
        let b = broker("");
        let (recv, old_key) = receiver(&b, "receiver_1").await;
        let keys = tempfile::tempdir().expect("tempdir");
        let mut config = SenderConfig::new(b.addr.clone(), TlsConfig::for_cn(certs(), "sender_1"));
        config.receivers = vec!["receiver_1".into()];
        config.keys_dir = keys.path().to_owned();
        config.sender.max_inflight = 16;
        let send = |texts: &[&str]| {
            let config = config.clone();
            let job = SendJob {
                contents: Contents::Texts(texts.iter().map(|t| t.to_string()).collect()),
                run_id: None,
            };
            async move {
                run_sender(
                    &config,
                    job,
                    Arc::new(SenderStats::default()),
                    std::future::pending(),
                )
                .await
            }
        };
        let report = send(&["one", "two", "three"]).await.expect("first run");
        assert_eq!(
            (report.sent, report.acked, report.failed, report.unsent),
            (3, 3, 0, 0)
        );
        let pin_file = keys.path().join("known_receivers");
        let pins = FilePins::open(&pin_file).expect("pins");
        assert_eq!(
            pins.pinned("receiver_1").unwrap(),
            Some(old_key.public_key())
        );

        // The key at the broker changes: the next run stops before sending.
        let new_key = ReceiverKey::generate("receiver_1");
        recv.register_public_key(&new_key.public_key())
            .await
            .expect("register");
        match send(&["four"]).await {
            Err(SenderError::KeyChanged {
                receiver,
                pin_file: named,
                ..
            }) => {
                assert_eq!(receiver, "receiver_1");
                assert_eq!(named, pin_file);
            }
            other => panic!("expected KeyChanged, got {other:?}"),
        }

        // Accepted by deleting the receiver's line, as the error says.
        let text = std::fs::read_to_string(&pin_file).expect("pin file");
        let kept: String = text
            .lines()
            .filter(|l| !l.starts_with("receiver_1 "))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&pin_file, kept).expect("edit the pin file");
        let report = send(&["five"]).await.expect("run after accepting");
        assert_eq!(report.acked, 1);

        let mut consumer = recv.consume("receiver_1_queue", 10).await.expect("consume");
        let mut texts = Vec::new();
        for _ in 0..4 {
            let d = next(&mut consumer).await;
            let text = d
                .decrypt(&old_key)
                .or_else(|_| d.decrypt(&new_key))
                .expect("decrypt with one of the keys");
            texts.push(String::from_utf8(text).expect("utf-8"));
            d.ack().await.expect("ack");
        }
        texts.sort();
        assert_eq!(texts, ["five", "one", "three", "two"]);
        assert_silent(&mut consumer).await;
    })
    .await;
}
