//! Rate limits (docs/ARCHITECTURE.md, "Identity and access"): per-CN token
//! buckets and caps on open connections.
//!
//! The buckets are single-threaded: every connection of one CN lives on the same
//! shard (`hash(CN) % N`), so that shard owns the CN's [`CnLimiter`] outright.
//! Connection caps are shared by all shards through [`ConnectionLimits`]; a mutex
//! is fine there because connections open rarely compared with commands.
//!
//! Time is always passed in (`now: Instant`), so the logic is deterministic and
//! testable without sleeping.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use fnv::FnvHashMap;

/// A classic token bucket: holds up to `burst` tokens, refills at
/// `rate_per_sec`, and each allowed event takes one token. Starts full.
#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    /// Tokens added per second (0 when configured non-positive or not finite).
    rate_per_sec: f64,
    /// Most tokens the bucket holds.
    burst: u32,
    /// Tokens available as of `last`.
    tokens: f64,
    /// When `tokens` was last brought up to date; `None` until first use, so a
    /// bucket built long before its first command still starts exactly full.
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket refilling at `rate_per_sec` tokens per second, holding at
    /// most `burst` tokens. A non-positive or non-finite rate never refills.
    pub(crate) fn new(rate_per_sec: f64, burst: u32) -> TokenBucket {
        TokenBucket {
            rate_per_sec: sanitize_rate(rate_per_sec),
            burst,
            tokens: f64::from(burst),
            last: None,
        }
    }

    /// Takes one token if available at `now`; false means "rate limited".
    pub(crate) fn try_take(&mut self, now: Instant) -> bool {
        self.try_take_n(now, 1)
    }

    /// Takes `n` tokens at once if that many are available at `now`, else takes
    /// nothing. More than `burst` can never succeed.
    pub(crate) fn try_take_n(&mut self, now: Instant, n: u32) -> bool {
        self.refill(now);
        self.take_if_available(f64::from(n))
    }

    /// Tokens available at `now` (for status output and tests).
    #[cfg(test)]
    pub(crate) fn available(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.tokens
    }

    /// Changes rate and burst (on `SIGHUP`), keeping the tokens already earned
    /// but no more than the new burst.
    #[cfg(test)]
    pub(crate) fn reconfigure(&mut self, rate_per_sec: f64, burst: u32) {
        self.rate_per_sec = sanitize_rate(rate_per_sec);
        self.burst = burst;
        self.tokens = self.tokens.min(f64::from(burst));
    }

    /// Most tokens this bucket holds.
    pub(crate) fn burst(&self) -> u32 {
        self.burst
    }

    fn refill(&mut self, now: Instant) {
        match self.last {
            None => self.last = Some(now),
            Some(last) => {
                // A clock reading older than `last` (callers on another task may
                // pass slightly stale instants) adds nothing and keeps `last`.
                if now > last {
                    let elapsed = now.duration_since(last).as_secs_f64();
                    self.tokens =
                        (self.tokens + elapsed * self.rate_per_sec).min(f64::from(self.burst));
                    self.last = Some(now);
                }
            }
        }
    }

    fn has(&self, n: f64) -> bool {
        // The epsilon absorbs rounding in `elapsed * rate`, so waiting exactly
        // 1/rate seconds always earns a whole token.
        self.tokens + TOKEN_EPSILON >= n
    }

    fn take_if_available(&mut self, n: f64) -> bool {
        if self.has(n) {
            self.tokens = (self.tokens - n).max(0.0);
            true
        } else {
            false
        }
    }
}

/// Rounding slack when comparing token counts (a billionth of a token).
const TOKEN_EPSILON: f64 = 1e-9;

fn sanitize_rate(rate: f64) -> f64 {
    if rate.is_finite() && rate > 0.0 {
        rate
    } else {
        0.0
    }
}

/// Token-bucket parameters per CN, from `[rate_limit]`: what each
/// [`CnLimiter`] is built with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RateSettings {
    /// Commands per second.
    pub global_rps: f64,
    /// Command burst.
    pub global_burst: u32,
    /// Publishes per second.
    pub publish_rps: f64,
    /// Publish burst.
    pub publish_burst: u32,
}

