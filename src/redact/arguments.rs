//! Where a statement's text passes a secret: the `secret` argument of
//! `outbox_endpoint_rotate_secret` and the `url` argument of `outbox_endpoint_set` (whose user
//! and password are the secret part), as a literal or a bound parameter. Found by reading the
//! calls' arguments, not by looking for what a secret looks like: a log line then masks those
//! arguments and nothing a role merely mentions or encodes elsewhere in its statement.

/// What a passed argument holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Secret,
    Url,
}

/// How the argument is passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passed {
    /// A string literal: the byte range of its content, between the quotes.
    Literal { start: usize, end: usize },
    /// A bound parameter, `$n`.
    Parameter(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretArgument {
    pub kind: Kind,
    pub passed: Passed,
}

/// The functions that take a secret, and which argument (by position from 0, or by name).
const CALLS: [(&[u8], usize, &[u8], Kind); 2] =
    [(b"outbox_endpoint_rotate_secret", 1, b"secret", Kind::Secret), (b"outbox_endpoint_set", 1, b"url", Kind::Url)];

/// Every secret argument of every call of those functions in `sql`, in dollar-quoted bodies
/// (`DO $$ … $$`) too.
pub fn secret_arguments(sql: &[u8]) -> Vec<SecretArgument> {
    let mut found = Vec::new();
    let mut lexer = Lexer { sql, at: 0 };
    while let Some(token) = lexer.next() {
        let Token::Word(word) = token else { continue };
        let Some(&(_, position, name, kind)) = CALLS.iter().find(|(call, ..)| word.eq_ignore_ascii_case(call)) else { continue };
        let mut ahead = Lexer { sql, at: lexer.at };
        if ahead.next() != Some(Token::Punct(b'(')) {
            continue;
        }
        for (index, argument) in arguments(&mut ahead).into_iter().enumerate() {
            let wanted = match argument.name {
                Some(named) => named.eq_ignore_ascii_case(name),
                None => index == position,
            };
            if let (true, Some(passed)) = (wanted, argument.passed) {
                found.push(SecretArgument { kind, passed });
            }
        }
    }
    found
}

struct Argument<'a> {
    name: Option<&'a [u8]>,
    /// How its value is passed, when it is a literal or a parameter (perhaps with a cast).
    passed: Option<Passed>,
}

/// The arguments of a call whose `(` was just read, up to its `)`.
fn arguments<'a>(lexer: &mut Lexer<'a>) -> Vec<Argument<'a>> {
    let mut found = Vec::new();
    let mut tokens: Vec<Token<'a>> = Vec::new();
    let mut depth = 0;
    while let Some(token) = lexer.next() {
        match token {
            Token::Punct(b'(' | b'[') => depth += 1,
            Token::Punct(b')' | b']') if depth > 0 => depth -= 1,
            Token::Punct(b')') | Token::Punct(b',') if depth == 0 => {
                found.push(argument(&tokens));
                tokens.clear();
                if token == Token::Punct(b')') {
                    return found;
                }
                continue;
            }
            _ => {}
        }
        tokens.push(token);
    }
    found
}

/// One argument's tokens: `[name => | name :=] value [::type]`.
fn argument<'a>(tokens: &[Token<'a>]) -> Argument<'a> {
    let (name, value) = match tokens {
        [Token::Word(name), Token::Arrow, value @ ..] => (Some(*name), value),
        _ => (None, tokens),
    };
    let passed = match value {
        [Token::Literal { start, end }, rest @ ..] | [Token::Word(_), Token::Literal { start, end }, rest @ ..]
            if rest.first().is_none_or(|t| *t == Token::Cast) =>
        {
            Some(Passed::Literal { start: *start, end: *end })
        }
        [Token::Parameter(n), rest @ ..] if rest.first().is_none_or(|t| *t == Token::Cast) => Some(Passed::Parameter(*n)),
        _ => None,
    };
    Argument { name, passed }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'a> {
    /// An identifier or keyword, quoted or not.
    Word(&'a [u8]),
    /// A string literal's content, between its quotes.
    Literal {
        start: usize,
        end: usize,
    },
    Parameter(u32),
    /// `=>` or `:=`
    Arrow,
    /// `::`
    Cast,
    Punct(u8),
}

/// A lexer of just enough SQL to find calls and their arguments: comments are skipped, string
/// literals and quoted identifiers are read whole, dollar quotes are read through (their body
/// may be PL/pgSQL that makes the call).
struct Lexer<'a> {
    sql: &'a [u8],
    at: usize,
}

