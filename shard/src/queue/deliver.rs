//! Deliveries: the next ready message, dispatch to consumers within their
//! prefetch, fetch, ack, requeue, redelivery past `ack_wait`, and the
//! consumers themselves. Apart because it is the queue's data path out.

use std::time::Instant;

use super::{Consumer, Delivery, Entry, Inflight, Queue, QueueSettings};
use crate::dedup::DedupKey;
use crate::placement::ConnRef;

impl Queue {
    /// The next message to deliver, with dead letters split off.
    fn next_entry(
        &mut self,
        settings: &QueueSettings,
        dead: &mut Vec<Entry>,
        now: Instant,
    ) -> Option<Entry> {
        if self.frozen {
            return None;
        }
        loop {
            let entry = match self.requeued.pop_first() {
                Some((_, e)) => e,
                None => self.ready.pop_front()?,
            };
            if entry.deliveries >= settings.max_deliveries {
                self.forget(&entry, now, settings);
                self.release_bytes(&entry);
                dead.push(entry);
                continue;
            }
            return Some(entry);
        }
    }

    fn deliver(
        &mut self,
        mut entry: Entry,
        conn: ConnRef,
        settings: &QueueSettings,
        now: Instant,
    ) -> Delivery {
        entry.deliveries += 1;
        let delivery = Delivery {
            queue: self.name.clone(),
            shard: self.shard,
            seq: entry.seq,
            count: entry.deliveries,
            msg: entry.msg.clone(),
        };
        let deadline = settings.ack_wait.map(|wait| now + wait);
        if let Some(d) = deadline {
            self.deadlines.push_back((d, entry.seq));
        }
        self.unacked.insert(
            entry.seq,
            Inflight {
                entry,
                conn,
                deadline,
            },
        );
        delivery
    }

    /// Pushes ready messages to consumers with room in their prefetch, round robin.
    pub fn dispatch(
        &mut self,
        settings: &QueueSettings,
        now: Instant,
        out: &mut Vec<(ConnRef, Delivery)>,
        dead: &mut Vec<Entry>,
    ) {
        while self.ready_len() > 0 && !self.consumers.is_empty() {
            let n = self.consumers.len();
            let Some(pick) = (0..n)
                .map(|i| (self.next_consumer + i) % n)
                .find(|&i| self.consumers[i].has_room())
            else {
                return;
            };
            let Some(entry) = self.next_entry(settings, dead, now) else {
                return;
            };
            let consumer = &mut self.consumers[pick];
            consumer.inflight += 1;
            consumer.inflight_bytes += entry.msg.body().len() as u64;
            let conn = consumer.conn;
            self.next_consumer = (pick + 1) % n;
            let delivery = self.deliver(entry, conn, settings, now);
            out.push((conn, delivery));
        }
    }

    /// Pulls up to `max` messages for `conn` (the `fetch` command).
    pub fn fetch(
        &mut self,
        conn: ConnRef,
        max: u32,
        settings: &QueueSettings,
        now: Instant,
        out: &mut Vec<Delivery>,
        dead: &mut Vec<Entry>,
    ) {
        self.fetch_more(conn, max, 0, settings, now, out, dead);
    }

    /// [`Queue::fetch`] continued: `bytes` body bytes were fetched already
    /// (`settings.max_fetch_bytes` bounds them with what this adds).
    #[allow(clippy::too_many_arguments)]
    pub fn fetch_more(
        &mut self,
        conn: ConnRef,
        max: u32,
        mut bytes: usize,
        settings: &QueueSettings,
        now: Instant,
        out: &mut Vec<Delivery>,
        dead: &mut Vec<Entry>,
    ) {
        for _ in 0..max.min(settings.max_fetch) {
            if bytes >= settings.max_fetch_bytes {
                return;
            }
            let Some(entry) = self.next_entry(settings, dead, now) else {
                return;
            };
            bytes += entry.msg.body().len();
            out.push(self.deliver(entry, conn, settings, now));
        }
    }

