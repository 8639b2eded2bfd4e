//! libpq's password file (`PGPASSFILE`, else `~/.pgpass`), read as libpq reads it
//! (<https://www.postgresql.org/docs/15/libpq-pgpass.html>): one
//! `hostname:port:database:username:password` per line, a field of `*` alone matching anything,
//! `\:` and `\\` standing for `:` and `\`, lines starting with `#` skipped, the first line that
//! matches giving the password. A file that is not a plain file, or that its group or others may
//! use, is not read: libpq warns and goes on without it, and so does this binary.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Why the password file was not read; said as a warning, and the connection made without it.
#[derive(Debug, thiserror::Error)]
pub enum PasswordFileError {
    #[error("password file \"{0}\" is not a plain file; it is not read")]
    NotPlainFile(PathBuf),
    #[error("password file \"{0}\" has group or world access; permissions should be u=rw (0600) or less; it is not read")]
    Permissions(PathBuf),
    #[error("cannot read password file \"{path}\": {source}")]
    Read { path: PathBuf, source: io::Error },
}

/// What a line must match: the connection's host (`localhost` for a Unix socket, as libpq),
/// port, database and user.
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    pub host: &'a str,
    pub port: &'a str,
    pub database: &'a str,
    pub user: &'a str,
}

/// The password the file at `path` holds for `wanted`; `None` if there is no such file or no
/// line matches.
pub fn read(path: &Path, wanted: Wanted) -> Result<Option<String>, PasswordFileError> {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(PasswordFileError::Read { path: path.into(), source }),
    };
    if !metadata.is_file() {
        return Err(PasswordFileError::NotPlainFile(path.into()));
    }
    if metadata.permissions().mode() & 0o077 != 0 {
        return Err(PasswordFileError::Permissions(path.into()));
    }
    let text = std::fs::read(path).map_err(|source| PasswordFileError::Read { path: path.into(), source })?;
    Ok(find(&String::from_utf8_lossy(&text), wanted))
}

/// The password of the first line of `text` that matches `wanted`.
pub fn find(text: &str, wanted: Wanted) -> Option<String> {
    let tokens = [wanted.host, wanted.port, wanted.database, wanted.user];
    let lines = text.lines().map(|line| line.strip_suffix('\r').unwrap_or(line));
    lines.filter(|line| !line.is_empty() && !line.starts_with('#')).find_map(|line| {
        let fields = fields(line);
        let matches = fields.len() == 5 && fields.iter().zip(tokens).all(|(field, token)| field.matches(token));
        matches.then(|| fields[4].text.clone())
    })
}

/// A field as written: its text with the escapes taken out, and whether it was `*` alone.
struct Field {
    text: String,
    any: bool,
}

impl Field {
    fn matches(&self, token: &str) -> bool {
        self.any || self.text == token
    }
}

/// The line's first four fields and its password, which ends at the next `:` not escaped (what
/// follows is ignored, as libpq does). Fewer than five: the line matches nothing.
fn fields(line: &str) -> Vec<Field> {
    let mut fields = Vec::with_capacity(5);
    let (mut text, mut raw) = (String::new(), String::new());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            // A backslash at the end of the line stands for itself.
            '\\' => {
                raw.push(c);
                text.push(chars.next().unwrap_or('\\'));
            }
            ':' => {
                fields.push(Field { any: raw == "*", text: std::mem::take(&mut text) });
                raw.clear();
                if fields.len() == 5 {
                    return fields;
                }
            }
            _ => {
                raw.push(c);
                text.push(c);
            }
        }
    }
    if fields.len() == 4 {
        fields.push(Field { any: false, text });
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    const WANTED: Wanted = Wanted { host: "db.example", port: "5432", database: "app", user: "outbox_relay" };

    #[test]
    fn the_first_line_that_matches_gives_the_password_and_a_star_matches_anything() {
        let text = "# comments and blank lines are skipped\n\n\
                    db.example:5432:app:someone_else:not this\n\
                    db.example:6432:app:outbox_relay:not this either\n\
                    db.example:5432:*:outbox_relay:s3cret\n\
                    *:*:*:*:too late\n";
        assert_eq!(find(text, WANTED).as_deref(), Some("s3cret"));
        assert_eq!(find("*:*:*:*:fallback\n", WANTED).as_deref(), Some("fallback"));
        assert_eq!(find("other:*:*:*:x\n", WANTED), None);
        assert_eq!(find("", WANTED), None);
    }

    #[test]
    fn escapes_stand_for_colons_and_backslashes_and_a_star_among_others_is_a_star() {
        let text = "db.example:5432:app:outbox_relay:pa\\:ss\\\\word\n";
        assert_eq!(find(text, WANTED).as_deref(), Some("pa:ss\\word"));
        let host = Wanted { host: "a:b", ..WANTED };
        assert_eq!(find("a\\:b:5432:app:outbox_relay:x\n", host).as_deref(), Some("x"));
        assert_eq!(find("a:b:5432:app:outbox_relay:x\n", host), None, "an unescaped colon ends the field");
        assert_eq!(find("db.example:5432:app:outbox_*:x\n", WANTED), None, "a star matches anything only alone");
        assert_eq!(find("db.example:5432:app:\\*:x\n", WANTED), None, "an escaped star is a star");
        let star = Wanted { user: "*", ..WANTED };
        assert_eq!(find("db.example:5432:app:\\*:x\n", star).as_deref(), Some("x"));
    }

    #[test]
    fn the_password_ends_at_an_unescaped_colon_and_short_lines_match_nothing() {
        assert_eq!(find("db.example:5432:app:outbox_relay:first:ignored\n", WANTED).as_deref(), Some("first"));
        assert_eq!(find("db.example:5432:app:outbox_relay\n", WANTED), None);
        assert_eq!(find("db.example:5432:app:outbox_relay:\n", WANTED).as_deref(), Some(""), "an empty password is a match");
        assert_eq!(find("db.example:5432:app:outbox_relay:ends in \\\n", WANTED).as_deref(), Some("ends in \\"));
        assert_eq!(find("db.example:5432:app:outbox_relay:crlf\r\n", WANTED).as_deref(), Some("crlf"));
        assert_eq!(find(" # not a comment:5432:app:outbox_relay:x\n", Wanted { host: " # not a comment", ..WANTED }).as_deref(), Some("x"));
    }

    #[test]
    fn a_file_others_may_read_or_that_is_not_a_plain_file_is_not_read() {
        let dir = std::env::temp_dir().join(format!("outbox-pgpass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pgpass");
        std::fs::write(&path, "*:*:*:*:s3cret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&path, WANTED).unwrap().as_deref(), Some("s3cret"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let refused = read(&path, WANTED).unwrap_err().to_string();
        assert!(refused.contains("has group or world access") && !refused.contains("s3cret"), "{refused}");
        assert!(matches!(read(&dir, WANTED), Err(PasswordFileError::NotPlainFile(_))));
        assert_eq!(read(&dir.join("missing"), WANTED).unwrap(), None, "no file is no password, and no warning");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
