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
/// Calls nested deeper than this are not read (their arguments stay as they are).
const MAX_OPEN_CALLS: usize = 64;
/// The tokens of an argument kept to classify it: `name => 'value' :: text`.
const ARGUMENT_TOKENS: usize = 6;

/// Every secret argument of every call of those functions in `sql`, in the bodies of `DO` and
/// of functions (`AS $$ … $$`) too. One pass, in memory bounded by the nesting it reads. Nothing
/// when a plain string literal holds a backslash: with standard_conforming_strings off that
/// escapes a quote, and the text could be read two ways.
pub fn secret_arguments(sql: &[u8]) -> Vec<SecretArgument> {
    let mut found = Vec::new();
    if sql.windows(MARK.len()).any(|window| window.eq_ignore_ascii_case(MARK)) && read(sql, 0, sql.len(), 0, &mut found) {
        found.clear();
    }
    found
}

/// A call of one of `CALLS` whose arguments are being read.
struct Call<'a> {
    wanted: (usize, &'a [u8], Kind),
    index: usize,
    /// The first tokens of the argument being read.
    tokens: Vec<Token<'a>>,
    /// The argument holds more than a literal or a parameter, perhaps cast.
    complex: bool,
    /// Parentheses and brackets open within the argument.
    parentheses: usize,
    brackets: usize,
}

