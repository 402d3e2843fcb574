//! The `ciphermq/1` lines `ciphermq-admin` sends to the broker port, built
//! only from arguments that pass the protocol's name rules.
//!
//! A protocol line ends at a newline and its arguments end at a space, so
//! an argument holding either would end the command early and start
//! another: `purge $'x\ndelete_queue q'` would also delete `q`. Every
//! argument is therefore checked before anything is sent, against the rule
//! of what it is (a queue, exchange, client id, owner or node id:
//! [`is_valid_name`]; a binding key: [`check_routing_pattern`]), and a
//! refusal names the argument and why.

use std::fmt;
use std::time::Duration;

use ciphermq_proto::name::{check_routing_pattern, is_valid_name, RoutingKeyError, MAX_NAME_LEN};

use crate::remote::REQUEST_TIMEOUT;

/// How long a `move` may take to be answered: the broker answers once the
/// move has ended or been given up, which can take about 35 s, so the
/// default [`REQUEST_TIMEOUT`] would stop waiting for a move still under
/// way.
pub const MOVE_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest piece of a refused argument quoted back: the message goes to a
/// terminal, and the argument may be anything.
const QUOTE_MAX: usize = 80;

/// Why an argument cannot go into a protocol line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArgumentProblem {
    /// It is empty.
    Empty,
    /// Longer than [`MAX_NAME_LEN`] bytes (its length).
    TooLong(usize),
    /// It holds a space, tab or other whitespace: the protocol would read
    /// two arguments.
    Whitespace,
    /// It holds a newline or another control character: the protocol would
    /// read two lines, two commands.
    Control,
    /// It holds a character outside the name alphabet.
    Character(char),
    /// `.` or `..`: a queue's name is a directory name.
    DotName,
    /// A binding key with too many words or `#` wildcards.
    BindingKey(RoutingKeyError),
}

impl fmt::Display for ArgumentProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgumentProblem::Empty => f.write_str("it is empty"),
            ArgumentProblem::TooLong(len) => {
                write!(f, "it is {len} bytes long, more than {MAX_NAME_LEN}")
            }
            ArgumentProblem::Whitespace => {
                f.write_str("it holds whitespace, which would split it into two arguments")
            }
            ArgumentProblem::Control => f.write_str(
                "it holds a newline or another control character, which would end the \
                 command and start another",
            ),
            ArgumentProblem::Character(c) => write!(f, "it holds {c:?}"),
            ArgumentProblem::DotName => f.write_str("`.` and `..` are not names"),
            ArgumentProblem::BindingKey(e) => e.fmt(f),
        }
    }
}

/// An argument refused before anything was sent: which one, its value
/// (quoted with escapes, shortened) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {}: {problem}; {rule}", quote(value))]
pub struct ArgumentError {
    /// What the argument is (`queue`, `exchange`, `binding key`, `client id`,
    /// `owner`, `node id`).
    pub what: &'static str,
    /// The argument as given.
    pub value: String,
    /// What is wrong with it.
    pub problem: ArgumentProblem,
    /// The rule it must follow, for the message.
    rule: &'static str,
}

/// The rule of names, as the messages state it.
const NAME_RULE: &str = "names are 1 to 255 of A-Z a-z 0-9 _ . : - (not . or ..)";
/// The rule of binding keys, as the messages state it.
const KEY_RULE: &str =
    "binding keys are names that may also hold the words * and # (at most 32 words, 8 #)";

/// `value` between quotes, escaped (a newline shows as `\n`), at most
/// [`QUOTE_MAX`] characters of it.
fn quote(value: &str) -> String {
    match value.char_indices().nth(QUOTE_MAX) {
        Some((at, _)) => format!("{:?}… ({} bytes)", &value[..at], value.len()),
        None => format!("{value:?}"),
    }
}

/// The first thing about `value` that no argument may hold, whatever its
/// kind: emptiness, length, whitespace, control characters. `extra` are the
/// characters its kind allows beyond the name alphabet.
fn common_problem(value: &str, extra: &[char]) -> Option<ArgumentProblem> {
    if value.is_empty() {
        return Some(ArgumentProblem::Empty);
    }
    // Control characters first: they are what turns one line into two.
    if value.chars().any(char::is_control) {
        return Some(ArgumentProblem::Control);
    }
    if value.chars().any(char::is_whitespace) {
        return Some(ArgumentProblem::Whitespace);
    }
    if value.len() > MAX_NAME_LEN {
        return Some(ArgumentProblem::TooLong(value.len()));
    }
    value
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || "_.:-".contains(c) || extra.contains(&c)))
        .map(ArgumentProblem::Character)
}

