//! Redirects in a cluster: `NACK <id> moved <owner> <node_id> <host:port>
//! <epoch>` and `Error: moved <owner> <node_id> <host:port> <epoch>` say
//! which node holds an owner, under which fencing epoch.

use std::fmt;

/// Where a redirect sends the client: the text after `moved `.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redirect<'a> {
    /// The owner (a receiver CN) the command was about.
    pub owner: &'a str,
    /// The node that holds it.
    pub node_id: &'a str,
    /// That node's address for clients.
    pub address: &'a str,
    /// The placement's epoch: a client keeps the highest it has seen for an
    /// owner and never follows a lower one.
    pub epoch: u64,
}

impl<'a> Redirect<'a> {
    /// Reads `moved <owner> <node_id> <host:port> <epoch>`: a `NACK`'s
    /// reason or an `Error:` line's text. `None` for anything else.
    pub fn parse(text: &'a str) -> Option<Redirect<'a>> {
        let rest = text.strip_prefix("moved ")?;
        let mut words = rest.split(' ');
        let owner = words.next().filter(|w| !w.is_empty())?;
        let node_id = words.next().filter(|w| !w.is_empty())?;
        let address = words.next().filter(|w| !w.is_empty())?;
        let epoch = words.next()?.parse().ok()?;
        if words.next().is_some() {
            return None;
        }
        Some(Redirect {
            owner,
            node_id,
            address,
            epoch,
        })
    }
}

impl fmt::Display for Redirect<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "moved {} {} {} {}",
            self.owner, self.node_id, self.address, self.epoch
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Reply;

    #[test]
    fn both_redirect_lines_parse_and_print_back() {
        let nack = "NACK m1 moved receiver_1 node-a 10.0.0.1:5700 3";
        let Reply::Nack { reason, .. } = Reply::parse(nack) else {
            panic!("a NACK");
        };
        let r = Redirect::parse(reason).expect("a redirect");
        assert_eq!(
            r,
            Redirect {
                owner: "receiver_1",
                node_id: "node-a",
                address: "10.0.0.1:5700",
                epoch: 3
            }
        );
        assert_eq!(format!("NACK m1 {r}"), nack);
        let Reply::Error(text) = Reply::parse("Error: moved r n [::1]:5700 1") else {
            panic!("an error");
        };
        assert_eq!(Redirect::parse(text).map(|r| r.address), Some("[::1]:5700"));
    }

    #[test]
    fn anything_else_is_no_redirect() {
        for text in [
            "no_route",
            "moved",
            "moved r n a",
            "moved r n a x",
            "moved r n a 1 extra",
            "moved  n a 1",
            "unknown queue moved",
        ] {
            assert_eq!(Redirect::parse(text), None, "{text:?}");
        }
    }
}