    /// A delivery of `entry` to `conn` is settled (acked, given back).
    fn release(&mut self, conn: ConnRef, entry: &Entry) {
        if let Some(c) = self.consumers.iter_mut().find(|c| c.conn == conn) {
            c.inflight = c.inflight.saturating_sub(1);
            c.inflight_bytes = c
                .inflight_bytes
                .saturating_sub(entry.msg.body().len() as u64);
        }
    }

    /// Acks the delivery `seq` made to `conn`; false when there is none.
    pub fn ack(&mut self, seq: u64, conn: ConnRef, now: Instant, settings: &QueueSettings) -> bool {
        self.ack_keyed(seq, conn, now, settings).is_some()
    }

    /// [`Queue::ack`], returning the acked id's dedup key (for the log's
    /// ack record); `None` when there is no such delivery.
    pub fn ack_keyed(
        &mut self,
        seq: u64,
        conn: ConnRef,
        now: Instant,
        settings: &QueueSettings,
    ) -> Option<DedupKey> {
        let key = match self.unacked.get(&seq) {
            Some(inflight) if inflight.conn == conn => {
                inflight.entry.msg.dedup_key(&settings.dedup_hasher)
            }
            _ => return None,
        };
        self.settle_acked(seq, key, conn, now, settings)
            .then_some(key)
    }

    /// Acks the deliveries `seqs` made to `conn` (an `ack_batch`), and
    /// pushes each acked one's sequence number and dedup key onto `acked`
    /// (for the log's ack records); seqs with no such delivery are skipped.
    /// Every dedup slot is prefetched before the first is touched, so the
    /// batch waits for its cache misses together.
    pub fn ack_many(
        &mut self,
        seqs: impl Iterator<Item = u64>,
        conn: ConnRef,
        now: Instant,
        settings: &QueueSettings,
        acked: &mut Vec<(u64, DedupKey)>,
    ) {
        let start = acked.len();
        for seq in seqs {
            if let Some(inflight) = self.unacked.get(&seq) {
                if inflight.conn == conn {
                    let key = inflight.entry.msg.dedup_key(&settings.dedup_hasher);
                    self.dedup.prefetch(key);
                    acked.push((seq, key));
                }
            }
        }
        // A seq given twice is acked once.
        let mut kept = start;
        for i in start..acked.len() {
            let (seq, key) = acked[i];
            if self.settle_acked(seq, key, conn, now, settings) {
                acked[kept] = (seq, key);
                kept += 1;
            }
        }
        acked.truncate(kept);
    }

    /// Removes the delivery `seq` (known to be `conn`'s, with dedup key
    /// `key`) and remembers its id as acked; false when it is gone already.
    fn settle_acked(
        &mut self,
        seq: u64,
        key: DedupKey,
        conn: ConnRef,
        now: Instant,
        settings: &QueueSettings,
    ) -> bool {
        let Some(inflight) = self.unacked.remove(&seq) else {
            return false;
        };
        self.release(conn, &inflight.entry);
        self.drop_stale_deadlines();
        // A queue only consumed from must age its ids out too.
        self.expire_dedup(now);
        if !inflight.entry.is_unwritten() {
            self.forget_keyed(inflight.entry.seq, key, now, settings);
        }
        self.release_bytes(&inflight.entry);
        true
    }

    /// Puts the delivery `seq` made to `conn` back for redelivery (nack,
    /// resend); one that reached `max_deliveries` goes to `dead` instead.
    pub fn requeue(
        &mut self,
        seq: u64,
        conn: ConnRef,
        settings: &QueueSettings,
        now: Instant,
        dead: &mut Vec<Entry>,
    ) -> bool {
        match self.unacked.get(&seq) {
            Some(inflight) if inflight.conn == conn => {}
            _ => return false,
        }
        let Some(inflight) = self.unacked.remove(&seq) else {
            return false;
        };
        self.release(conn, &inflight.entry);
        self.give_back(inflight.entry, settings, now, dead);
        true
    }

