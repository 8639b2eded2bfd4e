//! The slot streamed (`outbox relay` over a replication connection): pgoutput sends a relation's
//! message once per stream, before its first row, where a read of the slot
//! (`outbox_log_read`) sends it in each read. Messages are put together here into whole
//! transactions, each naming the relations of its rows, so that each can be read on its own
//! (`crate::log::read_events`) as a read's messages are.

use std::collections::HashMap;

use super::pgoutput::{frame, Frame, MalformedMessage};

/// One committed transaction's messages, from its begin to its commit, and the position just
/// past its commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    pub messages: Vec<Vec<u8>>,
    pub end: u64,
}

#[derive(Debug, Default)]
pub struct Transactions {
    /// The last message of each relation the stream sent.
    relations: HashMap<u32, Vec<u8>>,
    /// The transaction begun and not yet committed, with the relations it already names.
    open: Option<(Vec<Vec<u8>>, Vec<u32>)>,
}

impl Transactions {
    /// Takes the stream's next message; the transaction it commits, if it is a commit.
    pub fn push(&mut self, data: Vec<u8>) -> Result<Option<Transaction>, MalformedMessage> {
        let frame = frame(&data)?;
        if frame == Frame::Begin {
            self.open = Some((Vec::new(), Vec::new()));
        }
        let Some((messages, named)) = self.open.as_mut() else {
            // Outside a transaction pgoutput sends nothing a read needs (a relation comes
            // again in the transaction of its first row).
            if let Frame::Relation { id } = frame {
                self.relations.insert(id, data);
            }
            return Ok(None);
        };
        match frame {
            Frame::Relation { id } => {
                self.relations.insert(id, data.clone());
                named.push(id);
            }
            Frame::Row { relation } if !named.contains(&relation) => {
                if let Some(message) = self.relations.get(&relation) {
                    messages.push(message.clone());
                }
                named.push(relation);
            }
            _ => {}
        }
        messages.push(data);
        let Frame::Commit { end } = frame else { return Ok(None) };
        let (messages, _) = self.open.take().expect("a transaction is open");
        Ok(Some(Transaction { messages, end }))
    }

    /// Whether a transaction is begun and not committed: a position the stream reports now is
    /// not one to confirm.
    pub fn in_transaction(&self) -> bool {
        self.open.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::tests::commit;

    fn relation(id: u32) -> Vec<u8> {
        let mut data = vec![b'R'];
        data.extend(id.to_be_bytes());
        data.extend(b"public\0outbox_log\0d\0\0");
        data
    }

    fn insert(id: u32) -> Vec<u8> {
        let mut data = vec![b'I'];
        data.extend(id.to_be_bytes());
        data.extend(b"N\0\0");
        data
    }

    fn stream(transactions: &mut Transactions, messages: &[Vec<u8>]) -> Vec<Transaction> {
        messages.iter().filter_map(|m| transactions.push(m.clone()).unwrap()).collect()
    }

    #[test]
    fn each_transaction_names_the_relations_of_its_rows() {
        let mut transactions = Transactions::default();
        let first = stream(&mut transactions, &[b"B".to_vec(), relation(7), insert(7), insert(7), commit(100)]);
        assert_eq!(first, vec![Transaction { messages: vec![b"B".to_vec(), relation(7), insert(7), insert(7), commit(100)], end: 100 }]);
        // The stream sends relation 7 no more: the second transaction names it all the same.
        let second = stream(&mut transactions, &[b"B".to_vec(), insert(7), commit(200)]);
        assert_eq!(second, vec![Transaction { messages: vec![b"B".to_vec(), relation(7), insert(7), commit(200)], end: 200 }]);
    }

    #[test]
    fn a_transaction_is_handed_out_only_once_committed() {
        let mut transactions = Transactions::default();
        assert!(stream(&mut transactions, &[b"B".to_vec(), relation(7), insert(7)]).is_empty());
        assert!(transactions.in_transaction());
        assert_eq!(stream(&mut transactions, &[commit(300)]).len(), 1);
        assert!(!transactions.in_transaction());
    }

    #[test]
    fn a_relation_sent_again_replaces_the_one_before() {
        let mut transactions = Transactions::default();
        stream(&mut transactions, &[b"B".to_vec(), relation(7), insert(7), commit(100)]);
        let mut changed = relation(7);
        changed.push(b'x');
        stream(&mut transactions, &[b"B".to_vec(), changed.clone(), insert(7), commit(200)]);
        let third = stream(&mut transactions, &[b"B".to_vec(), insert(7), commit(300)]);
        assert_eq!(third[0].messages[1], changed);
    }

    #[test]
    fn a_malformed_message_is_an_error() {
        assert!(Transactions::default().push(b"C\0".to_vec()).is_err());
    }
}
