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
/// What every text that calls them contains, compared without case: the rest need no reading.
const MARK: &[u8] = b"outbox_endpoint_";
/// Dollar-quoted bodies are read to this depth of nesting, and no deeper.
const MAX_BODY_DEPTH: usize = 8;
/// The tokens of an argument read to classify it: `name => value :: type`.
const ARGUMENT_TOKENS: usize = 4;

/// Every secret argument of every call of those functions in `sql`, in dollar-quoted bodies
/// (`DO $$ … $$`) too. One pass, whatever the text.
pub fn secret_arguments(sql: &[u8]) -> Vec<SecretArgument> {
    let mut found = Vec::new();
    if sql.windows(MARK.len()).any(|window| window.eq_ignore_ascii_case(MARK)) {
        read(sql, 0, sql.len(), 0, &mut found);
    }
    found
}

/// What an open parenthesis or bracket belongs to.
enum Frame<'a> {
    /// A call of one of `CALLS`: its argument wanted, and the argument being read.
    Call {
        wanted: (usize, &'a [u8], Kind),
        index: usize,
        tokens: Vec<Token<'a>>,
        nested: bool,
    },
    Parenthesis,
    Bracket,
}

/// Reads `sql[start..end]`, adding what it finds; `depth` is the dollar-quote nesting.
fn read<'a>(sql: &'a [u8], start: usize, end: usize, depth: usize, found: &mut Vec<SecretArgument>) {
    let mut lexer = Lexer { sql, at: start, end };
    let mut frames: Vec<Frame<'a>> = Vec::new();
    let mut previous: Option<Token<'a>> = None;
    while let Some(token) = lexer.next() {
        match token {
            Token::Body { start, end } => {
                if depth < MAX_BODY_DEPTH {
                    read(sql, start, end, depth + 1, found);
                }
                note_nested(&mut frames);
            }
            Token::Punct(b'(') => {
                note_nested(&mut frames);
                let call = match previous {
                    Some(Token::Word(word)) => CALLS.iter().find(|(name, ..)| word.eq_ignore_ascii_case(name)),
                    _ => None,
                };
                frames.push(match call {
                    Some(&(_, position, name, kind)) => {
                        Frame::Call { wanted: (position, name, kind), index: 0, tokens: Vec::new(), nested: false }
                    }
                    None => Frame::Parenthesis,
                });
            }
            Token::Punct(b'[') => {
                note_nested(&mut frames);
                frames.push(Frame::Bracket);
            }
            // A bracket closes only a bracket: a stray one changes nothing.
            Token::Punct(b']') if matches!(frames.last(), Some(Frame::Bracket)) => {
                frames.pop();
            }
            Token::Punct(b')') if frames.last().is_some_and(|frame| !matches!(frame, Frame::Bracket)) => {
                if let Some(Frame::Call { wanted, index, tokens, nested }) = frames.pop() {
                    take_argument(wanted, index, &tokens, nested, found);
                }
            }
            Token::Punct(b',') if matches!(frames.last(), Some(Frame::Call { .. })) => {
                if let Some(Frame::Call { wanted, index, tokens, nested }) = frames.last_mut() {
                    take_argument(*wanted, *index, tokens, *nested, found);
                    *index += 1;
                    tokens.clear();
                    *nested = false;
                }
            }
            _ => {
                if let Some(Frame::Call { tokens, .. }) = frames.last_mut() {
                    if tokens.len() < ARGUMENT_TOKENS {
                        tokens.push(token);
                    }
                }
            }
        }
        previous = Some(token);
    }
}