/// Checks a queue, exchange, client id, owner or node id argument.
fn name(what: &'static str, value: &str) -> Result<(), ArgumentError> {
    if is_valid_name(value) {
        return Ok(());
    }
    let problem = common_problem(value, &[]).unwrap_or(ArgumentProblem::DotName);
    Err(ArgumentError {
        what,
        value: value.to_owned(),
        problem,
        rule: NAME_RULE,
    })
}

/// Checks a binding key argument.
fn binding_key(what: &'static str, value: &str) -> Result<(), ArgumentError> {
    let problem = match check_routing_pattern(value) {
        Ok(()) => return Ok(()),
        Err(RoutingKeyError::InvalidName) => {
            common_problem(value, &['*', '#']).unwrap_or(ArgumentProblem::DotName)
        }
        Err(e) => ArgumentProblem::BindingKey(e),
    };
    Err(ArgumentError {
        what,
        value: value.to_owned(),
        problem,
        rule: KEY_RULE,
    })
}

/// Checks a node id given to a command that sends its lines later
/// (`drain <node_id>` reads the cluster first), by the rule `move` applies
/// to it, so that a bad one is refused before anything is read.
pub fn check_node_id(node_id: &str) -> Result<(), ArgumentError> {
    name("node id", node_id)
}

/// One `ciphermq/1` command line, without its newline, whose every
/// argument passed its rule: it is exactly one command, whatever the
/// arguments were. It also knows how long its reply may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandLine {
    /// The line.
    line: String,
    /// How long the broker may take to answer it.
    within: Duration,
}

impl CommandLine {
    /// A line answered within [`REQUEST_TIMEOUT`], as most are.
    fn quick(line: String) -> CommandLine {
        CommandLine {
            line,
            within: REQUEST_TIMEOUT,
        }
    }

    /// `purge_queue <queue>`.
    pub fn purge_queue(queue: &str) -> Result<CommandLine, ArgumentError> {
        name("queue", queue)?;
        Ok(CommandLine::quick(format!("purge_queue {queue}")))
    }

    /// `delete_queue <queue>`.
    pub fn delete_queue(queue: &str) -> Result<CommandLine, ArgumentError> {
        name("queue", queue)?;
        Ok(CommandLine::quick(format!("delete_queue {queue}")))
    }

    /// `delete_exchange <exchange>`.
    pub fn delete_exchange(exchange: &str) -> Result<CommandLine, ArgumentError> {
        name("exchange", exchange)?;
        Ok(CommandLine::quick(format!("delete_exchange {exchange}")))
    }

    /// `unbind <queue> <exchange> <binding key>`.
    pub fn unbind(queue: &str, exchange: &str, key: &str) -> Result<CommandLine, ArgumentError> {
        name("queue", queue)?;
        name("exchange", exchange)?;
        binding_key("binding key", key)?;
        Ok(CommandLine::quick(format!(
            "unbind {queue} {exchange} {key}"
        )))
    }

    /// `close_connection <client id>`.
    pub fn close_connection(client_id: &str) -> Result<CommandLine, ArgumentError> {
        name("client id", client_id)?;
        Ok(CommandLine::quick(format!("close_connection {client_id}")))
    }

    /// `move <owner> <node id>`: moves an owner (a receiver CN, or the CN
    /// that declared an admin queue) with its queues to another node of the
    /// cluster. Answered once the move ended, so within [`MOVE_TIMEOUT`].
    pub fn move_owner(owner: &str, node_id: &str) -> Result<CommandLine, ArgumentError> {
        name("owner", owner)?;
        name("node id", node_id)?;
        Ok(CommandLine {
            line: format!("move {owner} {node_id}"),
            within: MOVE_TIMEOUT,
        })
    }

    /// The line, without its newline.
    pub fn as_str(&self) -> &str {
        &self.line
    }

    /// How long to wait for its reply, connection included: longer than
    /// [`REQUEST_TIMEOUT`] for a command answered once its work is done.
    pub fn reply_within(&self) -> Duration {
        self.within
    }
}