/// The two buckets of one CN: `global` for every command, `publish` for
/// publishes, which take a token from both.
#[derive(Debug, Clone)]
pub(crate) struct CnLimiter {
    /// Every command takes a token here.
    global: TokenBucket,
    /// Publishes also take a token (one per message) here.
    publish: TokenBucket,
}

impl CnLimiter {
    /// Both buckets full, from the `[rate_limit]` values.
    pub(crate) fn new(
        global_rps: f64,
        global_burst: u32,
        publish_rps: f64,
        publish_burst: u32,
    ) -> Self {
        CnLimiter {
            global: TokenBucket::new(global_rps, global_burst),
            publish: TokenBucket::new(publish_rps, publish_burst),
        }
    }

    /// Whether one command may run now. A publish needs a token in both buckets
    /// and takes from neither unless both have one.
    pub(crate) fn check(&mut self, now: Instant, is_publish: bool) -> bool {
        if is_publish {
            self.check_publish_batch(now, 1)
        } else {
            self.global.try_take(now)
        }
    }

    /// Whether a `publish_batch` of `messages` elements may run now: one global
    /// token for the command and one publish token per message. A batch larger
    /// than the publish burst is charged the whole burst (it passes only when the
    /// bucket is full), so it is throttled rather than refused forever.
    pub(crate) fn check_publish_batch(&mut self, now: Instant, messages: u32) -> bool {
        self.global.refill(now);
        self.publish.refill(now);
        let cost = f64::from(messages.clamp(1, self.publish.burst().max(1)));
        if self.global.has(1.0) && self.publish.has(cost) {
            self.global.take_if_available(1.0);
            self.publish.take_if_available(cost);
            true
        } else {
            false
        }
    }

    /// Applies reloaded `[rate_limit]` values, keeping earned tokens.
    #[cfg(test)]
    pub(crate) fn reconfigure(
        &mut self,
        global_rps: f64,
        global_burst: u32,
        publish_rps: f64,
        publish_burst: u32,
    ) {
        self.global.reconfigure(global_rps, global_burst);
        self.publish.reconfigure(publish_rps, publish_burst);
    }
}

/// Which connection cap refused a new connection; the client is told
/// `Error: connection limit reached`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum LimitExceeded {
    /// Too many open connections from one IP address.
    #[error("connection limit reached: {limit} connections from {ip}")]
    PerIp {
        /// The client's address.
        ip: IpAddr,
        /// `rate_limit.max_connections_per_ip` at the time.
        limit: u32,
    },
    /// Too many open connections with one certificate CN.
    #[error("connection limit reached: {limit} connections for CN {cn}")]
    PerCn {
        /// The client's CN.
        cn: String,
        /// `rate_limit.max_connections_per_cn` at the time.
        limit: u32,
    },
}

pub(crate) use ciphermq_admin::broker_view::ConnectionCounts;

/// Open-connection counts per IP and per CN, shared by every shard. Pass
/// `u32::MAX` as a limit to turn it off.
#[derive(Debug)]
pub(crate) struct ConnectionLimits {
    /// One lock for both maps, so a connection is counted in both or neither.
    inner: Mutex<Counts>,
}

#[derive(Debug)]
struct Counts {
    per_ip_limit: u32,
    per_cn_limit: u32,
    by_ip: FnvHashMap<IpAddr, u32>,
    by_cn: FnvHashMap<String, u32>,
}

impl ConnectionLimits {
    /// Empty counts with the given caps.
    pub(crate) fn new(per_ip: u32, per_cn: u32) -> ConnectionLimits {
        ConnectionLimits {
            inner: Mutex::new(Counts {
                per_ip_limit: per_ip,
                per_cn_limit: per_cn,
                by_ip: FnvHashMap::default(),
                by_cn: FnvHashMap::default(),
            }),
        }
    }

