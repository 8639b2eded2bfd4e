//! The SQL install's scripts, made from the extension's: the same files of `sql/` in the same
//! order, with what only an extension script can do taken out (`\echo` guards, the
//! `pg_extension_config_dump` marks for pg_dump, the functions written in C, which
//! `sql/sql_install.sql` declares in PL/pgSQL instead, and the endpoint `default`, whose URL is
//! a setting only the extension has) and `@extschema@` replaced by the schema chosen.

/// The install script of the version this binary is: the files `src/lib.rs` declares, in its
/// order, then the SQL forms of the library's functions.
const INSTALL: [&str; 15] = [
    include_str!("../../sql/schema.sql"),
    include_str!("../../sql/deliveries.sql"),
    include_str!("../../sql/attempts.sql"),
    include_str!("../../sql/ordering.sql"),
    include_str!("../../sql/endpoints_version.sql"),
    include_str!("../../sql/endpoints.sql"),
    include_str!("../../sql/library_settings.sql"),
    include_str!("../../sql/limits.sql"),
    include_str!("../../sql/claim.sql"),
    include_str!("../../sql/pull.sql"),
    include_str!("../../sql/relays.sql"),
    include_str!("../../sql/dead.sql"),
    include_str!("../../sql/log.sql"),
    include_str!("../../sql/log_slot.sql"),
    include_str!("../../sql/api.sql"),
];

/// What the SQL install of this version has instead of the library: run after each step that
/// ends at this version. Installing a released version takes that version's (`RELEASED`).
pub const SQL_INSTALL: &str = include_str!("../../sql/sql_install.sql");

/// The update scripts, as `ALTER EXTENSION … UPDATE` runs them: from, to, text. Each is the
/// committed, assembled file (frozen once released).
pub const UPDATES: [(&str, &str, &str); 2] = [
    ("0.2.0", "0.3.0", include_str!("../../sql/outbox_ext--0.2.0--0.3.0.sql")),
    ("0.3.0", "0.4.0", include_str!("../../sql/outbox_ext--0.3.0--0.4.0.sql")),
];

