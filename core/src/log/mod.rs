//! Log mode: events read back from the logical replication slot (sql/log.sql), as
//! `outbox_log_read` returns its pgoutput messages.

pub mod batch;
pub mod failing;
pub mod pgoutput;
pub mod routes;
pub mod stream;

use std::collections::HashMap;

use pgoutput::{parse, MalformedMessage, Message, Relation};

/// An event as outbox_log holds it, its columns as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEvent {
    pub id: i64,
    pub topic: String,
    pub payload: String,
    pub key: Option<String>,
    pub created_at: String,
}

/// The events of the whole transactions one read returned, in commit order, and the position
/// just past the last of them (none if no transaction ended in the read).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LogRead {
    pub events: Vec<LogEvent>,
    pub end: Option<u64>,
}

/// Why a read's messages are not what log mode writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    #[error(transparent)]
    Malformed(#[from] MalformedMessage),
    #[error("a row of relation {0}, which no message named")]
    UnknownRelation(u32),
    #[error("outbox_log has no column {0}")]
    MissingColumn(&'static str),
    #[error("an event whose {0} is not valid")]
    BadValue(&'static str),
}

/// The events in `messages` (pgoutput, in the order the slot returned them): the rows of
/// relation `log_relation`, outbox_log's oid, and of no other, whatever its name (a table of
/// anyone's may be called outbox_log). Rows of a transaction the read cut short (none: a read
/// returns whole transactions) are left for the next read.
pub fn read_events<'a>(messages: impl IntoIterator<Item = &'a [u8]>, log_relation: u32) -> Result<LogRead, LogError> {
    let mut relations: HashMap<u32, Relation> = HashMap::new();
    let mut read = LogRead::default();
    let mut open: Vec<LogEvent> = Vec::new();
    for data in messages {
        match parse(data)? {
            Message::Begin { .. } => open.clear(),
            Message::Relation(relation) => {
                relations.insert(relation.id, relation);
            }
            Message::Insert { relation, values } => {
                let relation = relations.get(&relation).ok_or(LogError::UnknownRelation(relation))?;
                if relation.id == log_relation {
                    open.push(event(relation, values)?);
                }
            }
            Message::Commit { end } => {
                read.events.append(&mut open);
                read.end = Some(end);
            }
            Message::Other(_) => {}
        }
    }
    Ok(read)
}

fn event(relation: &Relation, mut values: Vec<Option<String>>) -> Result<LogEvent, LogError> {
    let mut take = |name: &'static str| -> Result<Option<String>, LogError> {
        let at = relation.columns.iter().position(|column| column == name).ok_or(LogError::MissingColumn(name))?;
        Ok(values.get_mut(at).and_then(Option::take))
    };
    Ok(LogEvent {
        id: take("id")?.and_then(|id| id.parse().ok()).ok_or(LogError::BadValue("id"))?,
        topic: take("topic")?.ok_or(LogError::BadValue("topic"))?,
        payload: take("payload")?.ok_or(LogError::BadValue("payload"))?,
        key: take("key")?,
        created_at: take("created_at")?.ok_or(LogError::BadValue("created_at"))?,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn string(data: &mut Vec<u8>, text: &str) {
        data.extend(text.as_bytes());
        data.push(0);
    }

    fn relation(id: u32, name: &str, columns: &[&str]) -> Vec<u8> {
        let mut data = vec![b'R'];
        data.extend(id.to_be_bytes());
        string(&mut data, "public");
        string(&mut data, name);
        data.push(b'd');
        data.extend((columns.len() as u16).to_be_bytes());
        for column in columns {
            data.push(0);
            string(&mut data, column);
            data.extend(25u32.to_be_bytes());
            data.extend((-1i32).to_be_bytes());
        }
        data
    }

    fn insert(relation: u32, values: &[Option<&str>]) -> Vec<u8> {
        let mut data = vec![b'I'];
        data.extend(relation.to_be_bytes());
        data.push(b'N');
        data.extend((values.len() as u16).to_be_bytes());
        for value in values {
            match value {
                None => data.push(b'n'),
                Some(text) => {
                    data.push(b't');
                    data.extend((text.len() as u32).to_be_bytes());
                    data.extend(text.as_bytes());
                }
            }
        }
        data
    }

    fn begin() -> Vec<u8> {
        let mut data = vec![b'B'];
        data.extend([0; 16]);
        data.extend(1u32.to_be_bytes());
        data
    }

    /// A pgoutput commit ending at `end`.
    pub(crate) fn commit(end: u64) -> Vec<u8> {
        let mut data = vec![b'C', 0];
        data.extend(0u64.to_be_bytes());
        data.extend(end.to_be_bytes());
        data.extend(0u64.to_be_bytes());
        data
    }

    const COLUMNS: [&str; 6] = ["id", "topic", "payload", "key", "created_at", "xact"];

    fn row<'a>(id: &'a str, key: Option<&'a str>) -> [Option<&'a str>; 6] {
        [Some(id), Some("order.placed"), Some("{\"n\": 1}"), key, Some("2026-12-04 13:00:00+00"), Some("900")]
    }

    #[test]
    fn events_of_whole_transactions_come_in_commit_order_with_the_last_end() {
        let messages = [
            begin(),
            relation(7, "outbox_log", &COLUMNS),
            insert(7, &row("5", Some("a"))),
            insert(7, &row("3", None)),
            commit(100),
            begin(),
            relation(8, "other", &["x"]),
            insert(8, &[Some("1")]),
            insert(7, &row("4", None)),
            commit(200),
            // Cut short: not part of the read.
            begin(),
            insert(7, &row("9", None)),
        ];
        let read = read_events(messages.iter().map(Vec::as_slice), 7).unwrap();
        assert_eq!(read.events.iter().map(|e| e.id).collect::<Vec<_>>(), vec![5, 3, 4]);
        assert_eq!(read.end, Some(200));
        let first = &read.events[0];
        assert_eq!((first.topic.as_str(), first.payload.as_str(), first.key.as_deref()), ("order.placed", "{\"n\": 1}", Some("a")));
        assert_eq!(read.events[1].key, None);
    }

    #[test]
    fn nothing_read_has_no_end() {
        assert_eq!(read_events([], 7).unwrap(), LogRead::default());
    }

    #[test]
    fn rows_that_are_not_events_are_errors() {
        let unknown = [begin(), insert(7, &row("5", None))];
        assert_eq!(read_events(unknown.iter().map(Vec::as_slice), 7), Err(LogError::UnknownRelation(7)));
        let no_topic = [begin(), relation(7, "outbox_log", &["id", "payload", "key", "created_at"]), insert(7, &[Some("1"); 4])];
        assert_eq!(read_events(no_topic.iter().map(Vec::as_slice), 7), Err(LogError::MissingColumn("topic")));
        let bad_id = [begin(), relation(7, "outbox_log", &COLUMNS), insert(7, &row("x", None))];
        assert_eq!(read_events(bad_id.iter().map(Vec::as_slice), 7), Err(LogError::BadValue("id")));
    }

    #[test]
    fn rows_of_another_table_named_outbox_log_are_not_events() {
        // A table of anyone's may be called outbox_log, in a schema of theirs: only the
        // relation whose oid the read names is the log.
        let messages = [
            begin(),
            relation(9, "outbox_log", &COLUMNS),
            insert(9, &row("666", None)),
            relation(7, "outbox_log", &COLUMNS),
            insert(7, &row("5", None)),
            commit(100),
        ];
        let read = read_events(messages.iter().map(Vec::as_slice), 7).unwrap();
        assert_eq!(read.events.iter().map(|e| e.id).collect::<Vec<_>>(), vec![5]);
        let read = read_events(messages.iter().map(Vec::as_slice), 9).unwrap();
        assert_eq!(read.events.iter().map(|e| e.id).collect::<Vec<_>>(), vec![666]);
    }
}
