//! The messages of PostgreSQL's `pgoutput` plugin (protocol version 1) that log mode reads
//! from its slot: where transactions begin and commit, which table a relation number is, and
//! the rows inserted, with each column as text. Every other message is passed over.
//! <https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html>

/// One message, as `pg_logical_slot_peek_binary_changes` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Begin {
        xid: u32,
    },
    /// `end` is the WAL position just past the commit: confirming it lets the slot go of the
    /// whole transaction.
    Commit {
        end: u64,
    },
    Relation(Relation),
    /// A row inserted into relation `relation`: one value per column, null as `None`.
    Insert {
        relation: u32,
        values: Vec<Option<String>>,
    },
    /// A message log mode does not need (origin, type, update, delete, truncate, ...).
    Other(u8),
}

/// What a relation number stands for, sent before the first row of it in each session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub id: u32,
    pub schema: String,
    pub name: String,
    pub columns: Vec<String>,
}

/// A message that is cut short or not what pgoutput sends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a pgoutput message is malformed: {0}")]
pub struct MalformedMessage(&'static str);

pub fn parse(data: &[u8]) -> Result<Message, MalformedMessage> {
    let mut reader = Reader { data };
    let kind = reader.u8()?;
    let message = match kind {
        b'B' => {
            let (_final_lsn, _commit_time) = (reader.u64()?, reader.u64()?);
            Message::Begin { xid: reader.u32()? }
        }
        b'C' => {
            let (_flags, _commit_lsn) = (reader.u8()?, reader.u64()?);
            Message::Commit { end: reader.u64()? }
        }
        b'R' => {
            let id = reader.u32()?;
            let (schema, name) = (reader.string()?, reader.string()?);
            let _replica_identity = reader.u8()?;
            let count = reader.u16()?;
            let mut columns = Vec::with_capacity(count as usize);
            for _ in 0..count {
                let _flags = reader.u8()?;
                columns.push(reader.string()?);
                let (_type, _modifier) = (reader.u32()?, reader.u32()?);
            }
            Message::Relation(Relation { id, schema, name, columns })
        }
        b'I' => {
            let relation = reader.u32()?;
            if reader.u8()? != b'N' {
                return Err(MalformedMessage("an insert without its new row"));
            }
            Message::Insert { relation, values: reader.tuple()? }
        }
        other => Message::Other(other),
    };
    Ok(message)
}

/// What a message is, read from its first bytes only: enough to put a stream's messages
/// together into transactions (crate::log::stream) without reading each row twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    Begin,
    Commit {
        end: u64,
    },
    Relation {
        id: u32,
    },
    /// An insert, update or delete of a row of relation `relation`.
    Row {
        relation: u32,
    },
    Other,
}

pub fn frame(data: &[u8]) -> Result<Frame, MalformedMessage> {
    let mut reader = Reader { data };
    Ok(match reader.u8()? {
        b'B' => Frame::Begin,
        b'C' => {
            let (_flags, _commit_lsn) = (reader.u8()?, reader.u64()?);
            Frame::Commit { end: reader.u64()? }
        }
        b'R' => Frame::Relation { id: reader.u32()? },
        b'I' | b'U' | b'D' => Frame::Row { relation: reader.u32()? },
        _ => Frame::Other,
    })
}

struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], MalformedMessage> {
        if self.data.len() < n {
            return Err(MalformedMessage("it ends too soon"));
        }
        let (taken, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, MalformedMessage> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, MalformedMessage> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("two bytes")))
    }

    fn u32(&mut self) -> Result<u32, MalformedMessage> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("four bytes")))
    }

    fn u64(&mut self) -> Result<u64, MalformedMessage> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("eight bytes")))
    }

    /// A NUL-terminated string.
    fn string(&mut self) -> Result<String, MalformedMessage> {
        let end = self.data.iter().position(|&b| b == 0).ok_or(MalformedMessage("a string without its end"))?;
        let text = String::from_utf8(self.data[..end].to_vec()).map_err(|_| MalformedMessage("a name that is not UTF-8"))?;
        self.data = &self.data[end + 1..];
        Ok(text)
    }

    /// TupleData: each column null, unchanged (a TOASTed value an update left alone, which no
    /// insert sends) or as text.
    fn tuple(&mut self) -> Result<Vec<Option<String>>, MalformedMessage> {
        let count = self.u16()?;
        let mut values = Vec::with_capacity(count as usize);
        for _ in 0..count {
            match self.u8()? {
                b'n' | b'u' => values.push(None),
                b't' => {
                    let length = self.u32()? as usize;
                    let text = String::from_utf8(self.take(length)?.to_vec()).map_err(|_| MalformedMessage("a value that is not UTF-8"))?;
                    values.push(Some(text));
                }
                _ => return Err(MalformedMessage("a column of an unknown kind")),
            }
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation() -> Vec<u8> {
        let mut data = vec![b'R'];
        data.extend(16385u32.to_be_bytes());
        data.extend(b"public\0outbox_log\0");
        data.push(b'd');
        data.extend(2u16.to_be_bytes());
        for column in ["id", "topic"] {
            data.push(1);
            data.extend(column.as_bytes());
            data.push(0);
            data.extend(20u32.to_be_bytes());
            data.extend((-1i32).to_be_bytes());
        }
        data
    }

    #[test]
    fn begin_relation_insert_and_commit_are_read() {
        let mut begin = vec![b'B'];
        begin.extend(0x1_0000_0000u64.to_be_bytes());
        begin.extend(7u64.to_be_bytes());
        begin.extend(742u32.to_be_bytes());
        assert_eq!(parse(&begin).unwrap(), Message::Begin { xid: 742 });

        assert_eq!(
            parse(&relation()).unwrap(),
            Message::Relation(Relation {
                id: 16385,
                schema: "public".into(),
                name: "outbox_log".into(),
                columns: vec!["id".into(), "topic".into()]
            })
        );

        let mut insert = vec![b'I'];
        insert.extend(16385u32.to_be_bytes());
        insert.push(b'N');
        insert.extend(3u16.to_be_bytes());
        insert.push(b't');
        insert.extend(2u32.to_be_bytes());
        insert.extend(b"42");
        insert.push(b'n');
        insert.push(b't');
        insert.extend(5u32.to_be_bytes());
        insert.extend("héé".as_bytes());
        assert_eq!(parse(&insert).unwrap(), Message::Insert { relation: 16385, values: vec![Some("42".into()), None, Some("héé".into())] });

        let mut commit = vec![b'C', 0];
        commit.extend(0x10u64.to_be_bytes());
        commit.extend(0x28u64.to_be_bytes());
        commit.extend(9u64.to_be_bytes());
        assert_eq!(parse(&commit).unwrap(), Message::Commit { end: 0x28 });
        assert_eq!(parse(b"O").unwrap(), Message::Other(b'O'));
    }

    #[test]
    fn a_frame_is_read_from_the_first_bytes() {
        assert_eq!(frame(&relation()).unwrap(), Frame::Relation { id: 16385 });
        assert_eq!(frame(b"I\0\0\x40\x01N").unwrap(), Frame::Row { relation: 16385 });
        let mut commit = vec![b'C', 0];
        commit.extend(0x10u64.to_be_bytes());
        commit.extend(0x28u64.to_be_bytes());
        assert_eq!(frame(&commit).unwrap(), Frame::Commit { end: 0x28 });
        assert_eq!(frame(b"B").unwrap(), Frame::Begin);
        assert_eq!(frame(b"Y").unwrap(), Frame::Other);
        assert!(frame(b"C\0").is_err());
        assert!(frame(&[]).is_err());
    }

    #[test]
    fn a_message_cut_anywhere_is_an_error_and_never_a_panic() {
        let data = relation();
        for end in 1..data.len() {
            assert!(parse(&data[..end]).is_err(), "cut at {end}");
        }
        assert!(parse(&[]).is_err());
        assert!(parse(b"I\0\0\0\x01X").is_err());
    }
}