/// Reads `sql[start..end]`, adding what it finds; `depth` is the dollar-quote nesting. True if
/// a plain literal held a backslash.
fn read<'a>(sql: &'a [u8], start: usize, end: usize, depth: usize, found: &mut Vec<SecretArgument>) -> bool {
    let mut lexer = Lexer { sql, at: start, end, backslash: false };
    let mut calls: Vec<Call<'a>> = Vec::new();
    // The last tokens read, the latest last.
    let mut recent: [Option<Token<'a>>; 3] = [None; 3];
    while let Some(token) = lexer.next() {
        let wanted = match token {
            Token::Punct(b'(') if calls.len() < MAX_OPEN_CALLS => called(&recent),
            _ => None,
        };
        if let Some(wanted) = wanted {
            if let Some(outer) = calls.last_mut() {
                outer.complex = true;
                outer.parentheses += 1; // closed by the call's own parenthesis
            }
            calls.push(Call { wanted, index: 0, tokens: Vec::new(), complex: false, parentheses: 0, brackets: 0 });
        } else if let Token::Body { start, end } = token {
            if depth < MAX_BODY_DEPTH && is_code_body(&recent) && read(sql, start, end, depth + 1, found) {
                lexer.backslash = true;
            }
            if let Some(call) = calls.last_mut() {
                call.complex = true;
            }
        } else if token == Token::Punct(b')') && calls.last().is_some_and(|call| call.parentheses == 0) {
            if let Some(call) = calls.pop() {
                take_argument(&call, found);
            }
            if let Some(outer) = calls.last_mut() {
                outer.parentheses -= 1;
            }
        } else if let Some(call) = calls.last_mut() {
            let top = call.parentheses == 0 && call.brackets == 0;
            match token {
                Token::Punct(b'(') => call.parentheses += 1,
                Token::Punct(b'[') => call.brackets += 1,
                Token::Punct(b')') => call.parentheses -= 1,
                Token::Punct(b']') if call.brackets > 0 => call.brackets -= 1,
                Token::Punct(b',') if top => {
                    take_argument(call, found);
                    call.index += 1;
                    call.tokens.clear();
                    call.complex = false;
                    recent = [recent[1], recent[2], Some(token)];
                    continue;
                }
                _ => {}
            }
            if top && call.tokens.len() < ARGUMENT_TOKENS && !matches!(token, Token::Punct(b'(' | b'[')) {
                call.tokens.push(token);
            } else {
                call.complex = true;
            }
        }
        recent = [recent[1], recent[2], Some(token)];
    }
    lexer.backslash
}

/// The call whose name was just read (`recent` ends with it), if it is one of `CALLS`: named
/// as PostgreSQL would resolve it to a function, not after EXECUTE or PREPARE (prepared
/// statements may take any name) and not in pg_temp (any role may create functions there).
fn called(recent: &[Option<Token<'_>>; 3]) -> Option<(usize, &'static [u8], Kind)> {
    let Some(Token::Word { text, quoted }) = recent[2] else { return None };
    let &(_, position, argument, kind) =
        CALLS.iter().find(|(name, ..)| if quoted { text == *name } else { text.eq_ignore_ascii_case(name) })?;
    let before = match (recent[0], recent[1]) {
        (Some(schema), Some(Token::Punct(b'.'))) => Some(schema),
        (_, before) => before,
    };
    match before {
        Some(Token::Word { text, quoted: false })
            if text.eq_ignore_ascii_case(b"execute") || text.eq_ignore_ascii_case(b"prepare") || text.eq_ignore_ascii_case(b"pg_temp") =>
        {
            None
        }
        Some(Token::Word { text: b"pg_temp", quoted: true }) => None,
        _ => Some((position, argument, kind)),
    }
}

/// Whether the dollar-quoted body just read is code: the body of `DO`, `DO LANGUAGE x` or a
/// function's `AS`; any other is a string, whose text is data.
fn is_code_body(recent: &[Option<Token<'_>>; 3]) -> bool {
    let word = |token: Option<Token<'_>>, what: &[u8]| matches!(token, Some(Token::Word { text, quoted: false }) if text.eq_ignore_ascii_case(what));
    word(recent[2], b"do") || word(recent[2], b"as") || (word(recent[1], b"language") && word(recent[0], b"do"))
}

/// Adds the argument just read of `call` if it is the wanted one and a literal or a
/// parameter, perhaps cast to text.
fn take_argument(call: &Call<'_>, found: &mut Vec<SecretArgument>) {
    let (position, name, kind) = call.wanted;
    if call.complex {
        return;
    }
    let (named, value) = match call.tokens.as_slice() {
        [Token::Word { text, .. }, Token::Arrow, value @ ..] => (Some(*text), value),
        tokens => (None, tokens),
    };
    let is_wanted = match named {
        Some(named) => named.eq_ignore_ascii_case(name),
        None => call.index == position,
    };
    let to_text = |token: &Token<'_>| matches!(token, Token::Word { text, quoted: false } if text.eq_ignore_ascii_case(b"text") || text.eq_ignore_ascii_case(b"varchar"));
    let passed = match value {
        [Token::Literal { start, end }] => Passed::Literal { start: *start, end: *end },
        [Token::Literal { start, end }, Token::Cast, cast] if to_text(cast) => Passed::Literal { start: *start, end: *end },
        [Token::Parameter(n)] => Passed::Parameter(*n),
        [Token::Parameter(n), Token::Cast, cast] if to_text(cast) => Passed::Parameter(*n),
        _ => return,
    };
    if is_wanted {
        found.push(SecretArgument { kind, passed });
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'a> {
    /// An identifier or keyword: as written when quoted (`""` left doubled), else as is.
    Word {
        text: &'a [u8],
        quoted: bool,
    },
    /// A string literal's content, between its quotes.
    Literal {
        start: usize,
        end: usize,
    },
    /// A dollar-quoted body, between its delimiters.
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

/// A lexer of just enough SQL to find calls and their arguments, as PostgreSQL's scanner reads
/// the text with standard_conforming_strings on: comments are skipped (`--` to the end of the
/// line, block comments nested), string literals, quoted identifiers and dollar-quoted bodies
/// are read whole. It never reads past `end`, and every step moves on by at least a byte.
struct Lexer<'a> {
    sql: &'a [u8],
    at: usize,
    end: usize,
    /// A plain string literal held a backslash.
    backslash: bool,
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
                self.at += rest.iter().position(|&b| b == b'\n' || b == b'\r').unwrap_or(rest.len());
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
                        b'\\' => {
                            self.backslash = true;
                            end += 1;
                        }
                        _ => end += 1,
                    }
                }
                let end = end.min(sql.len());
                self.at = (end + 1).min(sql.len());
                return Some(Token::Literal { start: content, end });
            } else if first == b'"' {
                // To the quote that is not doubled.
                let mut close = 1;
                while close < rest.len() && !(rest[close] == b'"' && rest.get(close + 1) != Some(&b'"')) {
                    close += if rest[close] == b'"' { 2 } else { 1 };
                }
                let close = close.min(rest.len());
                self.at += (close + 1).min(rest.len());
                return Some(Token::Word { text: &rest[1..close], quoted: true });
            } else if first.is_ascii_alphabetic() || first == b'_' || first >= 0x80 {
                let length = rest.iter().take_while(|&&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80).count();
                self.at += length;
                return Some(Token::Word { text: &rest[..length], quoted: false });
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
                depth = depth.saturating_sub(1);
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
    fn only_what_postgresql_would_call_is_read() {
        for sql in [
            // A -- comment ends at a carriage return too.
            "SELECT ( --\r'\noutbox_endpoint_rotate_secret(x, '); DROP TABLE accounts; SELECT (')')",
            // With standard_conforming_strings off, a backslash escapes the quote.
            "SELECT ('p\\', outbox_endpoint_rotate_secret(x, '); DROP TABLE accounts; SELECT (')')",
            // A dollar-quoted string that is not a body of code is data.
            "INSERT INTO notes VALUES ($x$outbox_endpoint_set(b, 'http://forged text@h')$x$)",
            // Prepared statements and functions in pg_temp may take our names.
            "EXECUTE outbox_endpoint_rotate_secret('b', 'forged')",
            "PREPARE outbox_endpoint_rotate_secret(text, text) AS SELECT 1",
            "SELECT pg_temp.outbox_endpoint_rotate_secret('b', 'forged')",
            // A quoted name is exact.
            "SELECT \"OUTBOX_ENDPOINT_ROTATE_SECRET\"('b', 'forged')",
            "SELECT \"a\"\"outbox_endpoint_rotate_secret\"('b', 'forged')",
            // Only a cast to text: a domain's check may run the role's own code.
            "SELECT outbox_endpoint_rotate_secret('b', 'forged'::d)",
            "SELECT outbox_endpoint_rotate_secret('b', secret => NOT 'x' IS NULL)",
        ] {
            assert_eq!(literals(sql), vec![], "{sql}");
        }
        assert_eq!(
            literals("DO LANGUAGE plpgsql $b$ BEGIN PERFORM outbox_endpoint_rotate_secret('b', 'whsec_q'); END $b$"),
            vec![(Kind::Secret, "whsec_q")]
        );
        assert_eq!(
            literals("CREATE FUNCTION f() RETURNS void AS $f$ SELECT outbox.outbox_endpoint_set('b', 'http://u:p@h/') $f$ LANGUAGE sql"),
            vec![(Kind::Url, "http://u:p@h/")]
        );
    }

    #[test]
    fn deep_nesting_costs_no_more_than_a_few_bytes_a_level() {
        let sql = format!("SELECT outbox_endpoint_set{}", "(".repeat(5_000_000));
        assert_eq!(secret_arguments(sql.as_bytes()), vec![]);
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
