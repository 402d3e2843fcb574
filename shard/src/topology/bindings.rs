//! Bindings: bind, unbind, and installing the broker's [`BindingRule`],
//! which judges every binding already there.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use ciphermq_proto::ExchangeKind;

use super::{
    Actor, Binding, BindingId, BindingRule, RemovedBinding, Topology, TopologyError,
    FANOUT_NOT_OWNED,
};
use crate::quota::Resource;
use crate::routing::{Exchange, Target};

impl Topology {
    /// `bind`: ownership of a fanout exchange is checked before whether the
    /// queue exists (ownership before existence, as the ACL does), then the
    /// installed rule, if any, has its say.
    pub(super) fn bind(
        &mut self,
        queue: &str,
        exchange: &str,
        key: &str,
        by: Option<&Actor>,
    ) -> Result<bool, TopologyError> {
        if let (Some(Actor::Receiver(cn)), Some(ex)) = (by, self.exchanges.get(exchange)) {
            if ex.kind() == ExchangeKind::Fanout && self.exchange_owner(exchange) != Some(&**cn) {
                return Err(TopologyError::Denied(FANOUT_NOT_OWNED.into()));
            }
        }
        let info = self
            .queues
            .get(queue)
            .ok_or_else(|| TopologyError::UnknownQueue(queue.to_owned()))?;
        let ex = self
            .exchanges
            .get(exchange)
            .ok_or_else(|| TopologyError::UnknownExchange(exchange.to_owned()))?;
        if let (Some(rule), Some(_)) = (&self.rule, by) {
            let binding = Binding {
                exchange,
                kind: ex.kind(),
                exchange_owner: self.exchange_owners.get(exchange).map(|o| &**o),
                key,
                queue: info,
                bound_by: by,
            };
            rule.check(&binding).map_err(TopologyError::Denied)?;
        }
        let target = Target {
            queue: info.name.clone(),
            shard: info.shard,
            confined_to: self.rule.as_ref().and_then(|rule| rule.confined_to(info)),
        };
        let id = BindingId::new(exchange, key, queue);
        if self.binders.contains_key(&id) {
            return Ok(false);
        }
        if let Some(Actor::Receiver(cn)) = by {
            self.check_quota(by, cn, Resource::Bindings)?;
            self.count(cn, Resource::Bindings, 1);
        }
        self.binders.insert(id, by.cloned());
        if let Some(ex) = self.exchanges.get_mut(exchange) {
            Arc::make_mut(ex).bind(key, target);
        }
        Ok(true)
    }

    /// `unbind`: the exchange's routing index has no removal, so it is
    /// rebuilt without the binding (bounded by the binding quotas).
    pub(super) fn unbind(
        &mut self,
        queue: &str,
        exchange: &str,
        key: &str,
    ) -> Result<bool, TopologyError> {
        if !self.exchanges.contains_key(exchange) {
            return Err(TopologyError::UnknownExchange(exchange.to_owned()));
        }
        if !self.queues.contains_key(queue) {
            return Err(TopologyError::UnknownQueue(queue.to_owned()));
        }
        if !self
            .binders
            .contains_key(&BindingId::new(exchange, key, queue))
        {
            return Ok(false);
        }
        self.forget_binding(exchange, key, queue);
        if let Some(ex) = self.exchanges.get_mut(exchange) {
            let mut rebuilt = Exchange::new(ex.kind());
            for (bound_key, target) in ex.bindings() {
                if !(bound_key == key && &*target.queue == queue) {
                    rebuilt.bind(bound_key, target.clone());
                }
            }
            *ex = Arc::new(rebuilt);
        }
        Ok(true)
    }

    /// Drops the record of a binding (and its count for whoever made it);
    /// the caller removes it from its exchange.
    pub(super) fn forget_binding(&mut self, exchange: &str, key: &str, queue: &str) {
        if let Some(Some(Actor::Receiver(cn))) =
            self.binders.remove(&BindingId::new(exchange, key, queue))
        {
            self.count(&cn, Resource::Bindings, -1);
        }
    }

    /// Installs `rule` and removes every binding it refuses, returning them.
    pub(super) fn install_rule(&mut self, rule: Arc<dyn BindingRule>) -> Vec<RemovedBinding> {
        let mut removed = Vec::new();
        for (name, ex) in &self.exchanges {
            let owner = self.exchange_owners.get(name).map(|o| &**o);
            for (key, target) in ex.bindings() {
                let Some(queue) = self.queues.get(&target.queue) else {
                    continue;
                };
                let bound_by = self
                    .binders
                    .get(&BindingId::new(name, key, &target.queue))
                    .and_then(Option::as_ref);
                let binding = Binding {
                    exchange: name,
                    kind: ex.kind(),
                    exchange_owner: owner,
                    key,
                    queue,
                    bound_by,
                };
                if let Err(reason) = rule.check(&binding) {
                    removed.push(RemovedBinding {
                        exchange: name.to_string(),
                        key: key.to_owned(),
                        queue: target.queue.to_string(),
                        bound_by: bound_by.cloned(),
                        reason,
                    });
                }
            }
        }
        // The routing index has no removal.
        let mut gone: HashMap<&str, Vec<(&str, &str)>> = HashMap::new();
        for r in &removed {
            self.forget_binding(&r.exchange, &r.key, &r.queue);
            gone.entry(&r.exchange)
                .or_default()
                .push((&r.key, &r.queue));
        }
        // Every exchange is rebuilt once, without those, keeping the others
        // in order, each target confined to its owner as the new rule says
        // (a reload may make a CN a receiver, or no longer one).
        let names: Vec<Arc<str>> = self.exchanges.keys().cloned().collect();
        for name in names {
            let pairs: HashSet<(&str, &str)> = gone
                .remove(&*name)
                .unwrap_or_default()
                .into_iter()
                .collect();
            if let Some(ex) = self.exchanges.get_mut(&name) {
                let mut rebuilt = Exchange::new(ex.kind());
                for (key, target) in ex.bindings() {
                    if pairs.contains(&(key, &*target.queue)) {
                        continue;
                    }
                    let confined_to = self
                        .queues
                        .get(&target.queue)
                        .and_then(|q| rule.confined_to(q));
                    rebuilt.bind(
                        key,
                        Target {
                            confined_to,
                            ..target.clone()
                        },
                    );
                }
                *ex = Arc::new(rebuilt);
            }
        }
        self.rule = Some(rule);
        removed
    }
}