/// The argument being read by the innermost call, if that is what is open, is not a plain
/// literal or parameter: something opens inside it.
fn note_nested(frames: &mut [Frame<'_>]) {
    if let Some(Frame::Call { nested, .. }) = frames.last_mut() {
        *nested = true;
    }
}

/// Adds argument `index` of a call (its first tokens) if it is the wanted one and a literal or
/// a parameter, perhaps cast.
fn take_argument(wanted: (usize, &[u8], Kind), index: usize, tokens: &[Token<'_>], nested: bool, found: &mut Vec<SecretArgument>) {
    let (position, name, kind) = wanted;
    let (named, value) = match tokens {
        [Token::Word(named), Token::Arrow, value @ ..] => (Some(*named), value),
        _ => (None, tokens),
    };
    let is_wanted = match named {
        Some(named) => named.eq_ignore_ascii_case(name),
        None => index == position,
    };
    if !is_wanted || nested {
        return;
    }
    let passed = match value {
        [Token::Literal { start, end }, rest @ ..] | [Token::Word(_), Token::Literal { start, end }, rest @ ..]
            if rest.first().is_none_or(|t| *t == Token::Cast) =>
        {
            Passed::Literal { start: *start, end: *end }
        }
        [Token::Parameter(n), rest @ ..] if rest.first().is_none_or(|t| *t == Token::Cast) => Passed::Parameter(*n),
        _ => return,
    };
    found.push(SecretArgument { kind, passed });
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
    /// A dollar-quoted body, between its delimiters: read on its own, as it may be PL/pgSQL.
    Body {
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

/// A lexer of just enough SQL to find calls and their arguments, as PostgreSQL reads the text
/// (standard_conforming_strings on): comments are skipped (block comments nest), string
/// literals, quoted identifiers and dollar-quoted bodies are read whole. It never reads past
/// `end`, and every step moves on by at least a byte.
struct Lexer<'a> {
    sql: &'a [u8],
    at: usize,
    end: usize,
}

impl<'a> Lexer<'a> {
    fn next(&mut self) -> Option<Token<'a>> {
        let sql = &self.sql[..self.end];
        loop {
            let rest = sql.get(self.at..)?;
            let first = *rest.first()?;
            let start = self.at;
            if first.is_ascii_whitespace() {
                self.at += 1;
            } else if rest.starts_with(b"--") {
                self.at += rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
            } else if rest.starts_with(b"/*") {
                self.at += block_comment_length(rest);
            } else if first == b'$' && rest.get(1).is_some_and(u8::is_ascii_digit) {
                let digits = rest[1..].iter().take_while(|b| b.is_ascii_digit()).count();
                self.at += 1 + digits;
                let number = std::str::from_utf8(&rest[1..1 + digits]).ok().and_then(|n| n.parse().ok()).unwrap_or(0);
                return Some(Token::Parameter(number));
            } else if let Some(tag) = dollar_tag(rest) {
                // The body runs to the next occurrence of the same delimiter, or to the end.
                let body = start + tag.len();
                let close = sql[body..].windows(tag.len()).position(|window| window == tag).map(|at| body + at);
                self.at = close.map_or(sql.len(), |close| close + tag.len());
                return Some(Token::Body { start: body, end: close.unwrap_or(sql.len()) });
            } else if first == b'\'' || ((first == b'E' || first == b'e') && rest.get(1) == Some(&b'\'')) {
                let escapes = first != b'\'';
                let content = start + if escapes { 2 } else { 1 };
                let mut end = content;
                while end < sql.len() {
                    match sql[end] {
                        b'\\' if escapes => end += 2,
                        b'\'' if sql.get(end + 1) == Some(&b'\'') => end += 2,
                        b'\'' => break,
                        _ => end += 1,
                    }
                }
                let end = end.min(sql.len());
                self.at = (end + 1).min(sql.len());
                return Some(Token::Literal { start: content, end });
            } else if first == b'"' {
                let close = rest[1..].iter().position(|&b| b == b'"').map_or(rest.len(), |at| at + 1);
                self.at += (close + 1).min(rest.len());
                return Some(Token::Word(&rest[1..close]));
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

/// The length of the block comment `text` begins with: to its `*/`, counting the comments it
/// holds (they nest), or to the end.
fn block_comment_length(text: &[u8]) -> usize {
    let (mut depth, mut at) = (0usize, 0);
    while at + 1 < text.len() {
        match &text[at..at + 2] {
            b"/*" => {
                depth += 1;
                at += 2;
            }
            b"*/" => {
                depth -= 1;
                at += 2;
                if depth == 0 {
                    return at;
                }
            }
            _ => at += 1,
        }
    }
    text.len()
}

/// The dollar-quote delimiter `text` begins with (`$$` or `$tag$`), if it does.
fn dollar_tag(text: &[u8]) -> Option<&[u8]> {
    let name = text.get(1..)?.iter().take_while(|&&b| b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80).count();
    (text.first() == Some(&b'$') && text.get(1 + name) == Some(&b'$')).then(|| &text[..name + 2])
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
    fn a_literal_never_crosses_the_end_of_a_dollar_quote_or_a_comment() {
        for sql in [
            "SELECT $q$ outbox_endpoint_rotate_secret(x, '$q$; DROP TABLE accounts; SELECT $q$') $q$",
            "SELECT 1 /* /* */ outbox_endpoint_rotate_secret(x, ' */ DROP TABLE accounts; /* ') */",
            "SELECT 1 /*/ outbox_endpoint_rotate_secret(x, ' */ DROP TABLE accounts; /* ') */",
        ] {
            assert_eq!(literals(sql), vec![], "{sql}");
        }
    }

    #[test]
    fn a_literal_is_the_argument_of_one_call_only() {
        let sql = "SELECT outbox_endpoint_rotate_secret(outbox_endpoint_set(x ], 'whsec_AAAA'))";
        assert_eq!(literals(sql), vec![(Kind::Url, "whsec_AAAA")]);
        let sql = "SELECT outbox_endpoint_set(name => 'b', topics => ARRAY['a', 'b'], url => 'http://u:p@h/')";
        assert_eq!(literals(sql), vec![(Kind::Url, "http://u:p@h/")]);
    }

    #[test]
    fn a_long_text_of_open_calls_is_read_in_one_pass() {
        let sql = "outbox_endpoint_set(".repeat(200_000);
        let started = std::time::Instant::now();
        assert_eq!(secret_arguments(sql.as_bytes()), vec![]);
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
    }

    #[test]
    fn unterminated_text_ends_the_search_without_panicking() {
        for sql in ["SELECT outbox_endpoint_set('b', 'https://u:p@h/", "SELECT outbox_endpoint_set(", "SELECT $", "E'", "\"", "/*", "$tag"]
        {
            let _ = secret_arguments(sql.as_bytes());
        }
    }
}