    /// Counts a new connection from `ip` with certificate `cn` if both are under
    /// their caps. The returned slot uncounts it when dropped, so keep it alive as
    /// long as the connection.
    pub(crate) fn try_acquire(
        self: &Arc<Self>,
        ip: IpAddr,
        cn: &str,
    ) -> Result<ConnectionSlot, LimitExceeded> {
        let mut counts = self.lock();
        let ip_count = counts.by_ip.get(&ip).copied().unwrap_or(0);
        if ip_count >= counts.per_ip_limit {
            return Err(LimitExceeded::PerIp {
                ip,
                limit: counts.per_ip_limit,
            });
        }
        let cn_count = counts.by_cn.get(cn).copied().unwrap_or(0);
        if cn_count >= counts.per_cn_limit {
            return Err(LimitExceeded::PerCn {
                cn: cn.to_owned(),
                limit: counts.per_cn_limit,
            });
        }
        counts.by_ip.insert(ip, ip_count + 1);
        counts.by_cn.insert(cn.to_owned(), cn_count + 1);
        drop(counts);
        Ok(ConnectionSlot {
            limits: Arc::clone(self),
            ip,
            cn: cn.to_owned(),
        })
    }

    /// New caps (on `SIGHUP`). Connections already open stay open even if now
    /// over the cap; only new ones are refused.
    pub(crate) fn set_limits(&self, per_ip: u32, per_cn: u32) {
        let mut counts = self.lock();
        counts.per_ip_limit = per_ip;
        counts.per_cn_limit = per_cn;
    }

    /// The caps in force (per IP, per CN), for the admin status.
    pub(crate) fn limits(&self) -> (u32, u32) {
        let counts = self.lock();
        (counts.per_ip_limit, counts.per_cn_limit)
    }

    /// Open connections by IP and by CN, each sorted, for the admin status.
    pub(crate) fn snapshot(&self) -> ConnectionCounts {
        let counts = self.lock();
        let mut by_ip: Vec<(IpAddr, u32)> = counts.by_ip.iter().map(|(k, v)| (*k, *v)).collect();
        let mut by_cn: Vec<(String, u32)> =
            counts.by_cn.iter().map(|(k, v)| (k.clone(), *v)).collect();
        drop(counts);
        by_ip.sort_unstable();
        by_cn.sort_unstable();
        (by_ip, by_cn)
    }

    fn release(&self, ip: IpAddr, cn: &str) {
        let mut counts = self.lock();
        decrement(&mut counts.by_ip, &ip);
        decrement(&mut counts.by_cn, cn);
    }

    /// The counts stay consistent even if a holder panicked (every update is a
    /// single insert or remove), so a poisoned lock is simply taken over.
    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn decrement<K, Q>(map: &mut FnvHashMap<K, u32>, key: &Q)
where
    K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
    Q: std::hash::Hash + Eq + ?Sized,
{
    if let Some(count) = map.get_mut(key) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            map.remove(key);
        }
    }
}

/// Proof that one connection is counted in [`ConnectionLimits`]; dropping it
/// (when the connection ends, on whichever shard) releases the count.
#[derive(Debug)]
#[must_use = "the connection is uncounted as soon as the slot is dropped"]
pub(crate) struct ConnectionSlot {
    /// Where to give the count back.
    limits: Arc<ConnectionLimits>,
    /// The counted client address.
    ip: IpAddr,
    /// The counted client CN.
    cn: String,
}

impl ConnectionSlot {
    /// The client address this slot counts.
    #[cfg(test)]
    pub(crate) fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The client CN this slot counts.
    #[cfg(test)]
    pub(crate) fn cn(&self) -> &str {
        &self.cn
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.limits.release(self.ip, &self.cn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn bucket_starts_full_and_empties() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1.0, 3);
        assert!(b.try_take(t0));
        assert!(b.try_take(t0));
        assert!(b.try_take(t0));
        assert!(!b.try_take(t0));
    }

