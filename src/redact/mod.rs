//! Keeping secrets out of the server log without hiding what anyone did.
//!
//! On a reload PostgreSQL's postmaster logs every changed setting with its new value
//! (`parameter "outbox.signing_secret" changed to "…"`). A log hook, installed in the
//! postmaster and so in every process it forks, replaces those lines for the two settings that
//! may hold secrets: 0.1.0's signing secret, and the webhook URL (credentials live in its user
//! and password).
//!
//! The database generates endpoint secrets and returns them once, so by default no statement
//! carries one. A caller may still pass one (`outbox_endpoint_rotate_secret(name, 'whsec_…')`)
//! or a URL with credentials (`outbox_endpoint_set(name, 'https://user:pass@…')`). The hook
//! masks exactly those arguments, found by reading the calls (arguments.rs), wherever a log
//! line quotes them: the statement of `log_statement` and pgaudit, bound parameters, an error's
//! context and `STATEMENT:` line. Everything else stays, so a statement that merely mentions a
//! secret or our functions is logged whole, and the hook keeps no state that a rolled-back
//! savepoint could leave behind.

mod arguments;

use std::ffi::{c_char, CStr, CString};
use std::sync::atomic::{AtomicPtr, Ordering};

use pgrx::prelude::*;

use arguments::{secret_arguments, Kind, Passed, SecretArgument};

/// The untranslated message PostgreSQL logs for a changed setting.
const SETTING_CHANGED: &str = "parameter \"%s\" changed to \"%s\"";
/// The settings whose values never reach the log.
const SECRET_SETTINGS: &[&str] = &["outbox.signing_secret", "outbox.webhook_url"];
/// How every signing secret begins (sql/endpoints.sql accepts no other).
const SECRET_PREFIX: &[u8] = b"whsec_";
const MASK: &[u8] = b"***";

static mut PREVIOUS_HOOK: pg_sys::emit_log_hook_type = None;

/// The masked copy of the running statement that `debug_query_string` points to, if any: kept
/// in TopMemoryContext until the next one replaces it, since PostgreSQL may print the statement
/// again after this report (a later line of the same statement, or its error's `STATEMENT:`).
static MASKED_STATEMENT: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());