impl fmt::Display for CommandLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_arguments_make_one_line() {
        assert_eq!(
            CommandLine::purge_queue("receiver_1_queue")
                .unwrap()
                .as_str(),
            "purge_queue receiver_1_queue"
        );
        assert_eq!(
            CommandLine::unbind("q", "ex", "receiver_1.#")
                .unwrap()
                .as_str(),
            "unbind q ex receiver_1.#"
        );
        assert_eq!(
            CommandLine::close_connection("sender_1").unwrap().as_str(),
            "close_connection sender_1"
        );
        assert_eq!(
            CommandLine::close_connection("sender_1")
                .unwrap()
                .reply_within(),
            REQUEST_TIMEOUT
        );
    }

    #[test]
    fn a_move_names_owner_and_node_and_waits_longer_for_its_reply() {
        let line = CommandLine::move_owner("receiver_1", "node-b").unwrap();
        assert_eq!(line.as_str(), "move receiver_1 node-b");
        assert_eq!(line.to_string(), "move receiver_1 node-b");
        // The broker may take about 35 s to answer a move.
        assert_eq!(line.reply_within(), MOVE_TIMEOUT);
        assert!(MOVE_TIMEOUT > REQUEST_TIMEOUT && MOVE_TIMEOUT >= Duration::from_secs(40));

        let e = CommandLine::move_owner("receiver_1 node-a", "node-b").unwrap_err();
        assert_eq!((e.what, e.problem), ("owner", ArgumentProblem::Whitespace));
        let e = CommandLine::move_owner("receiver_1", "node-b\nclose_connection x").unwrap_err();
        assert_eq!((e.what, e.problem), ("node id", ArgumentProblem::Control));
        assert!(!e.to_string().contains('\n'), "{e}");
        let e = CommandLine::move_owner("", "node-b").unwrap_err();
        assert_eq!((e.what, e.problem), ("owner", ArgumentProblem::Empty));
        let e = CommandLine::move_owner("receiver_1", "..").unwrap_err();
        assert_eq!((e.what, e.problem), ("node id", ArgumentProblem::DotName));
        let e = CommandLine::move_owner("receiver/1", "node-b").unwrap_err();
        assert_eq!(e.problem, ArgumentProblem::Character('/'));
        assert!(
            e.to_string().starts_with(r#"invalid owner "receiver/1": "#),
            "{e}"
        );

        // `drain` checks its node id by the same rule, before reading.
        assert_eq!(check_node_id("node-a"), Ok(()));
        let e = check_node_id("node a").unwrap_err();
        assert_eq!(
            (e.what, e.problem),
            ("node id", ArgumentProblem::Whitespace)
        );
        assert_eq!(
            check_node_id("").unwrap_err().problem,
            ArgumentProblem::Empty
        );
    }

    #[test]
    fn an_argument_that_would_add_a_command_is_refused_and_named() {
        let e = CommandLine::purge_queue("x\ndelete_queue receiver_2_queue").unwrap_err();
        assert_eq!((e.what, e.problem), ("queue", ArgumentProblem::Control));
        let text = e.to_string();
        assert!(
            text.starts_with(r#"invalid queue "x\ndelete_queue receiver_2_queue": "#),
            "{text}"
        );
        assert!(!text.contains('\n'), "escaped, never echoed raw: {text}");
        for bad in ["x\r", "x\0", "x\u{1b}[2J", "x\u{85}y"] {
            let e = CommandLine::delete_queue(bad).unwrap_err();
            assert_eq!(e.problem, ArgumentProblem::Control, "{bad:?}");
        }
    }

    #[test]
    fn each_argument_is_checked_by_its_own_rule() {
        let e = CommandLine::unbind("q", "ex", "k extra").unwrap_err();
        assert_eq!(
            (e.what, e.problem),
            ("binding key", ArgumentProblem::Whitespace)
        );
        let e = CommandLine::unbind("q", "e\tx", "k").unwrap_err();
        assert_eq!((e.what, e.problem), ("exchange", ArgumentProblem::Control));
        let e = CommandLine::unbind("q/..", "ex", "k").unwrap_err();
        assert_eq!(
            (e.what, e.problem),
            ("queue", ArgumentProblem::Character('/'))
        );
        // Wildcards are a binding key's, never a name's.
        let e = CommandLine::delete_exchange("ex.*").unwrap_err();
        assert_eq!(e.problem, ArgumentProblem::Character('*'));
        let e = CommandLine::close_connection("..").unwrap_err();
        assert_eq!((e.what, e.problem), ("client id", ArgumentProblem::DotName));
        let e = CommandLine::close_connection("").unwrap_err();
        assert_eq!(e.problem, ArgumentProblem::Empty);
        let e = CommandLine::purge_queue(&"q".repeat(256)).unwrap_err();
        assert_eq!(e.problem, ArgumentProblem::TooLong(256));
        assert!(e.to_string().contains("… (256 bytes)"), "{e}");
        let e = CommandLine::unbind("q", "ex", &"a.".repeat(40)).unwrap_err();
        assert_eq!(
            e.problem,
            ArgumentProblem::BindingKey(RoutingKeyError::TooManyWords)
        );
        let e = CommandLine::purge_queue("caf\u{e9}").unwrap_err();
        assert_eq!(e.problem, ArgumentProblem::Character('\u{e9}'));
    }
}