    #[test]
    fn bucket_refills_by_elapsed_time() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 5);
        for _ in 0..5 {
            assert!(b.try_take(t0));
        }
        assert!(!b.try_take(t0));
        assert!(!b.try_take(t0 + ms(99)));
        assert!(b.try_take(t0 + ms(100)));
        assert!(!b.try_take(t0 + ms(100)));
        // 250 ms later: 2.5 tokens earned, so two takes succeed.
        assert!(b.try_take(t0 + ms(350)));
        assert!(b.try_take(t0 + ms(350)));
        assert!(!b.try_take(t0 + ms(350)));
        assert!((b.available(t0 + ms(350)) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn bucket_refill_survives_rounding() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(3.0, 1);
        let mut now = t0;
        assert!(b.try_take(now));
        for _ in 0..1000 {
            now += Duration::from_nanos(333_333_334);
            assert!(b.try_take(now));
            assert!(!b.try_take(now));
        }
    }

    #[test]
    fn bucket_is_capped_at_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000.0, 2);
        assert!(b.try_take(t0));
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(b.available(later), 2.0);
        assert!(b.try_take(later));
        assert!(b.try_take(later));
        assert!(!b.try_take(later));
    }

    #[test]
    fn bucket_ignores_time_going_backwards() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut b = TokenBucket::new(1.0, 1);
        assert!(b.try_take(t0));
        assert!(!b.try_take(t0 - Duration::from_secs(5)));
        // `last` stayed at t0: one second after t0 there is exactly one token.
        assert!(b.try_take(t0 + Duration::from_secs(1)));
    }

    #[test]
    fn bucket_first_use_long_after_creation_is_just_full() {
        let mut b = TokenBucket::new(100.0, 2);
        let later = Instant::now() + Duration::from_secs(60);
        assert_eq!(b.available(later), 2.0);
    }

    #[test]
    fn bucket_zero_or_bad_rate_never_refills() {
        let t0 = Instant::now();
        for rate in [0.0, -5.0, f64::NAN, f64::INFINITY] {
            let mut b = TokenBucket::new(rate, 1);
            assert!(b.try_take(t0));
            assert!(!b.try_take(t0 + Duration::from_secs(1000)), "{rate}");
        }
    }

    #[test]
    fn bucket_take_n_is_all_or_nothing() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1.0, 5);
        assert!(b.try_take_n(t0, 3));
        assert!(!b.try_take_n(t0, 3));
        assert_eq!(b.available(t0), 2.0);
        assert!(!b.try_take_n(t0, 6));
    }

    #[test]
    fn bucket_reconfigure_caps_tokens() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1.0, 10);
        b.reconfigure(100.0, 4);
        assert_eq!(b.burst(), 4);
        assert_eq!(b.available(t0), 4.0);
        for _ in 0..4 {
            assert!(b.try_take(t0));
        }
        assert!(!b.try_take(t0));
        assert!(b.try_take(t0 + ms(10)));
    }

    #[test]
    fn cn_limiter_plain_commands_use_global_only() {
        let t0 = Instant::now();
        let mut l = CnLimiter::new(1.0, 2, 1.0, 1);
        assert!(l.check(t0, false));
        assert!(l.check(t0, false));
        assert!(!l.check(t0, false));
        assert!(!l.check(t0, true), "publish also needs a global token");
        // The publish bucket was untouched by the failed publish.
        assert!(l.check(t0 + Duration::from_secs(1), true));
    }

    #[test]
    fn cn_limiter_publish_takes_from_both() {
        let t0 = Instant::now();
        let mut l = CnLimiter::new(1.0, 10, 1.0, 2);
        assert!(l.check(t0, true));
        assert!(l.check(t0, true));
        assert!(!l.check(t0, true), "publish bucket empty");
        // The failed publish took no global token: 8 remain.
        for _ in 0..8 {
            assert!(l.check(t0, false));
        }
        assert!(!l.check(t0, false));
    }

    #[test]
    fn cn_limiter_publish_batch() {
        let t0 = Instant::now();
        let mut l = CnLimiter::new(100.0, 100, 10.0, 10);
        assert!(l.check_publish_batch(t0, 6));
        assert!(!l.check_publish_batch(t0, 6));
        assert!(l.check_publish_batch(t0, 4));
        // Larger than the burst: charged the full burst once the bucket refills.
        assert!(!l.check_publish_batch(t0 + ms(500), 50));
        assert!(l.check_publish_batch(t0 + Duration::from_secs(1), 50));
        assert!(!l.check(t0 + Duration::from_secs(1), true));
        // Empty batches still cost one publish token (they are commands).
        assert!(l.check_publish_batch(t0 + Duration::from_secs(2), 0));
    }

    #[test]
    fn cn_limiter_reconfigure() {
        let t0 = Instant::now();
        let mut l = CnLimiter::new(1.0, 1, 1.0, 1);
        assert!(l.check(t0, false));
        l.reconfigure(1000.0, 5, 1000.0, 5);
        assert!(l.check(t0 + ms(5), true));
    }

    fn v4(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn connection_caps_per_ip_and_cn() {
        let limits = Arc::new(ConnectionLimits::new(2, 3));
        let a = limits.try_acquire(v4(1), "alice").unwrap();
        let b = limits.try_acquire(v4(1), "bob").unwrap();
        assert_eq!(
            limits.try_acquire(v4(1), "carol").unwrap_err(),
            LimitExceeded::PerIp {
                ip: v4(1),
                limit: 2
            }
        );
        let c = limits.try_acquire(v4(2), "alice").unwrap();
        let d = limits.try_acquire(v4(3), "alice").unwrap();
        let e = limits.try_acquire(v4(4), "alice").unwrap_err();
        assert_eq!(
            e,
            LimitExceeded::PerCn {
                cn: "alice".to_owned(),
                limit: 3
            }
        );
        assert_eq!(
            e.to_string(),
            "connection limit reached: 3 connections for CN alice"
        );
        // A refused attempt counts nowhere.
        let (ips, cns) = limits.snapshot();
        assert_eq!(ips, vec![(v4(1), 2), (v4(2), 1), (v4(3), 1)]);
        assert_eq!(cns, vec![("alice".to_owned(), 3), ("bob".to_owned(), 1)]);
        assert_eq!(a.ip(), v4(1));
        assert_eq!(a.cn(), "alice");
        drop((a, b, c, d));
        assert_eq!(limits.snapshot(), (vec![], vec![]));
    }

    #[test]
    fn slot_drop_frees_room() {
        let limits = Arc::new(ConnectionLimits::new(1, 1));
        let ip = IpAddr::V6(Ipv6Addr::LOCALHOST);
        let slot = limits.try_acquire(ip, "r").unwrap();
        assert!(limits.try_acquire(ip, "r").is_err());
        drop(slot);
        let _again = limits.try_acquire(ip, "r").unwrap();
    }

    #[test]
    fn set_limits_applies_to_new_connections_only() {
        let limits = Arc::new(ConnectionLimits::new(10, 10));
        let slots: Vec<_> = (0..3)
            .map(|_| limits.try_acquire(v4(1), "x").unwrap())
            .collect();
        limits.set_limits(2, 10);
        assert!(matches!(
            limits.try_acquire(v4(1), "y"),
            Err(LimitExceeded::PerIp { limit: 2, .. })
        ));
        assert_eq!(limits.snapshot().0, vec![(v4(1), 3)]);
        drop(slots);
        let _ok = limits.try_acquire(v4(1), "y").unwrap();
        limits.set_limits(u32::MAX, u32::MAX);
        let more: Vec<_> = (0..100)
            .map(|_| limits.try_acquire(v4(1), "y").unwrap())
            .collect();
        assert_eq!(more.len(), 100);
    }

    #[test]
    fn slots_work_across_threads() {
        let limits = Arc::new(ConnectionLimits::new(1000, 1000));
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let limits = Arc::clone(&limits);
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        let slot = limits.try_acquire(v4(t), "cn").unwrap();
                        drop(slot);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(limits.snapshot(), (vec![], vec![]));
    }
}