/// Called from `_PG_init` in the postmaster, while shared_preload_libraries is processed.
pub fn install_log_hook() {
    // SAFETY: the postmaster is single-threaded while it loads preloaded libraries; the hook
    // chain is saved and called, as PostgreSQL's own modules do.
    unsafe {
        PREVIOUS_HOOK = pg_sys::emit_log_hook;
        pg_sys::emit_log_hook = Some(mask_secrets_in_report);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn mask_secrets_in_report(edata: *mut pg_sys::ErrorData) {
    // SAFETY: PostgreSQL passes the report being emitted; its strings are NUL-terminated and
    // live in the report's memory context, the current one, where pstrdup puts the new ones.
    // debug_query_string is null or the running statement's NUL-terminated text. Nothing below
    // can panic (in the postmaster that would stop the server).
    unsafe {
        let data = &mut *edata;
        if !data.message_id.is_null() && !data.message.is_null() {
            let id = CStr::from_ptr(data.message_id).to_bytes();
            let message = CStr::from_ptr(data.message).to_bytes();
            if let Some(replacement) = hidden_setting_change(id, message) {
                data.message = pg_sys::pstrdup(replacement.as_ptr());
            }
        }
        // The bound parameters that pass a secret, as the statement names them ($n).
        let mut parameters: Vec<(Kind, u32)> = Vec::new();
        for field in [&mut data.message, &mut data.detail, &mut data.detail_log, &mut data.context, &mut data.internalquery] {
            if let Some(masked) = masked_copy(*field, &mut parameters) {
                *field = pg_sys::pstrdup(masked.as_ptr());
            }
        }
        if let Some(masked) = masked_copy(pg_sys::debug_query_string, &mut parameters) {
            let copy = pg_sys::MemoryContextStrdup(pg_sys::TopMemoryContext, masked.as_ptr());
            pg_sys::debug_query_string = copy;
            // The previous copy held no secret, so it is not the statement just replaced.
            let previous = MASKED_STATEMENT.swap(copy, Ordering::Relaxed);
            if !previous.is_null() {
                pg_sys::pfree(previous.cast());
            }
        }
        // Their values, where PostgreSQL lists them: `parameters: $1 = '…', $2 = '…'`.
        for field in [&mut data.detail, &mut data.detail_log, &mut data.context] {
            if let Some(masked) = masked_parameters(*field, &parameters) {
                *field = pg_sys::pstrdup(masked.as_ptr());
            }
        }
        if let Some(previous) = PREVIOUS_HOOK {
            previous(edata);
        }
    }
}

/// `text` with the secrets its calls pass masked, or `None` when it passes none as a literal
/// (or is null); the parameters that pass one are added to `parameters`.
///
/// # Safety
/// `text` is null or a NUL-terminated string.
unsafe fn masked_copy(text: *const c_char, parameters: &mut Vec<(Kind, u32)>) -> Option<CString> {
    if text.is_null() {
        return None;
    }
    // SAFETY: as the caller promises.
    let text = unsafe { CStr::from_ptr(text) }.to_bytes();
    let found = secret_arguments(text);
    parameters.extend(found.iter().filter_map(|argument| match argument.passed {
        Passed::Parameter(n) => Some((argument.kind, n)),
        Passed::Literal { .. } => None,
    }));
    // A masked C string gains no NUL byte.
    CString::new(mask_arguments(text, &found)?).ok()
}

/// `text` listing bound parameters (`$1 = '…'`) with the values of `parameters` masked.
///
/// # Safety
/// `text` is null or a NUL-terminated string.
unsafe fn masked_parameters(text: *const c_char, parameters: &[(Kind, u32)]) -> Option<CString> {
    if text.is_null() || parameters.is_empty() {
        return None;
    }
    // SAFETY: as the caller promises.
    let masked = mask_parameter_values(unsafe { CStr::from_ptr(text) }.to_bytes(), parameters)?;
    CString::new(masked).ok()
}

/// What to log instead of a changed secret setting's line, whatever language the server
/// logs in (the check uses the untranslated message and the setting's name, which is never
/// translated); `None` for every other line.
pub fn hidden_setting_change(message_id: &[u8], message: &[u8]) -> Option<&'static CStr> {
    if message_id != SETTING_CHANGED.as_bytes() {
        return None;
    }
    let names = [
        (SECRET_SETTINGS[0], c"parameter \"outbox.signing_secret\" changed (value hidden)"),
        (SECRET_SETTINGS[1], c"parameter \"outbox.webhook_url\" changed (value hidden: a URL may carry credentials)"),
    ];
    names.into_iter().find(|(name, _)| find(message, format!("\"{name}\"").as_bytes()).is_some()).map(|(_, line)| line)
}

/// `text` with the literals of `found` masked; `None` when none of them changes. One pass:
/// each range once, none overlapping one already masked (the lexer gives neither; a log hook
/// must not fail whatever it is given).
pub fn mask_arguments(text: &[u8], found: &[SecretArgument]) -> Option<Vec<u8>> {
    let mut literals: Vec<(usize, usize, Kind)> = found
        .iter()
        .filter_map(|argument| match argument.passed {
            Passed::Literal { start, end } => Some((start, end, argument.kind)),
            Passed::Parameter(_) => None,
        })
        .collect();
    literals.sort_unstable_by_key(|&(start, end, _)| (start, end));
    let mut masked = Vec::with_capacity(text.len());
    let mut copied = 0;
    for (start, end, kind) in literals {
        if start < copied || start > end || end > text.len() {
            continue;
        }
        masked.extend_from_slice(&text[copied..start]);
        masked.extend_from_slice(&mask_value(kind, &text[start..end]));
        copied = end;
    }
    masked.extend_from_slice(&text[copied..]);
    (masked != text).then_some(masked)
}

/// `text` (`parameters: $1 = 'a', $2 = 'b'`, as PostgreSQL lists bound parameters) with the
/// values of `parameters` masked, in one pass.
pub fn mask_parameter_values(text: &[u8], parameters: &[(Kind, u32)]) -> Option<Vec<u8>> {
    let mut parameters: Vec<(u32, Kind)> = parameters.iter().map(|&(kind, n)| (n, kind)).collect();
    parameters.sort_unstable_by_key(|&(n, _)| n);
    parameters.dedup_by_key(|&mut (n, _)| n);
    let mut masked = Vec::with_capacity(text.len());
    let mut at = 0;
    while at < text.len() {
        let digits = text[at..].iter().skip(1).take_while(|b| b.is_ascii_digit()).count();
        let value = at + 1 + digits + b" = '".len();
        if text[at] != b'$' || digits == 0 || !text[at + 1 + digits..].starts_with(b" = '") {
            masked.push(text[at]);
            at += 1;
            continue;
        }
        // The value is quoted as a literal: '' stands for a quote.
        let mut end = value;
        while end < text.len() && !(text[end] == b'\'' && text.get(end + 1) != Some(&b'\'')) {
            end += if text[end] == b'\'' { 2 } else { 1 };
        }
        let end = end.min(text.len());
        let number = std::str::from_utf8(&text[at + 1..at + 1 + digits]).ok().and_then(|n| n.parse::<u32>().ok());
        masked.extend_from_slice(&text[at..value]);
        match number.and_then(|n| parameters.binary_search_by_key(&n, |&(n, _)| n).ok()) {
            Some(index) => masked.extend_from_slice(&mask_value(parameters[index].1, &text[value..end])),
            None => masked.extend_from_slice(&text[value..end]),
        }
        at = end;
    }
    (masked != text).then_some(masked)
}

/// A secret argument's value as the log shows it: a secret as `whsec_***`; a URL with its user
/// and password (between `://` and the last `@` before the path) as `***`.
fn mask_value(kind: Kind, value: &[u8]) -> Vec<u8> {
    match kind {
        Kind::Secret if value.starts_with(SECRET_PREFIX) => [SECRET_PREFIX, MASK].concat(),
        Kind::Secret => MASK.to_vec(),
        Kind::Url => {
            let Some(authority) = find(value, b"://").map(|at| at + 3) else { return value.to_vec() };
            let end = value[authority..].iter().position(|b| matches!(b, b'/' | b'?' | b'#')).map_or(value.len(), |end| authority + end);
            match value[authority..end].iter().rposition(|&b| b == b'@') {
                Some(at) => [&value[..authority], MASK, &value[authority + at..]].concat(),
                None => value.to_vec(),
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changed(name: &str, value: &str) -> Vec<u8> {
        format!("parameter \"{name}\" changed to \"{value}\"").into_bytes()
    }

    fn masked(text: &str) -> String {
        let found = secret_arguments(text.as_bytes());
        String::from_utf8(mask_arguments(text.as_bytes(), &found).unwrap_or_else(|| text.as_bytes().to_vec())).unwrap()
    }

    #[test]
    fn secret_settings_are_logged_without_their_values() {
        let secret = hidden_setting_change(SETTING_CHANGED.as_bytes(), &changed("outbox.signing_secret", "whsec_c2VjcmV0")).unwrap();
        assert_eq!(secret.to_str().unwrap(), "parameter \"outbox.signing_secret\" changed (value hidden)");
        let url = hidden_setting_change(SETTING_CHANGED.as_bytes(), &changed("outbox.webhook_url", "https://bob:hunter2@h/x?t=1")).unwrap();
        assert!(!url.to_str().unwrap().contains("hunter2"));
    }

    #[test]
    fn a_translated_line_is_hidden_too() {
        let german = "Parameter »\"outbox.signing_secret\"« wurde auf »whsec_c2VjcmV0« geändert".as_bytes();
        assert!(hidden_setting_change(SETTING_CHANGED.as_bytes(), german).is_some());
    }

    #[test]
    fn other_setting_lines_are_left_alone() {
        assert_eq!(hidden_setting_change(SETTING_CHANGED.as_bytes(), &changed("work_mem", "64MB")), None);
        assert_eq!(hidden_setting_change(b"some other message", &changed("outbox.signing_secret", "x")), None);
    }

    #[test]
    fn only_the_secret_argument_is_masked_and_the_statement_stays() {
        assert_eq!(
            masked("statement: SELECT outbox_endpoint_rotate_secret('b', 'whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0', '1 hour')"),
            "statement: SELECT outbox_endpoint_rotate_secret('b', 'whsec_***', '1 hour')"
        );
        assert_eq!(
            masked("SELECT outbox_endpoint_set('b', 'https://relay:pa@ss@h.example:8443/x?t=1', '{*}')"),
            "SELECT outbox_endpoint_set('b', 'https://***@h.example:8443/x?t=1', '{*}')"
        );
        assert_eq!(
            masked("SELECT outbox_endpoint_set('b', 'https://h.example/a@b')"),
            "SELECT outbox_endpoint_set('b', 'https://h.example/a@b')"
        );
    }

    #[test]
    fn what_a_statement_merely_mentions_or_encodes_is_logged_whole() {
        for text in [
            "DROP TABLE accounts; /* whsec_c2VjcmV0 */",
            "SELECT 'whsec_AAAA' AS x /* outbox_endpoint_set('b', 'https://u:p@h/') */",
            "DO $$BEGIN EXECUTE convert_from(decode(substr('whsec_RFJPUCBUQUJMRSBhY2NvdW50cw==', 7), 'base64'), 'UTF8'); END$$",
            "INSERT INTO t VALUES ('https://u:p@h/')",
        ] {
            assert_eq!(masked(text), text);
        }
    }

    #[test]
    fn bound_parameters_that_pass_a_secret_are_masked_where_they_are_listed() {
        let mut parameters = Vec::new();
        for argument in secret_arguments(b"SELECT outbox.outbox_endpoint_rotate_secret($1, $2)") {
            if let Passed::Parameter(n) = argument.passed {
                parameters.push((argument.kind, n));
            }
        }
        let detail = b"parameters: $1 = 'b', $2 = 'whsec_c2Vj''cmV0'";
        assert_eq!(mask_parameter_values(detail, &parameters).unwrap(), b"parameters: $1 = 'b', $2 = 'whsec_***'");
        let url = [(Kind::Url, 1)];
        assert_eq!(mask_parameter_values(b"parameters: $1 = 'http://u:p@h/x'", &url).unwrap(), b"parameters: $1 = 'http://***@h/x'");
        assert_eq!(mask_parameter_values(b"parameters: $3 = 'x'", &url), None);
    }

    #[test]
    fn masking_twice_changes_nothing_more() {
        for text in ["SELECT outbox_endpoint_rotate_secret('b', 'whsec_c2VjcmV0')", "SELECT outbox_endpoint_set('b', 'https://u:p@h/')"] {
            let once = masked(text);
            assert_eq!(masked(&once), once, "{text}");
            assert_eq!(mask_arguments(once.as_bytes(), &secret_arguments(once.as_bytes())), None);
        }
    }
}
