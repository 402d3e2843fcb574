//! The exchange catalogue: the first declaration wins, only its owner
//! deletes it.

mod common;

use ciphermq_cluster::{ClusterError, Coordinator, Exchange};
use common::TestSchema;

fn exchange(name: &str, kind: &str, owner: &str) -> Exchange {
    Exchange {
        name: name.to_owned(),
        kind: kind.to_owned(),
        owner: owner.to_owned(),
    }
}

#[test]
fn the_first_declaration_wins_and_another_kind_conflicts() {
    let db = TestSchema::new();
    let one = db.coordinator();
    let two = db.coordinator();
    let orders = exchange("orders", "topic", "alice");
    assert_eq!(
        one.declare_exchange("orders", "topic", "alice").unwrap(),
        orders
    );
    // Same kind, another declarer: the stored row, owner unchanged.
    assert_eq!(
        two.declare_exchange("orders", "topic", "bob").unwrap(),
        orders
    );
    assert_eq!(
        two.declare_exchange("orders", "fanout", "bob"),
        Err(ClusterError::ExchangeKindConflict {
            name: "orders".to_owned(),
            stored_kind: "topic".to_owned(),
            requested_kind: "fanout".to_owned(),
            stored_owner: "alice".to_owned(),
        })
    );
    two.declare_exchange("audit", "fanout", "bob").unwrap();
    assert_eq!(
        one.exchanges().unwrap(),
        [exchange("audit", "fanout", "bob"), orders]
    );
}

#[test]
fn only_the_owner_deletes_an_exchange() {
    let db = TestSchema::new();
    let coordinator = db.coordinator();
    coordinator
        .declare_exchange("orders", "direct", "alice")
        .unwrap();
    assert_eq!(
        coordinator.delete_exchange("orders", "bob"),
        Err(ClusterError::NotExchangeOwner {
            name: "orders".to_owned(),
            owner: "bob".to_owned(),
            stored_owner: "alice".to_owned(),
        })
    );
    coordinator.delete_exchange("orders", "alice").unwrap();
    assert_eq!(coordinator.exchanges().unwrap(), []);
    assert_eq!(
        coordinator.delete_exchange("orders", "alice"),
        Err(ClusterError::NoSuchExchange {
            name: "orders".to_owned()
        })
    );
    // Free again: a new declaration of another kind wins.
    assert_eq!(
        coordinator
            .declare_exchange("orders", "fanout", "bob")
            .unwrap(),
        exchange("orders", "fanout", "bob")
    );
}