    fn give_back(
        &mut self,
        entry: Entry,
        settings: &QueueSettings,
        now: Instant,
        dead: &mut Vec<Entry>,
    ) {
        if entry.deliveries >= settings.max_deliveries {
            self.forget(&entry, now, settings);
            self.release_bytes(&entry);
            dead.push(entry);
        } else {
            self.requeued.insert(entry.seq, entry);
        }
    }

    /// Drops deadlines at the front whose delivery is settled: acks come
    /// nearly in delivery order, so the deadlines held stay about as many as
    /// the deliveries in flight, not every delivery of the last `ack_wait`.
    fn drop_stale_deadlines(&mut self) {
        while let Some(&(deadline, seq)) = self.deadlines.front() {
            if self
                .unacked
                .get(&seq)
                .is_some_and(|i| i.deadline == Some(deadline))
            {
                break;
            }
            self.deadlines.pop_front();
        }
    }

    /// Deadlines held (some may be stale): what `ack_wait` costs in memory.
    pub fn deadlines_held(&self) -> usize {
        self.deadlines.len()
    }

    /// Redelivers deliveries unacked past `ack_wait`; returns how many.
    pub fn expire_deliveries(
        &mut self,
        now: Instant,
        settings: &QueueSettings,
        dead: &mut Vec<Entry>,
    ) -> usize {
        let mut expired = 0;
        while let Some(&(deadline, seq)) = self.deadlines.front() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            let current = self
                .unacked
                .get(&seq)
                .is_some_and(|i| i.deadline == Some(deadline));
            if !current {
                continue;
            }
            if let Some(inflight) = self.unacked.remove(&seq) {
                self.release(inflight.conn, &inflight.entry);
                if !self.expired_holders.contains(&inflight.conn) {
                    self.expired_holders.push(inflight.conn);
                }
                self.give_back(inflight.entry, settings, now, dead);
                expired += 1;
            }
        }
        expired
    }

    /// The connections this queue deals with: each consumer (`true`), and
    /// each other connection holding an unacked delivery of it, or one
    /// taken back from it after `ack_wait` (`false`); each once. For
    /// telling them when the queue is deleted.
    pub fn holders(&self) -> Vec<(ConnRef, bool)> {
        let mut out: Vec<(ConnRef, bool)> = self.consumers.iter().map(|c| (c.conn, true)).collect();
        let others = self
            .unacked
            .values()
            .map(|inflight| inflight.conn)
            .chain(self.expired_holders.iter().copied());
        for conn in others {
            if !out.iter().any(|(c, _)| *c == conn) {
                out.push((conn, false));
            }
        }
        out
    }

    /// Registers `conn` as a consumer (again: updates its prefetch), taking
    /// at most `prefetch` deliveries and `prefetch_bytes` of bodies unacked.
    pub fn add_consumer(&mut self, conn: ConnRef, prefetch: u32, prefetch_bytes: u64) {
        match self.consumers.iter_mut().find(|c| c.conn == conn) {
            Some(c) => {
                c.prefetch = prefetch;
                c.prefetch_bytes = prefetch_bytes;
            }
            None => self.consumers.push(Consumer {
                conn,
                prefetch,
                inflight: 0,
                inflight_bytes: 0,
                prefetch_bytes,
            }),
        }
    }

    /// Forgets a closed connection's consumers, and puts in `owed` (in
    /// order) the deliveries it still owes here, for the caller to give
    /// back with [`Queue::requeue`]: a connection may owe millions (a
    /// prefetch on each of a thousand queues), more than one shard step
    /// should give back, so the giving back is the caller's to pace.
    pub fn remove_conn(&mut self, conn: ConnRef, owed: &mut Vec<u64>) {
        self.consumers.retain(|c| c.conn != conn);
        self.expired_holders.retain(|c| *c != conn);
        if self.next_consumer >= self.consumers.len() {
            self.next_consumer = 0;
        }
        owed.clear();
        owed.extend(
            self.unacked
                .iter()
                .filter(|(_, i)| i.conn == conn)
                .map(|(s, _)| *s),
        );
        owed.sort_unstable();
    }
}