impl<'a> Lexer<'a> {
    fn next(&mut self) -> Option<Token<'a>> {
        let sql = self.sql;
        loop {
            let rest = sql.get(self.at..)?;
            let first = *rest.first()?;
            if first.is_ascii_whitespace() {
                self.at += 1;
            } else if rest.starts_with(b"--") {
                self.at += rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
            } else if rest.starts_with(b"/*") {
                self.at += rest.windows(2).position(|w| w == b"*/").map_or(rest.len(), |end| end + 2);
            } else if first == b'$' && rest.get(1).is_some_and(u8::is_ascii_digit) {
                let digits = rest[1..].iter().take_while(|b| b.is_ascii_digit()).count();
                self.at += 1 + digits;
                let number = std::str::from_utf8(&rest[1..1 + digits]).ok()?.parse().unwrap_or(0);
                return Some(Token::Parameter(number));
            } else if first == b'$' {
                // A dollar quote's delimiter ($$ or $tag$): its body is read as statements.
                let tag = rest[1..].iter().take_while(|&&b| b.is_ascii_alphanumeric() || b == b'_').count();
                self.at += if rest.get(1 + tag) == Some(&b'$') { tag + 2 } else { 1 };
            } else if first == b'\'' || ((first == b'E' || first == b'e') && rest.get(1) == Some(&b'\'')) {
                let escapes = first != b'\'';
                let start = self.at + if escapes { 2 } else { 1 };
                let mut end = start;
                while end < sql.len() {
                    match sql[end] {
                        b'\\' if escapes => end += 2,
                        b'\'' if sql.get(end + 1) == Some(&b'\'') => end += 2,
                        b'\'' => break,
                        _ => end += 1,
                    }
                }
                self.at = (end + 1).min(sql.len());
                return Some(Token::Literal { start, end: end.min(sql.len()) });
            } else if first == b'"' {
                let end = rest[1..].iter().position(|&b| b == b'"').map_or(rest.len(), |end| end + 1);
                self.at += (end + 1).min(rest.len());
                return Some(Token::Word(&rest[1..end]));
            } else if first.is_ascii_alphabetic() || first == b'_' || first >= 0x80 {
                let length = rest.iter().take_while(|&&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80).count();
                self.at += length;
                return Some(Token::Word(&rest[..length]));
            } else if rest.starts_with(b"=>") || rest.starts_with(b":=") {
                self.at += 2;
                return Some(Token::Arrow);
            } else if rest.starts_with(b"::") {
                self.at += 2;
                return Some(Token::Cast);
            } else {
                self.at += 1;
                return Some(Token::Punct(first));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn literals(sql: &str) -> Vec<(Kind, &str)> {
        secret_arguments(sql.as_bytes())
            .into_iter()
            .filter_map(|a| match a.passed {
                Passed::Literal { start, end } => Some((a.kind, &sql[start..end])),
                Passed::Parameter(_) => None,
            })
            .collect()
    }

    #[test]
    fn finds_the_secret_and_url_arguments_by_position_or_name() {
        assert_eq!(literals("SELECT outbox_endpoint_rotate_secret('b', 'whsec_abc', '1 hour')"), vec![(Kind::Secret, "whsec_abc")]);
        assert_eq!(
            literals("select OUTBOX.outbox_endpoint_rotate_secret(name => 'b', secret => 'whsec_x')"),
            vec![(Kind::Secret, "whsec_x")]
        );
        assert_eq!(literals("SELECT outbox_endpoint_rotate_secret('b', secret := 'whsec_y'::text)"), vec![(Kind::Secret, "whsec_y")]);
        assert_eq!(literals("SELECT outbox_endpoint_set('b', 'https://u:p@h/', '{*}')"), vec![(Kind::Url, "https://u:p@h/")]);
        assert_eq!(literals("SELECT \"outbox_endpoint_set\"(lower('B'), E'https://u:p\\'@h/')"), vec![(Kind::Url, "https://u:p\\'@h/")]);
        assert_eq!(literals("DO $$ BEGIN PERFORM outbox_endpoint_rotate_secret('b', 'whsec_z'); END $$"), vec![(Kind::Secret, "whsec_z")]);
    }

    #[test]
    fn finds_a_bound_parameter() {
        let found = secret_arguments(b"SELECT outbox.outbox_endpoint_rotate_secret($1, $2::varchar)");
        assert_eq!(found, vec![SecretArgument { kind: Kind::Secret, passed: Passed::Parameter(2) }]);
    }

    #[test]
    fn finds_nothing_a_statement_merely_mentions() {
        for sql in [
            "DROP TABLE accounts; /* whsec_abc outbox_endpoint_rotate_secret('b', 'whsec_x') */",
            "SELECT 'outbox_endpoint_rotate_secret(''b'', ''whsec_x'')'",
            "DO $$BEGIN EXECUTE convert_from(decode(substr('whsec_RFJPUA==', 7), 'base64'), 'UTF8'); END$$",
            "SELECT outbox_endpoint_rotate_secret('b')",
            "SELECT outbox_endpoint_rotate_secret('b', NULL, '1 day')",
            "SELECT outbox_endpoint_rotate_secret('b', 'whsec_' || secret_column) FROM t",
            "-- outbox_endpoint_set('x', 'https://u:p@h/')\nSELECT 1",
            "SELECT outbox_endpoint_set",
        ] {
            assert_eq!(literals(sql), vec![], "{sql}");
        }
    }

    #[test]
    fn unterminated_text_ends_the_search_without_panicking() {
        for sql in ["SELECT outbox_endpoint_set('b', 'https://u:p@h/", "SELECT outbox_endpoint_set(", "SELECT $", "E'", "\"", "/*", "$tag"]
        {
            let _ = secret_arguments(sql.as_bytes());
        }
    }
}