/// A released version as `outbox migrate --to` installs it (to test its update).
pub enum Released {
    /// Before 0.3.0 there was no SQL install: the extension's install script of the version,
    /// without what only an extension does.
    Extension(&'static str),
    /// From 0.3.0 on: what that version's `outbox migrate` ran, with `@extschema@` for the
    /// schema, frozen in `sql/sql_install--X.Y.Z.sql`.
    SqlInstall(&'static str),
}

/// The released versions, oldest first.
pub const RELEASED: [(&str, Released); 2] = [
    ("0.2.0", Released::Extension(include_str!("../../sql/outbox_ext--0.2.0.sql"))),
    ("0.3.0", Released::SqlInstall(include_str!("../../sql/sql_install--0.3.0.sql"))),
];

/// The install script of a released version, for the SQL install in `schema` (quoted).
pub fn released(version: &Released, schema: &str) -> String {
    match version {
        Released::Extension(script) => for_sql_install(script, schema, false),
        Released::SqlInstall(script) => outbox_core::statements::qualify(script, schema),
    }
}

/// The install script of this binary's version, for the SQL install in `schema` (quoted).
pub fn install(schema: &str) -> String {
    for_sql_install(&INSTALL.join("\n"), schema, true)
}

/// `script`, an extension script, as the SQL install in `schema` (quoted) runs it, followed by
/// `SQL_INSTALL` if it ends at this binary's version (`current`).
pub fn for_sql_install(script: &str, schema: &str, current: bool) -> String {
    let kept: Vec<&str> = statements(script).into_iter().filter(|statement| !extension_only(statement)).collect();
    let mut sql = kept.join("\n");
    if current {
        sql.push('\n');
        sql.push_str(SQL_INSTALL);
    }
    outbox_core::statements::qualify(&sql, schema)
}

/// Whether `statement` is one only an extension script runs. The endpoint `default` is one:
/// its null URL means `outbox.webhook_url`, a setting the SQL install does not have, so made
/// there it would hold a delivery of every event for no one and fail from the start. An event
/// no endpoint takes is kept as unrouted, and `outbox_endpoint_set('default', …)` makes it.
fn extension_only(statement: &str) -> bool {
    let code = without_comments(statement);
    let code = code.trim_start();
    code.starts_with("\\echo")
        || code.contains("pg_extension_config_dump")
        || code.contains("'MODULE_PATHNAME'")
        || library_function_privilege(code)
        || code.starts_with("INSERT INTO @extschema@.outbox_endpoints (name) VALUES ('default')")
}

/// A GRANT or REVOKE on one of the functions `sql/sql_install.sql` declares again, with its
/// privileges.
fn library_function_privilege(code: &str) -> bool {
    (code.starts_with("REVOKE") || code.starts_with("GRANT"))
        && ["outbox_enqueue(", "outbox_workers(", "outbox_worker_attempts(", "outbox_enqueued(", "outbox_load_settings("]
            .iter()
            .any(|name| code.contains(name))
}

/// The text of `sql` without its `--` lines and `/* */` comments.
fn without_comments(sql: &str) -> String {
    let mut code: String = sql.lines().filter(|line| !line.trim_start().starts_with("--")).collect::<Vec<_>>().join("\n");
    while let Some(start) = code.find("/*") {
        let end = code[start..].find("*/").map_or(code.len(), |n| start + n + 2);
        code.replace_range(start..end, "");
    }
    code
}

/// `script` cut into statements, each with the comments before it; a `\` command is one line.
/// Quotes, quoted identifiers, dollar quotes and comments are skipped over, so a `;` in them
/// ends nothing.
pub fn statements(script: &str) -> Vec<&str> {
    let bytes = script.as_bytes();
    let mut statements = Vec::new();
    let (mut start, mut i) = (0, 0);
    let mut line_start = true;
    while i < bytes.len() {
        let rest = &script[i..];
        if line_start && rest.starts_with('\\') {
            let end = rest.find('\n').map_or(bytes.len(), |n| i + n + 1);
            statements.push(&script[start..end]);
            (start, i) = (end, end);
            continue;
        }
        line_start = false;
        match bytes[i] {
            b'\n' => {
                line_start = true;
                i += 1;
            }
            b'-' if rest.starts_with("--") => i += rest.find('\n').unwrap_or(rest.len()),
            b'/' if rest.starts_with("/*") => i += rest.find("*/").map_or(rest.len(), |n| n + 2),
            quote @ (b'\'' | b'"') => {
                i += 1;
                while i < bytes.len() && bytes[i] != quote {
                    i += 1;
                }
                i += 1;
            }
            b'$' => match dollar_tag(rest) {
                Some(tag) => {
                    let body = &rest[tag.len()..];
                    i += tag.len() + body.find(tag).map_or(body.len(), |n| n + tag.len());
                }
                None => i += 1,
            },
            b';' => {
                i += 1;
                statements.push(&script[start..i]);
                start = i;
            }
            _ => i += 1,
        }
    }
    if !script[start..].trim().is_empty() {
        statements.push(&script[start..]);
    }
    statements
}

/// The dollar-quote tag `rest` begins with (`$$` or `$name$`), if it begins with one.
fn dollar_tag(rest: &str) -> Option<&str> {
    let end = rest[1..].find('$')? + 2;
    let tag = &rest[..end];
    tag[1..end - 1]
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        .then_some(tag)
        .filter(|t| !t[1..].starts_with(|c: char| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_end_at_semicolons_outside_quotes_comments_and_bodies() {
        let script = "-- a; comment\nCREATE TABLE t (a text DEFAULT ';');\n\\echo Use ALTER; \\quit\n\
                      CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$;\n\
                      CREATE FUNCTION g() RETURNS int LANGUAGE plpgsql AS $body$ BEGIN RETURN 2; END $body$;\n\
                      /* block; */ SELECT \"a;b\" FROM t WHERE x = $1;\n";
        let parts: Vec<&str> = statements(script).into_iter().map(str::trim).collect();
        assert_eq!(parts.len(), 5, "{parts:#?}");
        assert!(parts[0].ends_with("DEFAULT ';');"));
        assert_eq!(parts[1], "\\echo Use ALTER; \\quit");
        assert!(parts[2].ends_with("SELECT 1; $$;"));
        assert!(parts[3].ends_with("END $body$;"));
        assert!(parts[4].ends_with("WHERE x = $1;"));
    }

    #[test]
    fn the_sql_install_leaves_out_what_only_an_extension_does() {
        let script = "\\echo Use \"CREATE EXTENSION outbox_ext\" to load this file. \\quit\n\
                      CREATE TABLE @extschema@.outbox (id bigint);\n\
                      SELECT pg_catalog.pg_extension_config_dump('outbox', '');\n\
                      -- Written in Rust\nCREATE OR REPLACE FUNCTION @extschema@.outbox_enqueued()\nRETURNS bigint\nLANGUAGE c\nAS 'MODULE_PATHNAME', 'outbox_enqueued_wrapper';\n\
                      REVOKE ALL ON FUNCTION @extschema@.outbox_enqueued() FROM PUBLIC;\n\
                      REVOKE ALL ON FUNCTION @extschema@.outbox_stats() FROM PUBLIC;\n\
                      -- Setting only outbox.webhook_url delivers every event, as 0.1.0 did.\n\
                      INSERT INTO @extschema@.outbox_endpoints (name) VALUES ('default');\n";
        let sql = for_sql_install(script, "app", true);
        let before_sql_install = &sql[..sql.find("-- The SQL install's forms").expect("sql/sql_install.sql follows")];
        assert!(before_sql_install.contains("CREATE TABLE app.outbox"));
        assert!(before_sql_install.contains("outbox_stats()"), "privileges of functions in SQL stay");
        for gone in ["\\echo", "pg_extension_config_dump", "MODULE_PATHNAME", "outbox_enqueued()", "@extschema@", "'default'"] {
            assert!(!before_sql_install.contains(gone), "{gone} is left out:\n{before_sql_install}");
        }
        assert!(!sql.contains("@extschema@"));
    }

    #[test]
    fn every_install_and_update_script_splits_into_whole_statements() {
        let released = RELEASED.iter().map(|(_, version)| match version {
            Released::Extension(script) | Released::SqlInstall(script) => script,
        });
        for script in INSTALL.iter().chain(UPDATES.iter().map(|(_, _, s)| s)).chain(released) {
            for statement in statements(script) {
                let code = without_comments(statement);
                let code = code.trim();
                assert!(code.is_empty() || code.ends_with(';') || code.starts_with('\\'), "not a whole statement:\n{statement}");
            }
        }
    }
}
